"""Worker threads beside the engine's step loop need Python's lock back promptly.

speechctl runs vLLM's engine core in the caller's process and thread (``vllm_compat``), so the step
loop's Python holds the interpreter's lock most of the time. A worker (the codec's decode, ASR's
rendering, the NAR stage) gives the lock away at every PyTorch op and waits to take it back until
the step loop reaches an op of its own or the interpreter forces a switch: every
``sys.getswitchinterval()``, 5 ms by default. A decode of ten ops could so wait 50 ms.
``benchmarks/worker_lock.py`` measures both sides on the CPU: the worker's ops at 5 ms and at a
shorter interval, and what the shorter one costs the main thread's Python.
"""

from __future__ import annotations

import logging
import sys
from concurrent.futures import ThreadPoolExecutor

from speechctl.accelerator import number_setting

logger = logging.getLogger(__name__)

SWITCH_INTERVAL_ENV = "SPEECHCTL_SWITCH_INTERVAL_MS"
DEFAULT_SWITCH_INTERVAL_MS = 0.5


def prompt_workers() -> None:
    """Lower Python's thread switch interval to ``SPEECHCTL_SWITCH_INTERVAL_MS`` (default 0.5 ms)
    where it is longer, for the whole process: called where speechctl starts a worker thread
    beside the step loop. A forced switch happens only while a thread waits for the lock, so
    with no worker busy nothing changes. ``SPEECHCTL_SWITCH_INTERVAL_MS=0`` leaves it as it is."""
    ms = number_setting(SWITCH_INTERVAL_ENV, lambda x: x >= 0, "Python's thread switch interval in milliseconds (0: leave it)")
    ms = DEFAULT_SWITCH_INTERVAL_MS if ms is None else ms
    if ms and sys.getswitchinterval() > ms / 1000:
        logger.debug("speechctl: Python's thread switch interval %.2f -> %.2f ms", 1000 * sys.getswitchinterval(), ms)
        sys.setswitchinterval(ms / 1000)


def worker_pool(name: str) -> ThreadPoolExecutor:
    """One worker thread beside the step loop (named ``name``), the switch interval lowered for it."""
    prompt_workers()
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
