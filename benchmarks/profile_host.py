"""Where the host's time goes in a decode step: cProfile over steady decode steps of the engine
loop, grouped by who owns the code (vLLM's scheduler, its output handling, its model runner,
speechctl, torch ops). Host Python is device-independent, so the CPU shows the split that the
H200's profile leaves unattributed (docs/benchmarks/cfg.md).

    python benchmarks/profile_host.py --concurrency 128 --cfg      # 128 pairs = 256 rows
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

from speechctl.bench.cfg import ShapeEngine
from speechctl.engine.params import Guidance

GROUPS = [  # (label, path fragment), first match wins
    ("speechctl: pair scheduler", "speechctl/engine/pairs.py"),
    ("speechctl: stream runtime", "speechctl/engine/runtime/"),
    ("speechctl: other", "speechctl/"),
    ("vLLM: scheduler + KV manager", "vllm/v1/core/"),
    ("vLLM: output processing", "vllm/v1/engine/"),
    ("vLLM: model runner", "vllm/v1/worker/"),
    ("vLLM: other", "vllm/"),
    ("torch ops and builtins", ""),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--cfg", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--top", type=int, default=0, help="also list speechctl's N costliest functions (own time)")
    args = ap.parse_args()
    guidance = Guidance(scale=3.0) if args.cfg else Guidance()
    with ShapeEngine(args.shape, max_num_seqs=2 * args.concurrency, frames=64) as bench:
        bench.timed(args.concurrency, guidance)  # warm-up
        engine = bench.engine
        for req in bench.workload(args.concurrency, guidance):
            engine.submit(req)
        for _ in range(5):  # admission and prefill
            engine.step()
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.enable()
        for _ in range(args.steps):
            engine.step()
        prof.disable()
        step_ms = (time.perf_counter() - start) / args.steps * 1e3
        while engine.step() or engine.scheduler_requests():
            pass
    stats = pstats.Stats(prof).stats
    totals = defaultdict(float)
    for (path, _, _), (_, _, tottime, _, _) in stats.items():
        label = next(label for label, frag in GROUPS if frag in path)
        totals[label] += tottime
    rows = 2 * args.concurrency if args.cfg else args.concurrency
    print(f"{'CFG' if args.cfg else 'no CFG'}, {args.concurrency} requests ({rows} rows), {args.shape}: "
          f"{step_ms:.1f} ms per step under cProfile")
    for label, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:32s} {seconds / args.steps * 1e3:7.2f} ms/step")
    ours = sorted(((tottime, calls, f"{path.split('speechctl/', 1)[-1]}:{line} {name}")
                   for (path, line, name), (calls, _, tottime, _, _) in stats.items() if "speechctl/" in path), reverse=True)
    for tottime, calls, where in ours[:args.top]:
        print(f"    {tottime / args.steps * 1e3:6.3f} ms/step  {calls / args.steps:7.1f} calls/step  {where}")


if __name__ == "__main__":
    main()
