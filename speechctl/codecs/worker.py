"""Codec decodes off the engine's thread, so the step loop never waits for them.

``DecodeQueue`` takes batches of finished requests' codes and hands back their waveforms in the
order they went in. On CUDA one worker thread runs the decodes (on the codec's own CUDA stream,
``Codec._on_own_stream``) while the caller keeps stepping vLLM; waiting for the GPU releases
Python's lock, so the two overlap. On the CPU the decode runs at once, in the caller's thread:
there both would compete for the same cores.

Batches that arrive while the worker decodes wait, and the worker then decodes all of them in
one call: requests that finish one or two a step (lengths that differ) would otherwise make as
many small decodes, one after another, each a fraction of what the GPU can take at once (on the
H200 the delay model's 64 spread-length requests took 1.8 s to their last audio after an LM
stage of ~0.6 s that way: docs/families.md, AR+NAR benchmark).

Urgent batches (``decode(..., urgent=True)``: streamed chunks, whose listeners wait for them) go
first and apart: waiting urgent batches are decoded in one call before any waiting bulk one
(whole one-shot waveforms), not merged with it. Merged, a first chunk of a few frames waited for
the step's finished one-shot requests' whole audio to decode beside it: under the real Higgs
3B's load its decode wait was 12 ms at p50 and 150–240 ms at p95 (H100, forty-ninth session).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future

import numpy as np

from speechctl.codecs.base import Codec
from speechctl.threads import worker_pool


class DecodeQueue:
    def __init__(self, codec: Codec, thread: bool | None = None):
        """``thread``: decode on the worker thread (None: on CUDA only, where it overlaps)."""
        self.codec = codec
        thread = codec.device.type == "cuda" if thread is None else thread
        self._pool = worker_pool("speechctl-codec") if thread else None
        self._pending: deque[tuple[list, Future]] = deque()
        # submitted, not yet taken by the worker: urgent, bulk
        self._waiting: tuple[list, list] = ([], [])
        self._lock = threading.Lock()
        # seconds the codec spent decoding (on the worker thread, or in the caller's on the CPU):
        # a worker that runs behind shows here, not in the caller's step time
        self.busy_s = 0.0
        # (start, end) perf_counter times of each decode (benchmarks: what of a run's tail after
        # its last step was decoding, and what was waiting for a decode to start)
        self.spans: list[tuple[float, float]] = []
        # a decode runs now, and how many have started (benchmarks: do the caller's steps slow
        # down beside one? read without the lock: hints)
        self.decoding, self.decodes_started = False, 0

    def submit(self, tags: list, codes: list[np.ndarray]) -> None:
        """Decode ``codes`` ([K, T] each), with whatever else is waiting; ``tags`` come back with
        the waveforms (``ready``)."""
        if codes:
            self._pending.append((tags, self.decode(codes)))

    def decode(self, codes: list[np.ndarray], urgent: bool = False) -> Future:
        """The future of ``codes``' waveforms ([K, T] each; none: done at once, an empty list),
        decoded with whatever else of its kind is waiting, ``urgent`` ones first (module doc);
        for callers that keep their own order. Urgent futures complete in submission order."""
        future: Future = Future()
        if not codes:
            future.set_result([])
        elif self._pool is None:
            future.set_result(self._timed_decode(codes))
        else:
            with self._lock:
                self._waiting[0 if urgent else 1].append((codes, future))
            self._pool.submit(self._decode_waiting)
        return future

    def _decode_waiting(self) -> None:
        """The worker: the urgent batches waiting, in one decode, then the bulk ones, in one,
        until none wait (none now: an earlier call took them)."""
        while True:
            with self._lock:
                urgent, bulk = self._waiting
                batches = urgent or bulk
                if not batches:
                    return
                self._waiting = ([], bulk) if urgent else ([], [])
            self._decode_batches(batches)

    def _decode_batches(self, batches: list[tuple[list[np.ndarray], Future]]) -> None:
        try:
            waves = self._timed_decode([item for codes, _ in batches for item in codes])
        except BaseException as error:  # each caller sees it where it reads its batch
            for _, future in batches:
                future.set_exception(error)
            return
        start = 0
        for codes, future in batches:
            future.set_result(waves[start : start + len(codes)])
            start += len(codes)

    def _timed_decode(self, codes: list[np.ndarray]) -> list[np.ndarray]:
        started, self.decoding = time.perf_counter(), True
        self.decodes_started += 1
        try:
            return self.codec.decode(codes)
        finally:
            self.decoding, ended = False, time.perf_counter()
            self.busy_s += ended - started
            self.spans.append((started, ended))

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
