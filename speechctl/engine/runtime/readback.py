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

Folding is a dozen small numpy operations whatever the number of rows, ~50 us of the host's
time, and at 64 decoding requests the step is bound by the host: so copies are folded only
when someone reads the mirror (``collect``: a request finished or streamed) or the ring is
full, all the done ones at once.

Epochs guard a slot's reuse: the rows of a request aborted mid-step never land in the mirror of
the request that claimed the slot after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

RING = 32  # step records waiting to be folded at most (vLLM's async scheduling keeps ~2 in flight)


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
        copy = self._ring[self._next % RING]
        if copy.pending:  # the ring is full: fold it (the oldest copy must land first)
            self.fold(wait_oldest=True)
        copy.host[:rows].copy_(self.record[:rows], non_blocking=True)
        copy.rows, copy.pending = rows, True
        if self.device.type == "cuda":
            copy.event = copy.event or torch.cuda.Event()
            copy.event.record()
        self._next += 1

    def fold(self, wait: bool = False, wait_oldest: bool = False) -> None:
        """Fold the finished copies into the mirror in one pass, oldest first, up to the first
        not done yet (``wait``: waiting for all of them; ``wait_oldest``: for the oldest)."""
        done = []
        for i in range(max(0, self._next - RING), self._next):
            copy = self._ring[i % RING]
            if not copy.pending:
                continue
            if copy.event is not None and not (wait or (wait_oldest and not done)) and not copy.event.query():
                break  # later copies cannot be done if this one is not
            if copy.event is not None:
                copy.event.synchronize()  # (reused by the ring: recorded again for each copy)
            done.append(copy)
        if not done:
            return
        rec = np.concatenate([copy.host[: copy.rows].numpy() for copy in done])
        K = self.K
        slot, g, flags, epoch = rec[:, K], rec[:, K + 1], rec[:, K + 2], rec[:, K + 3]
        keep = ((flags & 1) == 1) & (epoch == self.epoch[slot])
        slot, g = slot[keep], np.minimum(g[keep], self.max_len)
        self.tokens[slot, g] = rec[keep, :K]  # (a claim samples each generated index once: `real`)
        np.maximum.at(self.done, slot, g + 1)
        np.bitwise_or.at(self.desync, slot, (flags[keep] >> 1) & 1)
        for copy in done:
            copy.pending = False

    def collect(self, spans: list[tuple[int, int, int]]) -> list[tuple[np.ndarray, int]]:
        """[(slot, start, end)] -> (the [end - start, K] tokens of generated indices start..end-1,
        desync flag) of each, from the mirror."""
        self.fold()
        if any(self.done[slot] < end for slot, _, end in spans):
            self.fold(wait=True)
        return [(self.tokens[slot, start:end].copy(), int(self.desync[slot])) for slot, start, end in spans]
