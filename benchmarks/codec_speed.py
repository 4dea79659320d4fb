"""How fast a checkpoint's codec decodes a batch of whole requests on the GPU, by how it runs:
decode graphs or eager, float32 (cuDNN's TF32 convolutions) or bfloat16, with its Snake
activations as transformers runs them or compiled into one kernel each (``fuse_snakes``). A
question for the end-to-end rows: at 64 requests of 256 frames the Higgs tokenizer's decode was
~0.45 s after an LM run of ~1.1 s. Also the largest difference of each variant's waveforms from
the eager float32 ones (random weights: an indication, not a listening test), and the costliest
kernels of the eager float32 decode, unfused and fused.

    python benchmarks/family_checkpoint.py higgs_audio_v2 /tmp/higgs-3b
    python benchmarks/codec_speed.py /tmp/higgs-3b --requests 64 --frames 256 --out codec-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch


def main() -> None:
    os.environ["SPEECHCTL_CODEC_COMPILE"] = "0"  # transformers' Snakes first; fused below
    from speechctl.codecs import load_codec
    from speechctl.codecs.base import fuse_snakes
    from speechctl.models.catalog import resolve_checkpoint

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--compile-decoder", action="store_true", help="also the whole acoustic decoder compiled (Higgs)")
    args = parser.parse_args()
    codec = load_codec(resolve_checkpoint(args.model).codec_dir, device="cuda")
    rng = np.random.default_rng(0)
    codes = [rng.integers(0, codec.codebook_size, (codec.num_codebooks, args.frames)) for _ in range(args.requests)]
    frames = args.requests * args.frames
    rows, waves = [], {}

    def timed(name: str) -> None:
        out = codec.decode(codes)  # (first: graphs recorded, kernels chosen)
        torch.cuda.synchronize()
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            codec.decode(codes)
            seconds.append(time.perf_counter() - start)
        waves[name] = np.stack(out)
        row = {"how": name, "seconds": [round(s, 4) for s in seconds], "frames_per_s": round(frames / min(seconds))}
        rows.append(row)
        print(row, flush=True)

    def profile() -> str:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            codec.decode(codes[: max(1, args.requests // 4)])
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=10)
        print(table)
        return table

    timed("float32, decode graphs")
    codec.decode_eagerly()
    timed("float32, eager")
    tables = {"float32, eager": profile()}
    started = time.perf_counter()
    fused = fuse_snakes(codec.model)
    timed("float32, eager, Snakes fused")
    compile_s = time.perf_counter() - started
    tables["float32, eager, Snakes fused"] = profile()
    codec.use_decode_graphs()
    timed("float32, decode graphs, Snakes fused")
    codec.decode_eagerly()
    if args.compile_decoder:  # the whole acoustic decoder (Higgs' tokenizer) compiled: every elementwise op fused
        started, decoder = time.perf_counter(), codec.model.acoustic_decoder
        codec.model.acoustic_decoder = torch.compile(decoder, dynamic=True)
        timed("float32, eager, decoder compiled")
        result_extra = {"first_compiled_decoder_decode_s": round(time.perf_counter() - started, 1)}
        tables["float32, eager, decoder compiled"] = profile()
        codec.use_decode_graphs()
        timed("float32, decode graphs, decoder compiled")
        codec.decode_eagerly()
        codec.model.acoustic_decoder = decoder  # (the bfloat16 row below: Snakes fused, the rest eager)
    else:
        result_extra = {}
    codec.model.to(torch.bfloat16)
    timed("bfloat16, eager, Snakes fused")
    ref = waves["float32, eager"]
    peak = float(np.abs(ref).max()) or 1.0
    result = {"model": args.model, "requests": args.requests, "frames": args.frames, "rows": rows,
              "snakes": fused, "first_fused_decode_s": round(compile_s, 1),  # its compile with 1 + repeats decodes
              "max_diff_of_peak": {k: float(np.abs(w - ref).max()) / peak for k, w in waves.items()},
              "profiles": tables, "device": torch.cuda.get_device_name(), **result_extra}
    print(result["max_diff_of_peak"], result["first_fused_decode_s"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
