"""Read a streamed multi-stream output as it grows: text pieces and audio code frames.

The engine reports a ``stream`` request's new steps every step (``StreamOutput`` pieces: primary
token ids and ``[n, K]`` auxiliary tokens). ``AudioStreamReader`` turns them into events as soon as
they are final:

* audio frames: the model family's prompt builder says which frames of an open segment are final
  given its steps so far (``final_frames``; generic layout: frame ``t`` once step
  ``t + max(delays)`` exists on every stream, until a BOS/EOS/PAD stands where a code belongs;
  Higgs: after its all-BOS frame, until an all-EOS frame; CSM: every frame as it comes, until the
  end frame);
* the end of a segment (``<|audio_eos|>``): the whole segment is read by the builder's
  ``audio_segments``, the reader of finished outputs, and the frames not yet reported follow;
  streamed frames must be the first frames of that read (an error otherwise, never silently
  different audio);
* reading less often: a caller that knows how many more frames it can use (a streaming decoder
  waits for a whole chunk and its right context) passes ``wanted``, and the open segment's frames
  are read again only once that many steps came since the last read. In every layout one step
  adds at most one final frame, so no frame is reported later than it is wanted, and a stream of
  many requests does not re-read every request's whole segment at every step;
* text: primary tokens outside audio segments (unified chat replies).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

    def __init__(self, prompts, starts_in_audio: bool):
        self.prompts = prompts  # the model family's prompt builder
        self.spec = prompts.spec
        self.pattern = self.spec.pattern
        self.segment = -1
        self._steps: np.ndarray | None = None  # [capacity, K] aux rows of the open segment
        self._n = 0  # rows of it in use
        self._tokens: list[int] = []  # its primary tokens
        self._emitted = 0  # frames of the open segment already reported
        self._frames = None  # [K, n] final frames of the open segment so far
        self._read_at = 0  # rows of the open segment when its frames were last read
        if starts_in_audio:
            self._open()

    @property
    def in_audio(self) -> bool:
        return self._steps is not None

    def _open(self) -> None:
        self.segment += 1
        self._steps = np.empty((64, self.pattern.num_streams), np.int64)  # grows by doubling
        self._n, self._tokens, self._emitted, self._frames, self._read_at = 0, [], 0, None, 0

    def feed(self, token_ids: list[int], aux: np.ndarray, wanted: int = 1) -> list[AudioEvent | TextEvent]:
        """One piece: primary tokens and their ``[len(token_ids), K]`` auxiliary tokens.
        ``wanted``: new frames of the open segment worth reporting (fewer are kept for later:
        they come with a later piece, the segment's end or ``finish``)."""
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
                events.append(self._close(np.asarray(aux[i])))
                wanted = 1  # a segment opened after this one is read at every step
            else:
                if self._n == len(self._steps):
                    self._steps = np.concatenate([self._steps, np.empty_like(self._steps)])
                self._steps[self._n] = aux[i]
                self._n += 1
                self._tokens.append(tok)
        if text:
            events.append(TextEvent(text))
        if self._steps is not None and self._n - self._read_at >= wanted:
            events += self._new_frames()
        return events

    def finish(self) -> list[AudioEvent]:
        """The request finished. An audio segment still open is read as the one-shot reader
        reads the finished output: the rest of its frames where the family ends audio by length
        (CSM), an error where that means it was cut short (the generic layout)."""
        if self._steps is None:
            return []
        events = self._new_frames()
        return events + [self._close(None)]

    def _new_frames(self) -> list[AudioEvent]:
        if not self._n or self._n == self._read_at:
            return []
        self._read_at = self._n
        self._frames = self.prompts.final_frames(self._steps[: self._n])
        n = self._frames.shape[1]
        if n <= self._emitted:
            return []
        event = AudioEvent(self.segment, self._frames[:, self._emitted :].astype(np.int64))
        self._emitted = n
        return [event]

    def _close(self, last_row: np.ndarray | None) -> AudioEvent:
        """``last_row``: the auxiliary row of the segment's <|audio_eos|> step (one-shot reads see
        it too); None when the request ended without one."""
        from speechctl.engine.requests import StreamOutput

        K = self.pattern.num_streams
        rows, tokens = self._steps[: self._n], list(self._tokens)
        if last_row is not None:
            rows = np.concatenate([rows, np.asarray(last_row, np.int64).reshape(1, K)])
            tokens.append(self.spec.audio_eos_id)
        segment_out = StreamOutput(None, tokens, rows, "stop")
        (codes,) = self.prompts.audio_segments(segment_out, starts_in_audio=True)
        emitted = self._emitted
        if codes.shape[1] < emitted or (emitted and not np.array_equal(codes[:, :emitted], self._frames[:, :emitted])):
            raise EngineError("audio streams came out malformed: the finished audio differs from the frames streamed")
        segment = self.segment
        self._steps = None
        return AudioEvent(segment, codes[:, emitted:].astype(np.int64), ended=True)
