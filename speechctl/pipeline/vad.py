"""End-of-utterance detection by energy: a threshold in dBFS with a hangover of silence.

Audio is cut into ``frame_ms`` frames; a frame whose RMS level is above ``threshold_db`` (dBFS:
0 dB is a full-scale square wave) is voiced. Speech *starts* after ``start_ms`` of voiced frames
(the chat loop uses this moment for barge-in) and the utterance *ends* after ``silence_ms`` of
unvoiced frames in a row (the hangover). An utterance with less than ``min_speech_ms`` of voiced
frames in all (a click, a cough) is reported as skipped. Utterances carry ``preroll_ms`` of audio
from before the start, so soft onsets are not cut off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass
class VadConfig:
    threshold_db: float = -40.0
    silence_ms: int = 700
    start_ms: int = 100
    min_speech_ms: int = 250
    preroll_ms: int = 200
    frame_ms: int = 20
    max_utterance_s: float = 30.0  # cut an utterance that never pauses (Whisper reads 30 s)


@dataclass
class SpeechStart:
    pass


@dataclass
class Utterance:
    audio: np.ndarray  # float32 at the VAD's sample rate
    speech_ms: int


@dataclass
class Skipped:
    """Sound that started like speech but was too short: an empty utterance."""

    speech_ms: int


def level_db(frame: np.ndarray) -> float:
    rms = float(np.sqrt(np.mean(np.square(frame, dtype=np.float64)))) if len(frame) else 0.0
    return 20 * np.log10(max(rms, 1e-10))


class EnergyVad:
    def __init__(self, sample_rate: int, config: VadConfig | None = None):
        self.rate = sample_rate
        self.config = c = config or VadConfig()
        self.frame = max(1, sample_rate * c.frame_ms // 1000)
        self._frames = lambda ms: max(1, -(-ms // c.frame_ms))
        self._pending = np.zeros(0, np.float32)  # samples not yet a whole frame
        # the onset's voiced frames and preroll_ms before them
        self._preroll: deque[np.ndarray] = deque(maxlen=self._frames(c.preroll_ms) + self._frames(c.start_ms))
        self._speech: list[np.ndarray] | None = None  # frames of the open utterance
        self._run = 0  # voiced frames in a row (before the start) / unvoiced in a row (after)
        self._voiced = 0  # voiced frames of the open utterance

    @property
    def in_speech(self) -> bool:
        return self._speech is not None

    def push(self, samples: np.ndarray) -> list:
        """Feed audio; returns the events it completes (SpeechStart, Utterance, Skipped)."""
        c = self.config
        data = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        whole = len(data) // self.frame * self.frame
        self._pending = data[whole:]
        events = []
        for start in range(0, whole, self.frame):
            frame = data[start : start + self.frame]
            voiced = level_db(frame) > c.threshold_db
            if self._speech is None:
                self._preroll.append(frame)
                self._run = self._run + 1 if voiced else 0
                if self._run >= self._frames(c.start_ms):
                    self._speech, self._voiced, self._run = list(self._preroll), self._run, 0
                    self._preroll.clear()
                    events.append(SpeechStart())
                continue
            self._speech.append(frame)
            self._voiced += voiced
            self._run = 0 if voiced else self._run + 1
            too_long = len(self._speech) * c.frame_ms >= c.max_utterance_s * 1000
            if self._run >= self._frames(c.silence_ms) or too_long:
                events.append(self._close(keep_silence=self._frames(c.preroll_ms)))
        return events

    def flush(self) -> list:
        """The input ended: close an open utterance."""
        return [self._close(keep_silence=self._frames(self.config.preroll_ms))] if self._speech is not None else []

    def _close(self, keep_silence: int):
        frames, self._speech = self._speech, None
        trailing = min(self._run, len(frames))
        frames = frames[: len(frames) - max(0, trailing - keep_silence)]  # drop most of the hangover
        speech_ms, self._run, self._voiced = self._voiced * self.config.frame_ms, 0, 0
        if speech_ms < self.config.min_speech_ms:
            return Skipped(speech_ms)
        return Utterance(np.concatenate(frames), speech_ms)


def contains_speech(audio: np.ndarray, sample_rate: int, config: VadConfig | None = None) -> bool:
    """Whether a recording holds an utterance the VAD would answer (not only silence or a click)."""
    vad = EnergyVad(sample_rate, config)
    events = vad.push(audio) + vad.flush()
    return any(isinstance(e, Utterance) for e in events)
