"""Long audio -> windows that Whisper can take; transcripts -> txt, json, srt and vtt.

Whisper reads 30 s at a time. Longer audio is cut into windows of at most ``max_seconds``, each
cut placed in the quietest stretch (the middle of the longest run of minimal energy, energy
smoothed over 0.2 s) between a third of the maximum and the maximum after the previous cut. In
speech with pauses the cuts fall between words, so no word is split between two windows (none is
lost, none is transcribed twice); only speech with no pause for 10 s could be cut inside a word.
Windows whose every 10 ms frame is below -60 dBFS are silent and are not transcribed at all.

Segment timestamps come from Whisper's timestamp tokens (:func:`transcript.token_segments`);
decoded without them (``--without-timestamps``), a segment spans its window's audible part (frames
within 40 dB of its loudest, padded by 0.1 s). Words (``--word-timestamps``) carry their own
times: in json as a list per segment, in srt/vtt as cues of at most 42 characters timed by their
words (vtt also marks each word's start inside the cue).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

import numpy as np

RATE = 16000
FRAME = 160  # 10 ms at 16 kHz
MAX_SECONDS = 30.0
SILENCE_DBFS = -60.0  # a frame quieter than this is silence
SPEECH_RANGE_DB = 40.0  # a segment spans the frames within this range of its loudest
SMOOTH_SECONDS = 0.2
PAD_SECONDS = 0.1
LINE_CHARS = 42  # subtitle line length


@dataclass(frozen=True)
class Window:
    """Samples ``[start, end)`` of the input; ``[speech_start, speech_end)`` is its audible part."""

    start: int
    end: int
    speech_start: int
    speech_end: int


@dataclass
class Word:
    word: str  # with its leading space, as Whisper spells it
    start: float
    end: float
    probability: float

    def to_dict(self) -> dict:
        return {"word": self.word, "start": round(self.start, 2), "end": round(self.end, 2),
                "probability": round(float(self.probability), 4)}


@dataclass
class Segment:
    start: float  # seconds
    end: float
    text: str
    tokens: list[int] = field(default_factory=list, repr=False)  # Whisper: its tokens (timestamps too)
    words: list[Word] | None = None  # with --word-timestamps
    avg_logprob: float | None = None  # the window's decoding (OpenAI's segment fields)
    no_speech_prob: float | None = None
    temperature: float | None = None
    compression_ratio: float | None = None

    def to_dict(self) -> dict:
        record = {"start": round(self.start, 2), "end": round(self.end, 2), "text": self.text}
        if self.words is not None:
            record["words"] = [w.to_dict() for w in self.words]
        return record


def frame_rms(audio: np.ndarray, frame: int = FRAME) -> np.ndarray:
    """[ceil(len/frame)] root-mean-square of each frame (the last one zero-padded). Works on a
    view of the audio: hours of it cost one float per frame."""
    audio = np.asarray(audio, dtype=np.float32)
    full = len(audio) // frame
    frames = audio[: full * frame].reshape(full, frame)
    power = np.einsum("ij,ij->i", frames, frames) / frame
    tail = audio[full * frame :]
    if len(tail):
        power = np.append(power, np.dot(tail, tail) / frame)
    return np.sqrt(power.astype(np.float64))


def plan_windows(audio: np.ndarray, rate: int = RATE, max_seconds: float = MAX_SECONDS) -> list[Window]:
    """The audible windows of ``audio`` (float mono at ``rate``), in order, each at most
    ``max_seconds`` long. Cut points (see the module doc) depend only on the audio."""
    frame = rate // 100
    rms = frame_rms(audio, frame)
    max_frames = int(max_seconds * 100)
    if max_frames < 300:
        raise ValueError("windows must be allowed at least 3 s")
    cuts = [0]
    energy = _smooth(rms**2, max(1, int(SMOOTH_SECONDS * 100)))
    while len(rms) - cuts[-1] > max_frames:
        lo, hi = cuts[-1] + max_frames // 3, cuts[-1] + max_frames
        cuts.append(lo + _quietest(energy[lo : hi + 1]))
    cuts.append(len(rms))
    windows = []
    silence = 10 ** (SILENCE_DBFS / 20)
    for a, b in zip(cuts, cuts[1:]):
        part = rms[a:b]
        loud = part.max(initial=0.0)
        if loud < silence:
            continue
        audible = np.flatnonzero(part >= max(silence, loud * 10 ** (-SPEECH_RANGE_DB / 20)))
        pad = int(PAD_SECONDS * 100)
        first, last = max(a, a + audible[0] - pad), min(b, a + audible[-1] + 1 + pad)
        end = min(b * frame, len(audio))
        windows.append(Window(a * frame, end, first * frame, min(last * frame, end)))
    return windows


def _smooth(x: np.ndarray, width: int) -> np.ndarray:
    return np.convolve(x, np.ones(width) / width, mode="same")


def _quietest(energy: np.ndarray) -> int:
    """Index in the middle of the longest run of (near-)minimal values; the later run on ties."""
    floor = energy.min()
    quiet = energy <= floor * (1 + 1e-3) + 1e-12
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    starts, ends = edges[::2], edges[1::2]  # runs [start, end)
    longest = np.flatnonzero((ends - starts) == (ends - starts).max())[-1]
    return int((starts[longest] + ends[longest]) // 2)


def segment(window: Window, text: str, rate: int = RATE) -> Segment:
    return Segment(window.speech_start / rate, window.speech_end / rate, text.strip())


def join_text(segments: list[Segment]) -> str:
    return " ".join(s.text for s in segments if s.text)


def result_segments(result) -> list[Segment]:
    """The timed segments of an ``AsrResult``: Whisper's own; a speech LM's transcript (it has no
    timestamps) is one segment over the whole audio."""
    if result.segments is not None:
        return result.segments
    return [Segment(0.0, result.duration or 0.0, (result.text or "").strip())]


# --------------------------------------------------------------------------------------------
# Output formats
# --------------------------------------------------------------------------------------------

FORMATS = ("txt", "json", "srt", "vtt")


def to_srt(segments: list[Segment]) -> str:
    return "".join(f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n\n" for i, (a, b, text) in enumerate(_cues(segments), 1))


def to_vtt(segments: list[Segment]) -> str:
    return "WEBVTT\n\n" + "".join(f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n\n" for a, b, text in _cues(segments, True))


def _cues(segments: list[Segment], inline: bool = False) -> list[tuple[float, float, str]]:
    """(start, end, text) of each subtitle cue: a segment, wrapped at 42 characters; with words,
    a line of at most 42 characters of words, timed by them (``inline``: WebVTT timestamp tags
    before each word after the first)."""
    cues = []
    for s in segments:
        if not s.text:
            continue
        words = [w for w in (s.words or []) if w.word.strip()]
        if not words:
            cues.append((s.start, s.end, _wrap(s.text)))
            continue
        line: list[Word] = []
        for w in words + [None]:
            if line and (w is None or len("".join(x.word for x in line + [w]).strip()) > LINE_CHARS):
                if inline:
                    text = line[0].word.strip() + "".join(f"<{_clock(x.start, '.')}>{x.word}" for x in line[1:])
                else:
                    text = "".join(x.word for x in line).strip()
                cues.append((line[0].start, line[-1].end, text))
                line = []
            if w is not None:
                line.append(w)
    return cues


def to_record(name: str, text: str | None, segments: list[Segment] | None, error: str | None, duration: float | None = None,
              language: str | None = None) -> dict:
    """The JSON record of one input."""
    record = {"file": name, "text": text, "error": error}
    if duration is not None:
        record["duration"] = round(duration, 3)
    if language is not None:
        record["language"] = language
    if segments is not None:
        record["segments"] = [s.to_dict() for s in segments if s.text]
    return record


def render(fmt: str, text: str, segments: list[Segment], name: str = "", duration: float | None = None,
           language: str | None = None) -> str:
    """One input's transcript in ``fmt``, ending with a newline."""
    if fmt == "txt":
        return text + "\n"
    if fmt == "json":
        return json.dumps(to_record(name, text, segments, None, duration, language), ensure_ascii=False, indent=2) + "\n"
    if fmt == "srt":
        return to_srt(segments)
    if fmt == "vtt":
        return to_vtt(segments)
    raise ValueError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _wrap(text: str) -> str:
    return "\n".join(textwrap.wrap(text, LINE_CHARS)) or text
