"""Windows rendered for vLLM ahead of their admission, a few at a time, on a host thread, while
the engine steps.

vLLM turns a request's audio into log-mel features on the host (its multimodal processor) inside
``add_request``, between two steps, while the device waits. The driver
(:mod:`speechctl.asr.whisper`) names the windows it will admit next (``ahead``); one worker
thread renders them in chunks of up to ``chunk`` windows (one ``render_many`` call each: the
feature extractor takes a chunk at once on a GPU) while the main thread is inside the engine's
step, and ``take`` hands a window over at admission (a window not asked for ahead is rendered
then, alone, on the same worker). Chunks are small so that the window at the head of the line
waits for a few renders, not for the whole line's. The feature extractor's work is numpy and
torch, which release the GIL while they compute.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future

from speechctl.threads import worker_pool

# render_many: [(key, audio, decoder prompt), ...] -> one rendered window (or the exception
# raised for it) per input, in order
RenderMany = Callable[[Sequence[tuple[Hashable, object, list[int]]]], list]


class Prerender:
    """``render_many`` run ahead for up to ``depth`` windows at once, ``chunk`` windows a call."""

    def __init__(self, render_many: RenderMany, depth: int, chunk: int = 8):
        self._render_many = render_many
        self.depth = max(1, depth)
        self.chunk = max(1, chunk)
        self._pool = worker_pool("speechctl-asr-render")
        self._pending: OrderedDict[Hashable, tuple[Future, int]] = OrderedDict()  # key -> (its chunk, index)
        self.waited_s = 0.0  # main-thread time spent rendering or waiting for a render
        self.rendered_ahead = 0
        self.rendered_inline = 0
        self.calls = 0  # render_many calls (chunks)

    @property
    def pending(self) -> int:
        """Windows asked for ahead and not yet taken."""
        return len(self._pending)

    def ahead(self, windows: Iterable[tuple[Hashable, Callable[[], object], list[int]]]) -> None:
        """Start rendering ``(key, audio(), prompt)`` for windows not yet pending, while fewer
        than ``depth`` are. ``audio`` is called on the worker thread."""
        new, keys = [], set()
        for key, audio, prompt in windows:
            if len(self._pending) + len(new) >= self.depth:
                break
            if key not in self._pending and key not in keys:
                new.append((key, audio, prompt))
                keys.add(key)
        for start in range(0, len(new), self.chunk):
            part = new[start:start + self.chunk]
            future = self._pool.submit(self._run, part)
            for index, (key, _, _) in enumerate(part):
                self._pending[key] = (future, index)

    def take(self, key: Hashable, audio: Callable[[], object], prompt: list[int]):
        """The rendered window: the one started ahead, else one rendered now (on the worker too:
        vLLM's processor only ever runs on one thread). A render's error is raised here."""
        start = time.perf_counter()
        future, index = self._pending.pop(key, (None, 0))
        if future is None or future.cancelled():
            self.rendered_inline += 1
            future, index = self._pool.submit(self._run, [(key, audio, prompt)]), 0
        else:
            self.rendered_ahead += 1
        try:
            result = future.result()[index]
        finally:
            self.waited_s += time.perf_counter() - start
        if isinstance(result, BaseException):
            raise result
        return result

    def _run(self, part: list[tuple[Hashable, Callable[[], object], list[int]]]) -> list:
        """One chunk on the worker: each window's rendering or the exception raised for it (a
        window whose audio cannot be read, or that the renderer rejects, fails alone)."""
        self.calls += 1
        inputs, results = [], []
        for key, audio, prompt in part:
            try:
                inputs.append((key, audio(), prompt))
                results.append(None)
            except Exception as e:  # noqa: BLE001 - handed to the window's taker
                results.append(e)
        try:
            rendered = iter(self._render_many(inputs) if inputs else [])
        except Exception:  # noqa: BLE001 - some window in the chunk: render each alone to find it
            rendered = iter([self._one(one) for one in inputs])
        return [r if r is not None else next(rendered) for r in results]

    def _one(self, window):
        try:
            return self._render_many([window])[0]
        except Exception as e:  # noqa: BLE001 - handed to the window's taker
            return e

    def forget(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop pending renders whose key ``keep`` rejects (their input failed or ended); a chunk
        none of whose windows is wanted any more is cancelled if it has not started."""
        for key in [k for k in self._pending if not keep(k)]:
            future, _ = self._pending.pop(key)
            if all(f is not future for f, _ in self._pending.values()):
                future.cancel()

    def clear(self) -> None:
        for future, _ in self._pending.values():
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        self.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
