"""A long TTS job as pieces: one engine request per piece of its text (``speechctl.text``), all in
the continuous batch at once, joined in order with the pause each piece ends with.

``Whole`` gathers a job's decoded pieces into one ``TtsResult`` (one-shot); ``Sequence`` passes a
streamed job's chunks on in order (a piece's chunks wait until the pieces before it are done).
Nothing is dropped silently: a piece that reached its length cap is named in the result's
``warnings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from speechctl.jobs import TtsChunk, TtsJob, TtsResult
from speechctl.text import Piece


def cap_warning(job_id: str, seconds: float, piece: int | None = None, count: int = 1) -> str:
    where = f" (piece {piece + 1} of {count})" if piece is not None and count > 1 else ""
    return f"{job_id}{where}: the audio reached its {seconds:.3g} s cap and may be cut short (--max-seconds raises it)"


@dataclass(eq=False)
class Whole:
    """A long job in flight: its pieces' codes and audio as they come back."""

    job: TtsJob
    pieces: list[Piece]
    codes: dict[int, np.ndarray] = field(default_factory=dict)
    waves: dict[int, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    failed: bool = False

    def add(self, index: int, codes: np.ndarray, wave: np.ndarray) -> None:
        self.codes[index], self.waves[index] = codes, wave

    @property
    def done(self) -> bool:
        return len(self.waves) == len(self.pieces)

    def result(self, sample_rate: int) -> TtsResult:
        """The pieces' audio in order, each followed by its pause; codes [K, sum of T] (pauses
        are silence in the waveform only)."""
        parts = []
        for i, piece in enumerate(self.pieces):
            parts.append(self.waves[i])
            if piece.pause_s:
                parts.append(np.zeros(round(piece.pause_s * sample_rate), dtype=np.float32))
        codes = np.concatenate([self.codes[i] for i in range(len(self.pieces))], axis=1)
        return TtsResult(self.job.id, np.concatenate(parts), sample_rate, codes=codes, warnings=self.warnings)


@dataclass(eq=False)
class PartOf:
    """The tag of one piece's engine request."""

    whole: Whole
    index: int
    max_frames: int

    @property
    def job(self) -> TtsJob:
        return self.whole.job


class Sequence:
    """A streamed long job: chunks of its pieces in, the job's chunks out, in piece order, with
    each piece's pause as a chunk of silence and the offsets continuing across pieces."""

    def __init__(self, job_id: str, pieces: list[Piece], sample_rate: int):
        self.job_id, self.pieces, self.rate = job_id, pieces, sample_rate
        self.held: dict[int, list[TtsChunk]] = {i: [] for i in range(len(pieces))}
        self.current = 0
        self.samples = 0
        self.failed = False

    def push(self, index: int, chunk: TtsChunk) -> list[TtsChunk]:
        """A chunk of piece ``index`` -> the job's chunks that can go out now."""
        if self.failed:
            return []
        if chunk.error:
            self.failed = True
            where = f"piece {index + 1} of {len(self.pieces)}"
            return [TtsChunk(self.job_id, np.zeros(0, np.float32), self.rate, self.samples, True, f"{where}: {chunk.error}")]
        self.held[index].append(chunk)
        out = []
        while self.current < len(self.pieces) and self.held[self.current]:
            chunk = self.held[self.current].pop(0)
            last_piece = self.current == len(self.pieces) - 1
            if len(chunk.audio) or (chunk.last and last_piece):
                out.append(TtsChunk(self.job_id, chunk.audio, self.rate, self.samples, chunk.last and last_piece))
                self.samples += len(chunk.audio)
            if chunk.last:
                pause = self.pieces[self.current].pause_s
                if pause and not last_piece:
                    silence = np.zeros(round(pause * self.rate), dtype=np.float32)
                    out.append(TtsChunk(self.job_id, silence, self.rate, self.samples, False))
                    self.samples += len(silence)
                self.current += 1
        return out
