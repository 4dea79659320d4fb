"""Where a CSM frame's depth-decoder time goes, the module alone (no engine, no backbone).

    python3 benchmarks/profile_csm_depth.py --rows 1,64 --out $OUT          # on the H200
    python3 benchmarks/profile_csm_depth.py --recipe tiny --rows 1,4         # CPU smoke run

One frame = codebooks 1..K-1 of every row: 31 depth steps (4 layers, 1024 wide for CSM 1B) and 31
codebook samplings (the bench's audio settings: temperature 0.9, top-k 50), exactly the code the
engine runs in ``compute_logits`` (``CsmDepthDecoder.decode_frame`` with ``frame_sampler``).
For each row count it times the frame
  * eager (one Python call per kernel),
  * replayed from a CUDA graph (how the engine runs it: inside vLLM's per-step logits graph),
  * with ``SPEECHCTL_COMPILE=1`` (the depth step compiled by inductor), replayed from a graph,
and, from torch profiler traces of eager frames, counts the kernels per frame, their summed GPU
time and the top kernels by time; it also times the ways to select a codebook's top-50 candidates.
The weights' bytes read per frame over the H200's 4.8 TB/s give the memory-bound floor: a frame replayed from a graph well above both the floor and the summed kernel
time is bound by the number of kernels (each a few microseconds, even inside a graph).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from speechctl.bench.report import environment
from speechctl.engine import vllm_compat
from speechctl.engine.runtime.sampling import frame_sampler
from speechctl.models.csm.checkpoint import CSM_1B, CsmRecipe, csm_config

HBM_BYTES_PER_S = 4.8e12  # H200


def build(recipe: CsmRecipe, device: str, compiled: bool):
    from speechctl.models.csm.depth import CsmDepthDecoder

    config = csm_config(recipe).depth_decoder_config
    os.environ["SPEECHCTL_COMPILE"] = "1" if compiled else "0"  # read when the decoder is built
    dtype = getattr(torch, recipe.dtype)
    with vllm_compat.layers_outside_an_engine(), torch.device(device):
        decoder = CsmDepthDecoder(config, nn.Embedding(config.num_codebooks * config.vocab_size,
                                                       config.backbone_hidden_size))
    decoder = decoder.to(dtype)
    with torch.no_grad():
        for p in decoder.parameters():
            p.normal_(0, 0.02)
    return decoder.eval(), config


def frame_fn(decoder, config, rows: int, device: str):
    """The frame as a function of persistent inputs (so a CUDA graph can replay it)."""
    dtype = decoder.codebooks_head.weight.dtype
    hidden = torch.randn(rows, config.backbone_hidden_size, device=device, dtype=dtype)
    first = torch.randint(0, config.vocab_size, (rows,), device=device)
    temperature = torch.full((rows,), 0.9, device=device)
    top_k = torch.full((rows,), 50, device=device, dtype=torch.int64)
    top_p = torch.ones(rows, device=device)
    seed = torch.arange(rows, device=device, dtype=torch.int64)
    step = torch.zeros(rows, device=device, dtype=torch.int64)
    streams = range(1, config.num_codebooks)

    def frame():
        # as the engine samples these settings: one topk of 50 candidates, no nucleus step (top-p
        # off), no greedy pick (every row samples)
        sample = frame_sampler(temperature, top_k, top_p, seed, step, streams, all_random=True, max_top_k=50,
                               any_top_p=False)
        return decoder.decode_frame(hidden, first, sample)

    return frame


def timed(fn, n: int, cuda: bool) -> float:
    """Median ms of ``n`` calls, each synchronised."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graphed(frame):
    """``frame`` captured in a CUDA graph after a warm-up on a side stream, as vLLM captures."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            frame()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        frame()
    return graph.replay


def kernels(fn, frames: int, cuda: bool) -> dict:
    """Device kernels per frame of ``fn`` (eager) from a profiler trace: count, summed time, top."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(frames):
            fn()
        if cuda:
            torch.cuda.synchronize()
    names, times = Counter(), Counter()
    for event in prof.events():
        on_device = event.device_type == torch.autograd.DeviceType.CUDA if cuda else event.cpu_parent is None
        if on_device and not getattr(event, "is_user_annotation", False):  # record_function ranges show on the device too
            names[event.name] += 1
            times[event.name] += event.device_time_total if cuda else event.cpu_time_total
    top = [{"name": n[:90], "per_frame": names[n] / frames, "us_per_frame": round(times[n] / frames, 1)}
           for n, _ in times.most_common(12)]
    return {"per_frame": sum(names.values()) / frames, "us_per_frame": round(sum(times.values()) / frames, 1),
            "what": "CUDA kernels" if cuda else "top-level CPU ops", "top": top}


