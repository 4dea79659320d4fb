"""Where a decode step's time goes: torch profiler over steps of a running batch.

    python3 benchmarks/profile_step.py --shape higgs-3b --concurrency 1,256 --out $OUT

For each (mode, concurrency): fill the engine with fixed-length TTS requests, run warm-up steps,
then profile 8 steps; print the mean step time and the top ops by CPU and by CUDA time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from speechctl.bench.shapes import SHAPES
from speechctl.engine.engine import EngineConfig, SpeechEngine
from speechctl.engine.params import Guidance
from speechctl.bench.cfg import AUDIO_SAMPLING
from speechctl.models.generic.prompts import MultiStreamPrompts
from speechctl.models.generic.checkpoint import create_multistream_checkpoint


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    recipe = SHAPES[args.shape]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = create_multistream_checkpoint(Path(tmp) / "m", recipe)
        engine = SpeechEngine(path, EngineConfig(
            max_num_seqs=2 * max(levels), max_model_len=512, dtype=recipe.dtype,
            load_format="auto" if recipe.weights else "dummy"))
        prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
        report = []
        for count in levels:
            for mode in ("plain", "cfg"):
                g = Guidance(scale=3.0) if mode == "cfg" else Guidance()
                for i in range(count):
                    engine.submit(prompts.tts(f"Sentence {i}.", audio_sampling=AUDIO_SAMPLING, seed=i,
                                              max_frames=200, min_frames=200, guidance=g))
                for _ in range(20):  # admission, prefill, warm decode
                    engine.step()
                times = []
                for _ in range(10):
                    torch.cuda.synchronize() if torch.cuda.is_available() else None
                    t = time.perf_counter(); engine.step(); times.append(time.perf_counter() - t)
                acts = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                with torch.profiler.profile(activities=acts) as prof:
                    for _ in range(8):
                        engine.step()
                step_ms = 1000 * statistics.median(times)
                head = f"== {mode} c={count}: median step {step_ms:.2f} ms ({count / step_ms * 1000:.0f} frames/s)"
                cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
                gpu = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25) if len(acts) > 1 else ""
                print(head, flush=True)
                (out / f"profile-{mode}-c{count}.txt").write_text(head + "\n" + cpu + "\n" + gpu)
                report.append(head)
                while engine.has_work():
                    engine.step()
        print("\n".join(report))


if __name__ == "__main__":
    main()
