"""How long a guided engine takes to start, and how many graphs torch compiles for it, with
speechctl's CUDA-only per-step paths run on the CPU (``tests/cuda_stand_in.py``: per-step graphs,
vLLM's batch buckets, the general sampling path). Torch's compile count does not depend on the
device, so this finds what a GPU start-up compiles without one; the seconds are the CPU's.

    rm -rf /tmp/ind && TORCHINDUCTOR_CACHE_DIR=/tmp/ind SPEECHCTL_COMPILE=1 \\
        python benchmarks/standin_startup.py --family dia --out startup.json

Run each tree with an empty inductor cache (as above) to compare start-ups.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(family: str) -> dict:
    """Start the tiny ``family`` guided engine of ``speechctl.bench.guided``, run one pair of 8
    frames, and say what the start-up took (the CUDA paths must be stood in already)."""
    import torch._dynamo

    from speechctl.bench.guided import run_guided_bench

    graphs = torch._dynamo.utils.counters["stats"]
    before = graphs["unique_graphs"]
    started = time.perf_counter()
    result = run_guided_bench(family, "tiny", concurrencies=(1,), frames=8, repeats=1, transformers_too=False,
                              log=lambda row: None)
    return {"family": family, "startup_s": result["startup_s"], "start_up_graphs_s": result["start_up_graphs_s"],
            "warm_up_s": result["warm_up_s"], "compiled_graphs": graphs["unique_graphs"] - before,
            "total_s": round(time.perf_counter() - started, 1)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="dia", choices=["dia", "musicgen"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    from cuda_stand_in import stand_in

    stand_in(setattr)
    from speechctl.bench.report import environment

    record = {"benchmark": "standin_startup", "command": " ".join(["python", "benchmarks/standin_startup.py",
                                                                  *(argv if argv is not None else sys.argv[1:])]),
              "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""),
              **measure(args.family), "environment": environment()}  # per_step_work_compiled: SPEECHCTL_COMPILE
    print(json.dumps(record))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
