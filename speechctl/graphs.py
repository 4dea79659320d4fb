"""CUDA graphs of a function recorded once per batch-size bucket and replayed: one launch where
eager PyTorch would make hundreds. Two users: the engine's per-step work around vLLM's forward
(``engine/runtime``) and a codec's decode (``codecs/base.py``).

Why it matters beyond launch cost: a function launched op by op from a worker thread (the
codec's) needs Python's lock back after every op, and while the engine's thread runs Python it
gets it only when the interpreter forces a switch (every 5 ms): 500 small ops took ~2 s so on a
CPU, 1.4 ms alone (docs/benchmarks/stream.md, benchmarks/worker_lock.py). A replay is one op.

Inputs are copied into static buffers of the bucket's size; rows past the live ones carry
padding values chosen by the caller (the runtime's scratch slot, whose writes go nowhere). An
input that already lies in a persistent buffer (vLLM's token ids and positions, the runtime's
row slots) is read there instead (``InPlace``): a copy is one more launch of the step's host
time, which is what bounds a step at large batches. The
recorded function may read and write any persistent device buffer (the runtime's slot table);
it must not sync the host or branch on device values. Outputs are views into the graph's
memory, valid until the next replay of any graph of the same ``StepGraphs``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


class InPlace(NamedTuple):
    """A graph input read where it lies: the step's rows are the first rows of ``buffer``, a
    persistent tensor, and the graph reads ``buffer[:bucket]`` directly. Whoever passes one
    keeps the rows past the live ones fit to read (their pad does not apply) and passes the same
    buffer every time."""

    buffer: torch.Tensor


@dataclass
class _Entry:
    graph: object  # torch.cuda.CUDAGraph (a stand-in's own record on the CPU)
    inputs: list[torch.Tensor]  # static, [bucket, ...]
    outputs: tuple[torch.Tensor, ...] | None


class StepGraphs:
    """Lazily recorded CUDA graphs of one function (a step's work, a codec's decode), keyed by
    (bucket, key).

    ``sizes``: the buckets (batch sizes with a graph); a batch larger than the largest runs eagerly.
    ``most``: graphs recorded at most (None: no limit); past it a new (bucket, key) runs eagerly.
    """

    def __init__(self, sizes: Sequence[int], device: torch.device, most: int | None = None):
        self.sizes = sorted(set(int(s) for s in sizes if s > 0))
        self.device = device
        self.most = most
        self.pool = self._new_pool()
        self._entries: dict[Hashable, _Entry] = {}
        self.captured = 0

    def recorded(self, size: int, key: Hashable) -> bool:
        return (size, key) in self._entries

    def bucket(self, rows: int) -> int | None:
        i = bisect.bisect_left(self.sizes, rows)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(
        self,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        key: Hashable,
        rows: int,
        inputs: Sequence[torch.Tensor],
        pads: Sequence[float | int | None],
    ) -> tuple[torch.Tensor, ...] | None:
        """fn(*inputs padded to the bucket) -> outputs[:rows], or None when ``rows`` has no bucket
        (the caller runs ``fn`` eagerly; so too a new graph past ``most``). ``pads[i]``: the value of padding rows of input i
        (None: any finite leftover is fine, nothing is written); an ``InPlace`` input is read
        from its buffer (no pad)."""
        size = self.bucket(rows)
        if size is None:
            return None
        entry = self._entries.get((size, key))
        fresh = entry is None
        if fresh:
            if self.most is not None and self.captured >= self.most:
                return None
            if any(isinstance(x, InPlace) and x.buffer.shape[0] < size for x in inputs):
                return None  # (checked once: a replay's buffer is the recorded one, see below)
            static = [x.buffer[:size] if isinstance(x, InPlace) else
                      torch.zeros((size,) + tuple(x.shape[1:]), dtype=x.dtype, device=self.device) for x in inputs]
        else:
            static = entry.inputs
        for buf, x, pad in zip(static, inputs, pads):
            if isinstance(x, InPlace):
                if x.buffer.data_ptr() != buf.data_ptr():
                    raise RuntimeError("speechctl: a per-step graph's in-place input moved to another buffer")
                continue
            buf[:rows].copy_(x, non_blocking=True)
            if pad is not None and rows < size:
                buf[rows:].fill_(pad)
        if fresh:
            # The eager run is this step's real work and warms up lazily initialised kernels;
            # recording then executes nothing, it only captures the same calls.
            result = fn(*static)
            self._entries[(size, key)] = self._entry(fn, static)
            self.captured += 1
            return _rows(result, rows)
        return _rows(self._replay(entry), rows)

    # The CUDA parts, apart (tests/test_cuda_paths.py puts a CPU stand-in in their place, to run
    # everything above them without a GPU).

    def _new_pool(self):
        return torch.cuda.graph_pool_handle()

    def _entry(self, fn, static: list[torch.Tensor]) -> _Entry:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            outputs = fn(*static)
        return _Entry(graph, static, tuple(outputs))

    def _replay(self, entry: _Entry) -> tuple[torch.Tensor, ...]:
        entry.graph.replay()
        return entry.outputs


def _rows(outputs, rows: int) -> tuple:
    return tuple(None if r is None else r[:rows] for r in outputs)
