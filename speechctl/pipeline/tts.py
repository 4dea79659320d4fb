"""The TTS stage: text phrases in, streamed audio out, in phrase order.

Each phrase becomes a streaming TTS request as soon as it arrives (so the second phrase is
generated while the first one still plays, batched in the same engine); audio chunks are released
strictly in phrase order — a later phrase's chunks wait until every earlier phrase has ended.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from speechctl.pipeline.stage import Piece, Stage
from speechctl.pipeline.streamer import SpeechStreamer


class TtsStage(Stage):
    """Input: text pieces (``last`` on the final one). Output: audio pieces, ``last`` at the end.

    ``job_options``: ``TtsJob`` fields for every phrase (sampling, seed, voice, max_seconds).
    """

    name = "tts"

    def __init__(self, speech, *, job_options: dict | None = None, **chunking):
        super().__init__()
        self.streamer = SpeechStreamer(speech, **chunking)
        self.sample_rate = speech.sample_rate
        self.job_options = dict(job_options or {})
        self._ids = itertools.count()
        self._order: deque[str] = deque()  # phrase jobs of the current turn, in order
        self._held: dict[str, list[np.ndarray]] = {}  # audio waiting for earlier phrases
        self._ended: set[str] = set()
        self._turn: int | None = None
        self._input_done = False
        self._phrases = 0  # phrases of the current turn so far

    def working(self) -> bool:
        return self._turn is not None

    def step(self) -> list[Piece]:
        from speechctl.jobs import TtsChunk, TtsJob

        out: list[Piece] = []
        while self.inbox:
            piece = self.inbox.popleft()
            if piece.turn != self._turn:
                self._reset(piece.turn)
            text = str(piece.data or "").strip()
            if text:
                id = f"t{piece.turn}-{next(self._ids)}"
                options = dict(self.job_options)
                if options.get("seed") is not None:  # phrase i of a turn: seed + i
                    options["seed"] += self._phrases
                self._phrases += 1
                self.streamer.submit(TtsJob(id=id, text=text, **options))
                self._order.append(id)
                self._held[id] = []
            self._input_done = self._input_done or piece.last
        if self._turn is None:
            return out
        turn = self._turn
        for event in self.streamer.step() if self.streamer.busy() else []:
            if not isinstance(event, TtsChunk) or event.id not in self._held:
                continue
            if event.error:
                out.append(self.emit(turn, "error", event.error))
            if len(event.audio):
                self._held[event.id].append(event.audio)
            if event.last:
                self._ended.add(event.id)
        while self._order:  # release audio in phrase order
            head = self._order[0]
            out += [self.emit(turn, "audio", a, sample_rate=self.sample_rate) for a in self._held[head]]
            self._held[head] = []
            if head not in self._ended:
                break
            self._order.popleft()
            del self._held[head]
            self._ended.discard(head)
        if self._input_done and not self._order:
            out.append(self.emit(turn, "audio", np.zeros(0, np.float32), last=True, sample_rate=self.sample_rate))
            self._turn = None
        return out

    def _reset(self, turn: int) -> None:
        self.streamer.cancel()
        self._order.clear()
        self._held.clear()
        self._ended.clear()
        self._turn, self._input_done, self._phrases = turn, False, 0

    def cancel(self) -> None:
        super().cancel()
        self.streamer.cancel()
        self._order.clear()
        self._held.clear()
        self._ended.clear()
        self._turn, self._input_done = None, False
