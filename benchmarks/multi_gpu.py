"""One GPU vs tensor parallelism vs data parallelism on the same fixed-length TTS workload.

    python benchmarks/multi_gpu.py --shape higgs-3b --concurrency 64 --frames 256 --out out/multi-gpu.json

Modes (``--modes``, comma-separated): ``one`` = one engine on one GPU, ``tp2`` = one engine
sharded over two GPUs, ``dp2`` = two engines on a GPU each, whole requests split round robin
(``speechctl.engine.data_parallel``). Every mode runs its engines in replica processes and is
timed from this launcher, so all three carry the same process overhead. The workload is
``speechctl bench``'s: random weights of the shape, every request exactly ``--frames`` audio frames
(``speechctl.bench.cfg.ShapeEngine``), all requests submitted at once. The JSON is rewritten after
every mode, so a timeout keeps what ran.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from dataclasses import dataclass

MODES = {"one": (1, 1), "tp2": (1, 2), "dp2": (2, 1)}  # name: (data parallel, tensor parallel)


@dataclass
class Request:
    id: int  # the workload index: text and seed of the request


@dataclass
class Done:
    id: int
    frames: int
    error: str | None


class ShapeReplica:
    """One replica: a bench-shape engine; ``run`` submits its share of requests at once."""

    def __init__(self, shape: str, frames: int, max_num_seqs: int, tensor_parallel_size: int):
        from speechctl.bench.cfg import ShapeEngine

        self.frames = frames
        self.bench = ShapeEngine(shape, max_num_seqs=max_num_seqs, frames=frames, overrides={"tensor_parallel_size": tensor_parallel_size})
        self.bench.__enter__()

    def run(self, jobs):
        from speechctl.bench.cfg import AUDIO_SAMPLING, WORKLOAD_TEXT

        prompts, frames = self.bench.prompts, self.frames
        reqs = [
            prompts.tts(WORKLOAD_TEXT.format(i=job.id), audio_sampling=AUDIO_SAMPLING, seed=job.id, max_frames=frames, min_frames=frames, tag=job)
            for job in jobs
        ]
        for out in self.bench.engine.generate(reqs):
            made = 0 if out.error else prompts.audio_segments(out, starts_in_audio=True)[0].shape[1]
            yield Done(out.tag.id, made, out.error)

    def close(self):
        self.bench.__exit__(None, None, None)


def measure(mode: str, shape: str, concurrency: int, frames: int, repeats: int, log) -> dict:
    from speechctl.engine.data_parallel import ReplicaPool

    dp, tp = MODES[mode]
    started = time.perf_counter()
    factory = functools.partial(ShapeReplica, shape, frames, concurrency, tp)
    pool = ReplicaPool(factory, dp, tensor_parallel_size=tp)
    startup = time.perf_counter() - started
    try:
        def timed() -> float:
            start = time.perf_counter()
            done = list(pool.run(Request(i) for i in range(concurrency)))
            elapsed = time.perf_counter() - start
            bad = [d for d in done if d.error or d.frames != frames]
            if len(done) != concurrency or bad:
                raise RuntimeError(f"{mode}: {len(bad)} request(s) without {frames} frames: {bad[:2]}")
            return elapsed

        timed()  # warm-up at this batch size (graph capture, caches)
        wall = statistics.median(timed() for _ in range(repeats))
    finally:
        pool.close()
    row = {"mode": mode, "gpus": dp * tp, "data_parallel": dp, "tensor_parallel": tp, "concurrency": concurrency,
           "frames": frames, "seconds": round(wall, 3), "frames_per_s": round(concurrency * frames / wall, 1),
           "startup_s": round(startup, 1)}
    log(f"{mode:4s} dp={dp} tp={tp} c={concurrency}: {row['frames_per_s']} frames/s ({wall:.2f} s; start {startup:.0f} s)")
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="higgs-3b")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default="one,tp2,dp2")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from speechctl.bench.report import environment
    from speechctl.bench.shapes import describe

    result = {"benchmark": "multi_gpu", "model": describe(args.shape), "repeats": args.repeats, "environment": environment(), "results": []}
    for mode in args.modes.split(","):
        result["results"].append(measure(mode, args.shape, args.concurrency, args.frames, args.repeats, print))
        base = next((r["frames_per_s"] for r in result["results"] if r["mode"] == "one"), None)
        for row in result["results"]:
            if base:
                row["speedup_vs_one"] = round(row["frames_per_s"] / base, 2)
        if args.out:
            from speechctl.audio import write_json_atomic

            write_json_atomic(args.out, result)
    print(json.dumps(result["results"], indent=2))


if __name__ == "__main__":
    main()
