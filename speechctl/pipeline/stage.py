"""The stage abstraction: input queue -> engine -> output pieces, and a pipeline of stages.

A :class:`Stage` takes :class:`Piece`s into its inbox, and each call of ``step`` does one unit of
work (one engine step) and returns the pieces it produced. A :class:`Pipeline` steps every busy
stage once per round, upstream first, and hands each stage's output straight to the next stage:
a downstream stage starts working on the first piece its upstream emits, without waiting for the
rest (ASR -> response LM -> TTS: TTS speaks the LM's first phrase while the LM still writes).

Stepping is cooperative, in one thread: the engines of all stages (several vLLM engines in one
process, each with its own bounded KV cache) take turns one step at a time, so the schedule is
deterministic and nothing needs locks. The pipeline records per-stage timestamps of every turn
(first input, first and last output) for latency numbers and tests.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Piece:
    """A unit of data between stages: audio (float32 samples at ``sample_rate``), text, or an error.

    ``last`` marks a stage's final piece of a turn (its data may be empty)."""

    turn: int
    kind: str  # "audio" | "text" | "error"
    data: object  # np.ndarray for audio, str for text and errors
    last: bool = False
    sample_rate: int | None = None
    stage: str = ""  # set by the stage that emitted it
    t: float = field(default_factory=time.perf_counter)

    @property
    def empty(self) -> bool:
        return len(self.data) == 0 if self.data is not None else True


class Stage(ABC):
    """One engine behind an input queue. Subclasses implement ``step`` and ``working``."""

    name = "stage"
    input_rate: int | None = None  # audio stages: the rate they take (others resample to it)

    def __init__(self):
        self.inbox: deque[Piece] = deque()

    def put(self, piece: Piece) -> None:
        self.inbox.append(piece)

    def busy(self) -> bool:
        return bool(self.inbox) or self.working()

    @abstractmethod
    def working(self) -> bool:
        """Work in flight (requests in the engine, output held back)."""

    @abstractmethod
    def step(self) -> list[Piece]:
        """Take queued input, do one unit of engine work, return the pieces produced."""

    def cancel(self) -> None:
        """Drop queued input and abort work in flight (barge-in)."""
        self.inbox.clear()

    def emit(self, turn: int, kind: str, data, last: bool = False, sample_rate: int | None = None) -> Piece:
        return Piece(turn, kind, data, last, sample_rate, stage=self.name)


@dataclass
class StageTimes:
    """perf_counter seconds; None until it happened."""

    first_in: float | None = None
    first_out: float | None = None  # first piece with data
    last_out: float | None = None  # the stage's ``last`` piece of the turn


@dataclass
class Turn:
    """What a pipeline did for one input: timestamps per stage and what came out."""

    index: int
    started: float
    times: dict[str, StageTimes] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # text output per stage
    errors: list[str] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)  # the final stage's audio pieces
    sample_rate: int | None = None
    audio_stage: str = ""  # the stage whose audio is the reply (the last one)
    cancelled: bool = False
    done: bool = False

    @property
    def reply_audio(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)

    def first_audio(self) -> float | None:
        """Seconds from the turn's start to its first reply audio."""
        times = self.times.get(self.audio_stage)
        return None if times is None or times.first_out is None else times.first_out - self.started

    def latencies(self) -> dict[str, float | None]:
        """Seconds from the start of the turn to each stage's first and last output."""
        out = {}
        for name, s in self.times.items():
            out[f"{name}_first"] = None if s.first_out is None else round(s.first_out - self.started, 4)
            out[f"{name}_last"] = None if s.last_out is None else round(s.last_out - self.started, 4)
        return out


class Pipeline:
    """Stages in a chain; ``start`` a turn with the first stage's input, then ``step`` until
    ``busy()`` is False (or ``cancel``). Pieces of every stage are returned by ``step``; the last
    stage's audio is what to play."""

    def __init__(self, stages: list[Stage]):
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.stages = stages
        self.turn: Turn | None = None
        self._turns = 0

    @property
    def output_stage(self) -> str:
        return self.stages[-1].name

    @property
    def input_rate(self) -> int | None:
        """The first stage's audio rate (give it audio at this rate to skip a resampling)."""
        return self.stages[0].input_rate

    def start(self, piece: Piece) -> Turn:
        """Begin a new turn (cancelling one still running) with the first stage's input."""
        if self.busy():
            self.cancel()
        self._turns += 1
        piece.turn = self._turns
        self.turn = Turn(self._turns, started=piece.t, audio_stage=self.output_stage)
        self.turn.times = {s.name: StageTimes() for s in self.stages}
        self._deliver(0, piece)
        return self.turn

    def busy(self) -> bool:
        return any(s.busy() for s in self.stages)

    def step(self) -> list[Piece]:
        """One round: every busy stage steps once, upstream first; outputs go downstream at once."""
        produced = []
        for i, stage in enumerate(self.stages):
            if not stage.busy():
                continue
            for piece in stage.step():
                if self.turn is None or piece.turn != self.turn.index:
                    continue  # a cancelled turn's leftovers
                self._record(stage, piece)
                produced.append(piece)
                if i + 1 < len(self.stages) and piece.kind != "error":
                    self._deliver(i + 1, piece)
        if self.turn is not None and not self.busy():
            self.turn.done = True
        return produced

    def run(self, piece: Piece) -> Turn:
        """A whole turn, synchronously (files, tests, benchmarks)."""
        turn = self.start(piece)
        while self.busy():
            self.step()
        turn.done = True
        return turn

    def cancel(self) -> None:
        for stage in self.stages:
            stage.cancel()
        if self.turn is not None and not self.turn.done:
            self.turn.cancelled = True
            self.turn.done = True

    def _deliver(self, index: int, piece: Piece) -> None:
        stage = self.stages[index]
        times = self.turn.times[stage.name]
        if times.first_in is None:
            times.first_in = time.perf_counter()
        stage.put(piece)

    def _record(self, stage: Stage, piece: Piece) -> None:
        turn = self.turn
        times = turn.times[stage.name]
        if piece.kind == "error":
            turn.errors.append(str(piece.data))
        elif not piece.empty:
            if times.first_out is None:
                times.first_out = piece.t
            if piece.kind == "text":
                turn.texts[stage.name] = turn.texts.get(stage.name, "") + str(piece.data)
            elif stage is self.stages[-1]:
                turn.audio.append(piece.data)
                turn.sample_rate = piece.sample_rate
        if piece.last:
            times.last_out = piece.t
