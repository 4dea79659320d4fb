"""Learning rates by the clock: warm up, hold, and decay over the last part of each run.

A run is bounded by wall-clock time (one device call), and how many steps fit is not known
ahead, so the schedule is warmup-stable-decay over the run's own time: linear warm-up over the
first steps of training, the peak rate until ``decay_share`` of the run's time is left, then a
cosine down to ``floor`` x peak at its deadline (or over its last steps, when ``max_steps``
bounds it). Every run with a ``decay_share`` thus ends annealed, a checkpoint fit to export. A
resumed run climbs from the rate the last run ended at (``ended_at``: its last logged rate) back to
the peak over its first ``warmup_steps``. (Jumping straight back to the peak, 10x the rate the
optimizer's moments last saw, kicked the codec's mel loss from 1.37 to 2.25 on the H200, and it
took ~300 steps, a tenth of the call, to come back.) Calls chained within a session can thus run
at ``decay_share`` 0, each ending at the peak and the next one going on from there without a
climb, and only the session's last call anneals.
"""

from __future__ import annotations

import math
import time


class RunSchedule:
    def __init__(self, deadline: float, *, first_step: int, warmup_steps: int, decay_share: float, floor: float,
                 max_steps: int | None = None, rewarm_from: int | None = None, ended_at: float | None = None,
                 clock=time.time):
        self.clock = clock
        self.start, self.deadline = clock(), deadline
        self.first, self.max_steps = first_step, max_steps
        self.warmup, self.decay_share, self.floor = warmup_steps, decay_share, floor
        self.rewarm_from = rewarm_from
        # resumed: the factor of the last run's final step (None: not known, taken as the floor)
        self.ended_at = floor if ended_at is None else ended_at

    def progress(self, step: int) -> float:
        """How far through this run, 0..1 (by steps when they bound it, else by time)."""
        if self.max_steps is not None:
            return min(1.0, (step - self.first) / max(1, self.max_steps))
        span = max(1e-9, self.deadline - self.start)
        return min(1.0, (self.clock() - self.start) / span)

    def factor(self, step: int) -> float:
        scale = min(1.0, (step + 1) / max(1, self.warmup))
        if self.first > 0:  # resumed: from the rate the last run ended at, back up, if it annealed
            # (below the warm-up's factor at its final step; one that stopped in its warm-up goes on)
            share = min(1.0, self.ended_at / min(1.0, self.first / max(1, self.warmup)))
            if share < 1 - 1e-9:  # (a logged rate over the peak is the factor up to rounding)
                scale *= share + (1 - share) * min(1.0, (step - self.first + 1) / max(1, self.warmup))
        if self.rewarm_from is not None:  # optimizer moments rebuilt after a resume
            scale *= min(1.0, (step - self.rewarm_from + 1) / max(1, self.warmup // 2))
        p = self.progress(step)
        start = 1.0 - self.decay_share
        if p > start and self.decay_share > 0:
            t = (p - start) / self.decay_share
            scale *= self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * t))
        return scale


def resumed_rate(history: list[dict], peak: float) -> float | None:
    """``ended_at`` for a run that resumes a checkpoint: its last logged rate (the history travels in
    every checkpoint) over the peak; None where nothing was logged."""
    rate = next((row["lr"] for row in reversed(history) if "lr" in row), None)
    return None if rate is None else rate / peak


def ramp(step: int, start: int, length: int) -> float:
    """0 before ``start``, rising linearly to 1 over the next ``length`` steps, then 1: the share
    of a loss term's weight at ``step`` (the guided attention's, ``lm_train.align_start``)."""
    if step < start:
        return 0.0
    return 1.0 if length <= 0 else min(1.0, (step - start + 1) / length)
