"""Read a streamed multi-stream output as it grows: text pieces and audio code frames.

The engine reports a ``stream`` request's new steps every step (``StreamOutput`` pieces: primary
token ids and ``[n, K]`` auxiliary tokens). ``AudioStreamReader`` turns them into events as soon as
they are final:

* audio frames: frame ``t`` of a segment is complete once step ``t + max(delays)`` of the segment
  has arrived on every stream (``DelayPattern``: codebook ``k`` holds frame ``t`` at step
  ``t + delays[k]``), and only while no stream has ended (the first frame holding a BOS/EOS/PAD
  where a code belongs marks the end of the audio);
* the end of a segment (``<|audio_eos|>``): the whole segment is read by
  ``MultiStreamPrompts.audio_segments``, the reader of finished outputs (layout checked there), and
  the frames not yet reported follow; streamed frames are the frames of the one-shot read;
* text: primary tokens outside audio segments (unified chat replies).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speechctl.engine.streams import StreamSpec
from speechctl.errors import EngineError


@dataclass
class AudioEvent:
    """``frames``: new code frames ``[K, n]`` of segment ``segment`` (n may be 0 at its end);
    ``ended``: the segment is complete."""

    segment: int
    frames: np.ndarray
    ended: bool = False


@dataclass
class TextEvent:
    token_ids: list[int]


class AudioStreamReader:
    """Incremental reader of one streamed request (see module doc).

    ``starts_in_audio``: the prompt ended with ``<|audio_bos|>`` (TTS), so the first generated step
    is already audio; otherwise audio starts at each generated ``<|audio_bos|>``.
    """

    def __init__(self, spec: StreamSpec, starts_in_audio: bool):
        self.spec = spec
        self.pattern = spec.pattern
        self.segment = -1
        self._steps: list[np.ndarray] | None = None  # aux rows [K] of the open segment
        self._tokens: list[int] = []  # its primary tokens
        self._emitted = 0  # frames of the open segment already reported
        self._ended = False  # the open segment's audio has ended (only the flush is left)
        if starts_in_audio:
            self._open()

    @property
    def in_audio(self) -> bool:
        return self._steps is not None

    def _open(self) -> None:
        self.segment += 1
        self._steps, self._tokens, self._emitted, self._ended = [], [], 0, False

    def feed(self, token_ids: list[int], aux: np.ndarray) -> list[AudioEvent | TextEvent]:
        """One piece: primary tokens and their ``[len(token_ids), K]`` auxiliary tokens."""
        s = self.spec
        events: list[AudioEvent | TextEvent] = []
        text: list[int] = []
        for i, tok in enumerate(token_ids):
            if self._steps is None:
                if tok == s.audio_bos_id:
                    if text:
                        events.append(TextEvent(text))
                        text = []
                    self._open()
                else:
                    text.append(tok)
            elif tok == s.audio_eos_id:
                events += self._new_frames()
                events.append(self._close())
            else:
                self._steps.append(np.asarray(aux[i]))
                self._tokens.append(tok)
        if text:
            events.append(TextEvent(text))
        if self._steps is not None:
            events += self._new_frames()
        return events

    def finish(self) -> None:
        """The request finished: an audio segment left open means it was cut short."""
        if self._steps is not None:
            raise EngineError("generation stopped before the audio ended (raise max_tokens)")

    def _new_frames(self) -> list[AudioEvent]:
        if self._ended:
            return []
        steps = self._steps
        complete = len(steps) - self.pattern.max_delay  # frames present on every stream
        if complete <= self._emitted:
            return []
        frames = []
        for t in range(self._emitted, complete):
            codes = np.array([steps[t + d][k] for k, d in enumerate(self.pattern.delays)])
            if codes.min() < 0 or codes.max() >= self.pattern.codebook_size:
                self._ended = True  # an EOS where a code would be: the audio has ended
                break
            frames.append(codes)
        if not frames:
            return []
        self._emitted += len(frames)
        return [AudioEvent(self.segment, np.stack(frames, axis=1).astype(np.int64))]

    def _close(self) -> AudioEvent:
        from speechctl.engine.engine import StreamOutput
        from speechctl.models.prompts import MultiStreamPrompts

        K = self.pattern.num_streams
        aux = np.stack(self._steps) if self._steps else np.zeros((0, K), np.int64)
        segment_out = StreamOutput(None, self._tokens + [self.spec.audio_eos_id], np.concatenate([aux, np.zeros((1, K), aux.dtype)]), "stop")
        (codes,) = MultiStreamPrompts(self.spec, None).audio_segments(segment_out, starts_in_audio=True)
        if codes.shape[1] < self._emitted:
            raise EngineError("audio streams came out malformed: frames streamed past the end")
        rest = codes[:, self._emitted :].astype(np.int64)
        segment = self.segment
        self._steps = None
        return AudioEvent(segment, rest, ended=True)
