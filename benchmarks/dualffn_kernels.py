"""Higgs Audio v2's DualFFN, the MLP kernels alone: what one layer's MLP costs per call at M tokens.

    python benchmarks/dualffn_kernels.py --tokens 1,16,64,256,1024 --out dualffn-kernels.json

Issue 21, item 2: with vLLM's fused MoE kernel the real Higgs 3B ran 296.7 frames/s at c = 1
(+25 % on both MLPs) but no better at c = 64, against a generic backbone of its size at 1.0 /
1.3-1.5x. This times, on Higgs 3B's shape (hidden 3072, intermediate 8192, bfloat16) and as the
decode step runs them (each captured in a CUDA graph and replayed), per call:

* ``one_mlp``: one dense SiLU MLP (gate/up GEMM, SiLU x up, down GEMM), the floor: every token of
  a decode step is audio and needs the audio MLP alone;
* ``both_mlps``: both dense MLPs and ``where`` (the DualFFN without vLLM's MoE kernels);
* ``fused_audio``: vLLM's fused MoE kernel, two experts, top-1, every token routed to the audio
  expert (a decode step, ``DualMLP``);
* ``fused_mixed``: the same with half the tokens text (a prefill's mix).

Each row gives microseconds per call and its ratio to ``one_mlp`` at the same M; the fused rows
also the largest difference from the dense audio MLP's output (the same weights). The fused rows
need CUDA and vLLM's MoE kernels; elsewhere they are recorded as skipped (the CPU runs the dense
rows at any shape, for the test).

vLLM ships no tuned tile sizes for two experts of this shape, so ``fused_audio`` runs its default
heuristic. ``--tune SECONDS`` also times ``fused_audio`` at each M under a set of candidate tile
sizes (``tile_candidates``, as vLLM's own tuner sweeps them, smaller) for at most that long, adds
a ``fused_audio_tuned`` row with the fastest, and writes them as the config file vLLM reads
(``--tuned-out``: token count -> tiles, under the name vLLM looks for on this GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="1,16,64,256,1024", help="tokens per call, comma-separated")
    p.add_argument("--hidden", type=int, default=3072)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--iters", type=int, default=200, help="calls per timing (graph replays)")
    p.add_argument("--repeats", type=int, default=5, help="timings per row (the median is reported)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tune", type=float, default=0.0, help="seconds at most for tuning the fused kernel's tiles (0: none)")
    p.add_argument("--tuned-out", default=None, help="folder for the tuned config file (default: beside --out)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.tokens = [int(t) for t in str(args.tokens).split(",") if t]
    return args


def command(args) -> str:
    return " ".join(["python", "benchmarks/dualffn_kernels.py", "--tokens", ",".join(map(str, args.tokens)),
                     "--hidden", str(args.hidden), "--intermediate", str(args.intermediate), "--iters", str(args.iters),
                     "--repeats", str(args.repeats), "--device", args.device]
                    + (["--tune", f"{args.tune:g}"] if args.tune else [])
                    + (["--tuned-out", args.tuned_out] if args.tuned_out else []) + ["--out", args.out])


def mlp(x, w13, w2):
    """One SiLU MLP: ``w13`` [2I, H] (gate; up), ``w2`` [H, I]."""
    gate, up = F.linear(x, w13).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w2)


def fused_missing(device: torch.device) -> str | None:
    """Why vLLM's fused MoE kernel cannot run here (None: it can)."""
    if device.type != "cuda":
        return "vLLM's fused MoE kernel runs on CUDA only"
    try:
        from speechctl.engine import vllm_compat

        if not vllm_compat.grouped_mlp_available():
            return "vLLM's MoE kernel library is not installed (benchmarks/gpu_moe.sh)"
    except ImportError as e:
        return f"vLLM is not importable: {e}"
    return None


def variants(w13, w2, is_audio) -> dict:
    """name -> the call on ``x`` [M, H], or why it cannot run here."""
    out = {"one_mlp": lambda x: mlp(x, w13[1], w2[1]),
           "both_mlps": lambda x: torch.where(is_audio, mlp(x, w13[1], w2[1]), mlp(x, w13[0], w2[0]))}
    missing = fused_missing(w13.device)
    if missing is not None:
        return {**out, "fused_audio": missing, "fused_mixed": missing}
    from speechctl.engine import vllm_compat

    audio_ids, mixed_ids = torch.ones_like(is_audio, dtype=torch.int32), is_audio.to(torch.int32)
    return {**out, "fused_audio": lambda x: vllm_compat.grouped_mlp(x, w13, w2, audio_ids),
            "fused_mixed": lambda x: vllm_compat.grouped_mlp(x, w13, w2, mixed_ids)}


def tile_candidates(tokens: int, default: dict | None = None) -> list[dict]:
    """The Triton tiles tried for ``tokens`` rows: M tiles no taller than the rows need (a decode
    step's few rows waste the rest), N/K tiles, warps and pipeline depths around vLLM's defaults
    for bfloat16; grouping only where an expert has many M tiles. With vLLM's own choice
    (``default``) they come nearest it first (the fewest settings changed), so a sweep cut short
    by its time has searched around the default, and the default itself is timed first."""
    tallest = max(16, 1 << max(0, tokens - 1).bit_length())
    out = [{"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": gm, "SPLIT_K": 1,
            "num_warps": warps, "num_stages": stages}
           for bm in (16, 32, 64, 128) if bm <= tallest
           for bn in (64, 128, 256) for bk in (64, 128) if not (bm == 128 and bn == 256 and bk == 128)
           for gm in ((1, 16) if tokens >= 256 else (1,))
           for warps in (4, 8) for stages in (3, 4)]
    if default is not None:
        out.sort(key=lambda tiles: sum(tiles[k] != default.get(k) for k in tiles))
    return out


