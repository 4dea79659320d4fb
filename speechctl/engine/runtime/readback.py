"""The generated auxiliary tokens read back to the host without waiting for the device.

Copying the tokens of a finished or streamed request out of the slot table when vLLM reports it
(``tensor.cpu()``) makes the host wait for everything queued on the device: with vLLM's async
scheduling that is the *next* step too, so the host cannot prepare the step after it and the
overlap is gone (streamed requests cost ~1.8x one-shot ones on the H200 that way). Instead, every
step's sample step also writes its rows' record — tokens, slot, generated index, whether the
sample is real, the pair's desync, the slot's epoch — into one persistent device buffer, and the
runtime queues one copy of it into a pinned host ring right after the step's sampling, in stream
order, with an event. By the time vLLM hands out that step's tokens it has waited for its own
sampler, which runs after our copy, so the copy is done: the host folds finished copies into a
mirror of the slot table (``tokens``) and reads requests from there. A copy not done yet (never
seen in practice) is waited for, alone.

Epochs guard a slot's reuse: the rows of a request aborted mid-step never land in the mirror of
the request that claimed the slot after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

RING = 8  # step records in flight at most (vLLM's async scheduling keeps ~2)


@dataclass
class _Copy:
    host: torch.Tensor  # [max_rows, K + 4] int64, pinned on CUDA
    rows: int = 0
    event: object = None  # torch.cuda.Event, reused; None on the CPU (copies are done at once)
    pending: bool = False


class Readback:
    def __init__(self, *, slots: int, max_rows: int, max_len: int, num_codebooks: int, pad: int, device: torch.device):
        K = num_codebooks
        self.K, self.max_len, self.device = K, max_len, device
        # the step's record, written inside the (graphed) sample step: [tokens K | slot | g | flags | epoch]
        self.record = torch.zeros(max_rows, K + 4, dtype=torch.int64, device=device)
        self._ring = self._new_ring(max_rows)
        self._next = 0
        self.tokens = np.full((slots, max_len + 1, K), pad, dtype=np.int32)  # the host mirror
        self.done = np.zeros(slots, dtype=np.int64)  # generated indices 0..done-1 are in the mirror
        self.desync = np.zeros(slots, dtype=np.int64)
        self.epoch = np.zeros(slots, dtype=np.int64)  # the host's epoch of each slot

    def _new_ring(self, rows: int) -> list[_Copy]:
        # device="cpu" said outright: vLLM builds the model (and so this) under a default-device
        # context of the GPU, which would otherwise put the host ring there
        pin = self.device.type == "cuda"
        return [_Copy(torch.zeros(rows, self.K + 4, dtype=torch.int64, device="cpu", pin_memory=pin))
                for _ in range(RING)]

    def reserve_rows(self, rows: int) -> None:
        """Room for steps of ``rows`` rows: a per-step graph runs its bucket's rows, padding
        included, and vLLM's buckets go past the batch's limit (its largest is twice
        ``max_num_seqs`` by default). Before any step has been recorded (at attach)."""
        if rows <= self.record.shape[0]:
            return
        assert self._next == 0, "the readback grows only before its first step"
        self.record = torch.zeros(rows, self.K + 4, dtype=torch.int64, device=self.device)
        self._ring = self._new_ring(rows)

    def claimed(self, slots: list[int], epochs: list[int]) -> None:
        """Slots taken by new requests (their epochs as the device records them)."""
        self.done[slots] = 0
        self.desync[slots] = 0
        self.epoch[slots] = epochs

    def after_step(self, rows: int) -> None:
        """Queue the copy of this step's record (``rows`` rows): right after its sampling."""
        self.fold()
        copy = self._ring[self._next % RING]
        if copy.pending:  # the ring is full: the oldest copy must land first
            self._fold_one(copy, wait=True)
        copy.host[:rows].copy_(self.record[:rows], non_blocking=True)
        copy.rows, copy.pending = rows, True
        if self.device.type == "cuda":
            copy.event = copy.event or torch.cuda.Event()
            copy.event.record()
        self._next += 1

    def fold(self, wait: bool = False) -> None:
        """Fold the finished copies into the mirror, oldest first (all of them with ``wait``)."""
        for i in range(self._next - RING, self._next):
            copy = self._ring[i % RING] if i >= 0 else None
            if copy is not None and copy.pending and not self._fold_one(copy, wait):
                return  # later copies cannot be done if this one is not

    def _fold_one(self, copy: _Copy, wait: bool) -> bool:
        if copy.event is not None:  # (reused by the ring: recorded again for each copy)
            if not wait and not copy.event.query():
                return False
            copy.event.synchronize()
        rec = copy.host[: copy.rows].numpy()
        K = self.K
        slot, g, flags, epoch = rec[:, K], rec[:, K + 1], rec[:, K + 2], rec[:, K + 3]
        keep = ((flags & 1) == 1) & (epoch == self.epoch[slot])
        slot, g = slot[keep], np.minimum(g[keep], self.max_len)
        self.tokens[slot, g] = rec[keep, :K]
        np.maximum.at(self.done, slot, g + 1)
        self.desync[slot] |= (flags[keep] >> 1) & 1
        copy.pending = False
        return True

    def collect(self, spans: list[tuple[int, int, int]]) -> list[tuple[np.ndarray, int]]:
        """[(slot, start, end)] -> (the [end - start, K] tokens of generated indices start..end-1,
        desync flag) of each, from the mirror."""
        self.fold()
        if any(self.done[slot] < end for slot, _, end in spans):
            self.fold(wait=True)
        return [(self.tokens[slot, start:end].copy(), int(self.desync[slot])) for slot, start, end in spans]
