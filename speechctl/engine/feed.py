"""Feeding an engine from an iterator of requests, the loop every engine shares (``SpeechEngine``,
the AR+NAR ``ArNarEngine``): pull requests lazily, keeping at most twice the engine's capacity
in flight, step until everything is done. No vLLM import (the AR+NAR engine's module has none)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator


def feed_steps(engine, requests: Iterable, in_flight: Callable[[], int], every_step: bool = False) -> Iterator[list]:
    """``engine``: ``submit(request)``, ``step() -> outputs``, ``has_work()``, ``capacity``;
    ``in_flight()``: how many of its requests are queued or running. Yields the outputs finished
    by each step (every step's, empty ones too, with ``every_step``: the caller works between
    steps)."""
    pending = iter(requests)
    exhausted = False
    while True:
        while not exhausted and in_flight() < 2 * engine.capacity:
            nxt = next(pending, None)
            if nxt is None:
                exhausted = True
            else:
                engine.submit(nxt)
        if exhausted and not engine.has_work():
            return
        outputs = engine.step()
        if outputs or every_step:
            yield outputs
