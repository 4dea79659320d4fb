"""What Python's lock costs a codec decode on a worker thread while the engine's thread runs.

The streamer decodes on a worker thread (``codecs/worker.py``) so that the step loop never waits
for the codec. Each PyTorch op releases Python's lock while it runs and takes it back after; when
another thread runs Python meanwhile, taking it back waits until that thread lets go: at its own
next op, or when the interpreter forces a switch (``sys.getswitchinterval()``, 5 ms). An eager
decode is hundreds of ops, a CUDA graph's replay one (``speechctl.graphs``). This times ``--ops``
small ops on a worker thread alone, then while the main thread runs pure Python (the worst case),
Python with an op every N iterations (a step loop's mix), the same ops as one call (what a
replay is to the lock), and beside pure Python again at shorter switch intervals
(``speechctl.threads.prompt_workers``), with what those cost the main thread's Python: its fixed
work timed alone and beside a worker that makes ops without pause. Device-independent: the lock
is the host's, so the CPU shows it.

    python benchmarks/worker_lock.py --out docs/benchmarks/worker-lock-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time

import torch


def on_worker(work) -> float:
    """Seconds ``work`` takes on a thread of its own."""
    seconds = []
    thread = threading.Thread(target=lambda: seconds.append(_timed(work)))
    thread.start()
    thread.join()
    return seconds[0]


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def with_main_busy(work, op_every: int | None, repeats: int) -> float:
    """Fastest of ``repeats`` runs of ``work`` on a worker while another thread (the step loop's
    stand-in) runs Python, with a small op every ``op_every`` iterations (None: never)."""
    stop = threading.Event()
    results = []

    def main_loop():
        x, i = torch.zeros(4), 0
        while not stop.is_set():
            i += 1
            if op_every and i % op_every == 0:
                x = x + 1

    busy = threading.Thread(target=main_loop)
    busy.start()
    time.sleep(0.05)
    try:
        for _ in range(repeats):
            results.append(on_worker(work))
    finally:
        stop.set()
        busy.join()
    return min(results)


def main_python_beside_a_worker(repeats: int, iterations: int = 3_000_000) -> float:
    """Fastest time of a fixed pure-Python loop beside a worker making small ops without pause,
    over its fastest time alone."""
    def count():
        total = 0
        for i in range(iterations):
            total += i

    alone = min(_timed(count) for _ in range(repeats))
    stop = threading.Event()

    def ops():
        x = torch.zeros(8)
        while not stop.is_set():
            x = x + 1

    worker = threading.Thread(target=ops)
    worker.start()
    try:
        beside = min(_timed(count) for _ in range(repeats))
    finally:
        stop.set()
        worker.join()
    return beside / alone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=500, help="small ops per decode (an eager codec decode: hundreds)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.zeros(8)

    def eager():  # one op at a time, as an eager decode launches its kernels
        y = x
        for _ in range(args.ops):
            y = y + 1

    stacked = torch.zeros(args.ops, 8)

    def one_call():  # the same arithmetic as one op, as a graph's replay is one launch
        stacked.add_(1)

    alone = min(on_worker(eager) for _ in range(args.repeats))
    rows = {"worker alone": alone}
    for every in (None, 10_000, 1_000, 100):
        label = "main thread runs Python" + (f", an op every {every} iterations" if every else " only")
        rows[label] = with_main_busy(eager, every, args.repeats)
    rows["as one call, main thread runs Python only"] = with_main_busy(one_call, None, args.repeats)
    default = sys.getswitchinterval()
    main_cost = {}
    for interval_ms in (5.0, 0.5, 0.2):
        sys.setswitchinterval(interval_ms / 1000)
        if interval_ms != 5.0:
            rows[f"main thread runs Python only, switch interval {interval_ms} ms"] = with_main_busy(eager, None, args.repeats)
        main_cost[f"{interval_ms} ms"] = round(main_python_beside_a_worker(args.repeats), 3)
    sys.setswitchinterval(default)
    result = {
        "benchmark": "worker_lock",
        "command": "python " + " ".join(sys.argv),
        "ops": args.ops,
        "switch_interval_s": sys.getswitchinterval(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "seconds": {k: round(v, 5) for k, v in rows.items()},
        "slowdown_vs_alone": {k: round(v / alone, 1) for k, v in rows.items()},
        # the main thread's fixed Python work beside a worker making ops, over the same work alone
        "main_python_slowdown_by_switch_interval": main_cost,
    }
    for label, seconds in rows.items():
        print(f"{label:70s} {1e3 * seconds:9.1f} ms  ({seconds / alone:7.1f}x alone)")
    print("the main thread's Python beside a worker making ops, by switch interval:", main_cost)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
