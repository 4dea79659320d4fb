"""Codec decodes off the engine's thread, so the step loop never waits for them.

``DecodeQueue`` takes batches of finished requests' codes and hands back their waveforms in the
order they went in. On CUDA one worker thread runs the decodes (on the codec's own CUDA stream,
``Codec._on_own_stream``) while the caller keeps stepping vLLM; waiting for the GPU releases
Python's lock, so the two overlap. On the CPU the decode runs at once, in the caller's thread:
there both would compete for the same cores.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from speechctl.codecs.base import Codec


class DecodeQueue:
    def __init__(self, codec: Codec):
        self.codec = codec
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="speechctl-codec") if codec.device.type == "cuda" else None
        self._pending: deque[tuple[list, Future]] = deque()

    def submit(self, tags: list, codes: list[np.ndarray]) -> None:
        """Decode ``codes`` ([K, T] each), one batch; ``tags`` come back with the waveforms."""
        if not codes:
            return
        if self._pool is None:
            future: Future = Future()
            future.set_result(self.codec.decode(codes))
        else:
            future = self._pool.submit(self.codec.decode, codes)
        self._pending.append((tags, future))

    def ready(self, wait: bool = False) -> Iterator[tuple[object, np.ndarray]]:
        """(tag, waveform) of the batches decoded so far, in submission order (all of them,
        waiting, with ``wait``)."""
        while self._pending and (wait or self._pending[0][1].done()):
            tags, future = self._pending.popleft()
            yield from zip(tags, future.result())

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
