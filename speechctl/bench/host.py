"""Host time of vLLM's scheduler in a bench run: ``schedule()`` and ``update_from_output()`` of
the engine's scheduler (speechctl's CFG pair scheduler where pairs are enabled), timed per call.

With async scheduling the GPU runs step n while the host schedules step n+1, so scheduler time
costs throughput only where it exceeds the GPU's step; per-step milliseconds beside the step's
wall time say which side of that line a concurrency is on (issue 21, item 4: what pairs cost as
they grow)."""

from __future__ import annotations

import time


class SchedulerClock:
    """Wraps the two scheduler methods of ``engine`` (a ``SpeechEngine``) on the instance, for
    the clock's lifetime (``close`` restores them)."""

    METHODS = ("schedule", "update_from_output")

    def __init__(self, engine):
        self._scheduler = engine.scheduler()
        self.seconds = dict.fromkeys(self.METHODS, 0.0)
        self.calls = dict.fromkeys(self.METHODS, 0)
        for name in self.METHODS:
            setattr(self._scheduler, name, self._timed(name, getattr(self._scheduler, name)))

    def _timed(self, name, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1
        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.METHODS, 0.0)
        self.calls = dict.fromkeys(self.METHODS, 0)

    def per_step_ms(self) -> dict:
        """Milliseconds per call of each method, and the steps scheduled."""
        steps = self.calls["schedule"]
        return {"steps": steps, **{f"{name}_ms": round(1e3 * self.seconds[name] / max(1, self.calls[name]), 4)
                                   for name in self.METHODS}}

    def close(self) -> None:
        for name in self.METHODS:
            self._scheduler.__dict__.pop(name, None)  # the class's method again
