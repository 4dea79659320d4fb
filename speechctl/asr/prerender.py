"""Windows rendered for vLLM ahead of their admission, on a host thread, while the engine steps.

vLLM turns a request's audio into log-mel features on the host (its multimodal processor) inside
``add_request``, between two steps, while the device waits. The driver
(:mod:`speechctl.asr.whisper`) names the windows it will admit next (``ahead``); one worker
thread renders them (``vllm_compat.render_prompt``) while the main thread is inside the engine's
step, and ``take`` hands the result over at admission (a window not asked for ahead is rendered
then, on the same worker). The feature extractor's work is numpy and torch on the CPU, which
release the GIL while they compute.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future

from speechctl.threads import worker_pool


class Prerender:
    """``render(audio, prompt)`` run ahead for up to ``depth`` windows at once."""

    def __init__(self, render: Callable[[object, list[int]], object], depth: int):
        self._render = render
        self.depth = max(1, depth)
        self._pool = worker_pool("speechctl-asr-render")
        self._pending: OrderedDict[Hashable, Future] = OrderedDict()
        self.waited_s = 0.0  # main-thread time spent rendering or waiting for a render
        self.rendered_ahead = 0
        self.rendered_inline = 0

    @property
    def pending(self) -> int:
        """Windows asked for ahead and not yet taken."""
        return len(self._pending)

    def ahead(self, windows: Iterable[tuple[Hashable, Callable[[], object], list[int]]]) -> None:
        """Start rendering ``(key, audio(), prompt)`` for windows not yet pending, while fewer
        than ``depth`` are. ``audio`` is called on the worker thread."""
        for key, audio, prompt in windows:
            if len(self._pending) >= self.depth:
                return
            if key not in self._pending:
                self._pending[key] = self._pool.submit(lambda a=audio, p=prompt: self._render(a(), p))

    def take(self, key: Hashable, audio: Callable[[], object], prompt: list[int]):
        """The rendered window: the one started ahead, else one rendered now (on the worker too:
        vLLM's processor only ever runs on one thread). A render's error is raised here."""
        start = time.perf_counter()
        future = self._pending.pop(key, None)
        if future is None or future.cancelled():
            self.rendered_inline += 1
            future = self._pool.submit(lambda: self._render(audio(), prompt))
        else:
            self.rendered_ahead += 1
        try:
            return future.result()
        finally:
            self.waited_s += time.perf_counter() - start

    def forget(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop pending renders whose key ``keep`` rejects (their input failed or ended)."""
        for key in [k for k in self._pending if not keep(k)]:
            self._pending.pop(key).cancel()

    def clear(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        self.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