def tune(call, x, candidates: list[dict], deadline: float, iters: int, repeats: int) -> tuple[dict | None, float, int]:
    """The fastest of ``candidates`` for ``call`` on ``x`` (the tiles, microseconds, how many
    ran) before ``deadline`` (``time.monotonic``); tiles the GPU cannot hold are passed over."""
    from speechctl.engine import vllm_compat

    best, best_us, tried = None, float("inf"), 0
    for tiles in candidates:
        if time.monotonic() > deadline:
            break
        try:
            with vllm_compat.grouped_mlp_config(tiles):
                us = timed(call, x, iters, repeats)
        except Exception as e:  # Triton's OutOfResources (shared memory), and kin
            print(f"tiles {tiles}: {type(e).__name__}", file=sys.stderr)
            continue
        tried += 1
        if us < best_us:
            best, best_us = tiles, us
    return best, best_us, tried


def timed(call, x, iters: int, repeats: int) -> float:
    """Microseconds per call: on CUDA replays of a graph of ``iters`` calls, on the CPU a loop."""
    if x.device.type != "cuda":
        call(x)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(iters):
                call(x)
            times.append((time.perf_counter() - t) / iters)
        return 1e6 * statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture (kernel autotuning, JIT)
        for _ in range(3):
            call(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            call(x)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / iters)
    return statistics.median(times)


def main(argv=None) -> dict:
    args = parse(sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    H, I = args.hidden, args.intermediate
    g = torch.Generator(device="cpu").manual_seed(0)
    w13 = (torch.randn(2, 2 * I, H, generator=g) * H**-0.5).to(device, dtype)
    w2 = (torch.randn(2, H, I, generator=g) * I**-0.5).to(device, dtype)
    record = {"command": command(args), "shape": {"hidden": H, "intermediate": I, "dtype": str(dtype).split(".")[-1]},
              "environment": {"torch": torch.__version__, "device": torch.cuda.get_device_name(device)
                              if device.type == "cuda" else "cpu"}, "rows": [], "skipped": {}}
    tuned, deadline = {}, time.monotonic() + args.tune
    for M in args.tokens:
        x = torch.randn(M, H, generator=g).to(device, dtype)
        is_audio = (torch.arange(M) % 2 == 0)[:, None].to(device)
        reference = mlp(x, w13[1], w2[1]).float()
        floor = None
        with torch.no_grad():
            for name, call in variants(w13, w2, is_audio).items():
                if isinstance(call, str):
                    record["skipped"][name] = call
                    continue
                us = timed(call, x, args.iters, args.repeats)
                floor = us if name == "one_mlp" else floor
                row = {"variant": name, "tokens": M, "us_per_call": round(us, 2), "vs_one_mlp": round(us / floor, 3)}
                if name == "fused_audio":  # the same weights and tokens as one_mlp's
                    row["max_abs_diff"] = float((call(x).float() - reference).abs().max())
                record["rows"].append(row)
                print(json.dumps(row), flush=True)
                if name == "fused_audio" and args.tune:
                    left = len(args.tokens) - args.tokens.index(M)  # the time left shared among the sizes still to tune
                    row = tuned_row(call, x, floor, args, time.monotonic() + (deadline - time.monotonic()) / left)
                    if row is not None:
                        tuned[M] = row["tiles"]
                        record["rows"].append(row)
                        print(json.dumps(row), flush=True)
    if tuned:
        record["tuned_config_file"] = write_tuned(tuned, args)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return record


def tuned_row(call, x, floor: float, args, deadline: float) -> dict | None:
    """``fused_audio`` at ``x``'s token count with the fastest tiles found before ``deadline``,
    searched from vLLM's own choice outwards: its row (None: no tile ran in time)."""
    from speechctl.engine import vllm_compat

    M = x.shape[0]
    default = vllm_compat.grouped_mlp_default_config(M, 2, args.intermediate, args.hidden)
    candidates = tile_candidates(M, default)
    tiles, best, tried = tune(call, x, candidates, deadline, args.iters, args.repeats)
    if tiles is None:
        return None
    return {"variant": "fused_audio_tuned", "tokens": M, "us_per_call": round(best, 2), "vs_one_mlp": round(best / floor, 3),
            "tiles": tiles, "tiles_tried": tried, "tiles_candidates": len(candidates), "default_tiles": default}


def write_tuned(tuned: dict, args) -> str:
    """The tuned tiles as vLLM reads them (token count -> tiles), under the name vLLM looks for."""
    from speechctl.engine import vllm_compat

    folder = Path(args.tuned_out or Path(args.out).parent)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / vllm_compat.grouped_mlp_config_file(2, args.intermediate)
    path.write_text(json.dumps({str(m): tiles for m, tiles in sorted(tuned.items())}, indent=1) + "\n")
    return str(path)


if __name__ == "__main__":
    main()