def selections(rows: int, vocab: int, k: int, device: str, cuda: bool, n: int = 200) -> dict:
    """Microseconds per call of the ways to find a codebook's top-k candidates (the sampler's
    largest single kernel at one row): ``topk`` (what it uses), a full sort, ``kthvalue``."""
    x = torch.randn(rows, 1, vocab, device=device)
    ways = {"topk": lambda: x.topk(k, dim=-1), "sort": lambda: x.sort(dim=-1, descending=True),
            "kthvalue": lambda: x.kthvalue(vocab - k + 1, dim=-1)}
    out = {}
    for name, fn in ways.items():
        fn()
        out[name] = round(timed(lambda: [fn() for _ in range(n)], 3, cuda) * 1e3 / n, 2)
    return out


def weight_bytes_per_frame(decoder, config) -> int:
    """Bytes of weights a frame reads: every layer and the projector per depth step, one
    codebook head per step (the embedding rows read are negligible)."""
    steps = config.num_codebooks - 1
    model = decoder.model
    per_step = sum(p.numel() * p.element_size() for p in model.layers.parameters())
    per_step += model.inputs_embeds_projector.weight.numel() * model.inputs_embeds_projector.weight.element_size()
    head = decoder.codebooks_head.weight
    per_step += head[0].numel() * head.element_size()
    return steps * per_step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", choices=["csm-1b", "tiny"], default="csm-1b")
    ap.add_argument("--rows", default="1,64")
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--modes", default="eager,graph,compiled")
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    recipe = CSM_1B if args.recipe == "csm-1b" else CsmRecipe()
    modes = args.modes.split(",")
    if not cuda:
        modes = [m for m in modes if m == "eager"]  # graphs need CUDA
    result = {"command": "python3 benchmarks/profile_csm_depth.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items()), "environment": environment(), "recipe": args.recipe, "rows": {}}
    decoders = {}
    with torch.no_grad():
        for rows in (int(r) for r in args.rows.split(",")):
            row = result["rows"][str(rows)] = {}
            for mode in modes:
                compiled = mode == "compiled"
                if compiled not in decoders:
                    decoders[compiled] = build(recipe, device, compiled)
                decoder, config = decoders[compiled]
                frame = frame_fn(decoder, config, rows, device)
                frame()  # compiles on first use
                fn = graphed(frame) if mode != "eager" else frame
                ms = timed(fn, args.frames, cuda)
                row[mode] = {"ms_per_frame": round(ms, 3), "ms_per_depth_step": round(ms / (config.num_codebooks - 1), 4)}
                if mode in ("eager", "compiled"):
                    # eager calls show every kernel; so does the compiled step called eagerly
                    row[mode]["kernels"] = kernels(frame, 3, cuda)
                print(f"rows={rows} {mode}: {ms:.3f} ms/frame", flush=True)
            k = min(50, config.vocab_size)
            row["candidate_selection_us"] = selections(rows, config.vocab_size, k, device, cuda)
            print(f"rows={rows} top-{k} of {config.vocab_size}, us per call: {row['candidate_selection_us']}", flush=True)
            floor = weight_bytes_per_frame(decoder, config) / HBM_BYTES_PER_S * 1e3
            row["weights_floor_ms"] = round(floor, 3)
            print(f"rows={rows} weights' bytes at 4.8 TB/s: {floor:.3f} ms/frame", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"profile-csm-depth-{args.recipe}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(path)


if __name__ == "__main__":
    main()
