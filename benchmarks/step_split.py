"""Steady decode step of plain vLLM beside speechctl on the same backbone: wall time per step
(steps back to back, as in a real run: async scheduling overlaps the host's next step with the
GPU's current one) and GPU busy time per step (torch profiler, kernel time summed). Where wall
exceeds GPU time, the step waits on the host.

    python3 benchmarks/step_split.py --system plain --shape higgs-3b --concurrency 64,256 --out $OUT
    python3 benchmarks/step_split.py --system speechctl --shape higgs-3b --concurrency 64,256 --out $OUT
    python3 benchmarks/step_split.py --system higgs --concurrency 64 --phases measure --kernels 40 --out $OUT

``--system higgs`` runs the real Higgs Audio v2 3B (DualFFN, vocab 128,256, random weights; the
families bench's checkpoint) on the same workload; ``--shape`` is then ignored. ``--kernels N``
adds each measured row's top N GPU kernels (summed time and launches per step): put beside
the generic shape's, they name what the real architecture's step spends more on (issue 21,
item 2's gap at c = 64).
One system per process (each engine gets the whole GPU); each writes step-<system>-<shape>.json.
``--timeline FRAMES`` also records every step of one whole fixed-length run, as the
throughput bench times it: admission and prefill, steady decode and the tail, step by step.
``--phases measure,admit --admit-tokens 300`` also times, beside the steady steps, the steps
that admit one prompt of ~300 tokens while the others decode (issue 21 item 6: under arrivals
these took 8-9x a decode step), each synced on both sides, with their top kernels:

    python3 benchmarks/step_split.py --system higgs --concurrency 64 --phases measure,admit --admit-tokens 300 --kernels 25 --out $OUT
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

from speechctl.bench.cfg import AUDIO_SAMPLING
from speechctl.bench.families import lengthened
from speechctl.bench.report import environment
from speechctl.bench.shapes import SHAPES
from speechctl.engine.engine import EngineConfig

PROMPT_LEN = 39
WARM, TIMED, PROFILED = 20, 40, 8
ADMISSIONS, ADMITTED_FRAMES = 12, 32  # the admit phase: prompts admitted untimed, then timed; each one's frames
PROFILE_STEPS = range(100, 140)  # a timeline's steady steps under --host-profile


def plain_engine(recipe, tmp: Path, max_seqs: int, overrides: dict, max_len: int = 512):
    """(step, submit(count)) for vLLM's own engine on a LlamaForCausalLM of the shape."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from speechctl.bench.plain import plain_llm, plain_vocab, write_plain_config

    vocab = plain_vocab(recipe)
    write_plain_config(tmp, recipe)
    engine = plain_llm(recipe, tmp, max_seqs, max_len, overrides).llm_engine
    # FINAL_ONLY as in LLM.generate (and speechctl): the default (cumulative) output kind would
    # build every request's output every step (the first H200 run measured that by mistake)
    def params(frames: int) -> SamplingParams:
        return SamplingParams(max_tokens=frames, ignore_eos=True, temperature=0.9, top_k=50, detokenize=False,
                              output_kind=RequestOutputKind.FINAL_ONLY)

    live: list[str] = []

    def submit(count: int, frames: int = 400, prompt_tokens: int = PROMPT_LEN) -> None:
        for i in range(count):
            prompt = TokensPrompt(prompt_token_ids=[(7 * (len(live) + i) + j) % vocab for j in range(prompt_tokens)])
            live.append(f"r{len(live)}-{time.monotonic_ns()}")
            engine.add_request(live[-1], prompt, params(frames))

    def drain() -> None:
        engine.abort_request(live)
        live.clear()
        while engine.has_unfinished_requests():
            engine.step()

    def run_all(host_profile=None) -> list[tuple[float, int]]:
        steps = run_steps(engine.step, engine.has_unfinished_requests, host_profile)
        live.clear()
        return steps

    return SimpleNamespace(step=engine.step, submit=submit, drain=drain, run_all=run_all)


def speechctl_engine(recipe, tmp: Path, max_seqs: int, overrides: dict, max_len: int = 512, real_higgs: bool = False):
    from speechctl.engine.engine import SpeechEngine
    from speechctl.models.generic.checkpoint import create_multistream_checkpoint

    if real_higgs:
        from speechctl.bench.families import FAMILIES

        path, dtype = FAMILIES["higgs_audio_v2"][0](tmp, "full")
        load_format = "dummy"
    else:
        path, dtype = create_multistream_checkpoint(tmp / "m", recipe), recipe.dtype
        load_format = "auto" if recipe.weights else "dummy"
    engine = SpeechEngine(path, EngineConfig(max_num_seqs=max_seqs, max_model_len=max_len, dtype=dtype,
                                             load_format=load_format, **overrides))
    prompts = engine.prompt_builder()
    tags = []

    def submit(count: int, frames: int = 400, prompt_tokens: int = 0) -> None:
        for _ in range(count):
            i = len(tags)
            tags.append(i)
            # (each text its own from the start: no prefix-cache hit shortens an admitted prompt)
            engine.submit(prompts.tts(lengthened(prompts, f"Sentence {i}.", prompt_tokens, at_end=True), audio_sampling=AUDIO_SAMPLING, seed=i,
                                      max_frames=frames, min_frames=frames, tag=i))

    def drain() -> None:
        engine.abort(list(tags))
        tags.clear()
        while engine.has_work() or engine.scheduler_requests():
            engine.step()

    def run_all(host_profile=None) -> list[tuple[float, int]]:
        steps = run_steps(engine.step, lambda: engine.has_work() or engine.scheduler_requests(), host_profile)
        tags.clear()
        return steps

    return SimpleNamespace(step=engine.step, submit=submit, drain=drain, run_all=run_all)


def run_steps(step, busy, host_profile=None) -> list[tuple[float, int]]:
    """Step until ``busy()`` is false: (wall ms, outputs) per step; ``host_profile`` (a
    cProfile.Profile) runs over the steady steps PROFILE_STEPS."""
    steps = []
    while busy():
        profiling = host_profile is not None and len(steps) in PROFILE_STEPS
        if profiling:
            host_profile.enable()
        start = time.perf_counter()
        outs = step()
        steps.append((round((time.perf_counter() - start) * 1e3, 3), len(outs)))
        if profiling:
            host_profile.disable()
    return steps


def timeline(submit, run_all, count: int, frames: int, host_profile=None) -> dict:
    """One whole fixed-length run, as the throughput bench times it: where its steps' time goes
    (admission and prefill, steady decode, the tail)."""
    submit(count, frames)
    run_all(host_profile)  # warm-up: this batch's graphs and caches (and the host profile, off the clock)
    submit(count, frames)
    steps = run_all()
    ms = [t for t, _ in steps]
    steady = sorted(ms[len(ms) // 4 : 3 * len(ms) // 4])
    first_done = next(i for i, (_, n) in enumerate(steps) if n)
    return {"concurrency": count, "frames": frames, "steps": len(ms), "total_ms": round(sum(ms), 1),
            "median_ms": steady[len(steady) // 2], "first_10_ms": round(sum(ms[:10]), 1),
            "from_first_output_ms": round(sum(ms[first_done:]), 1), "max_ms": max(ms), "step_ms": ms,
            "outputs_per_step": [n for _, n in steps]}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_ms_per_step(prof, steps: int) -> float:
    """The GPU's kernel time a step under ``prof`` (summed over every kernel)."""
    return sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA) / steps / 1e3


def print_row(name: str, row: dict) -> None:
    print(name, {k: v for k, v in row.items() if k != "kernels"}, flush=True)
    for k in row.get("kernels", [])[:15]:
        print(f"  {k['us_per_step']:8.1f} us {k['launches_per_step']:6.2f}x  {k['kernel'][:110]}", flush=True)


def top_kernels(prof, steps: int, n: int) -> list[dict]:
    """The ``n`` GPU kernels with the most summed time: µs and launches per step."""
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [{"kernel": e.key[:160], "us_per_step": round(e.self_device_time_total / steps, 1),
             "launches_per_step": round(e.count / steps, 2)} for e in kernels[:n]]


def measure(step, submit, drain, count: int, host_profile=None, kernels: int = 0) -> dict:
    submit(count)
    for _ in range(WARM):  # admission, prefill, warm decode
        step()
    sync()
    start = time.perf_counter()
    for _ in range(TIMED):
        step()
    sync()
    wall_ms = (time.perf_counter() - start) / TIMED * 1e3
    if host_profile is not None:  # after the clock: the same steps under cProfile
        host_profile.enable()
        for _ in range(TIMED):
            step()
        sync()
        host_profile.disable()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            step()
        sync()
    gpu_ms = gpu_ms_per_step(prof, PROFILED)
    drain()
    row = {"concurrency": count, "wall_ms_per_step": round(wall_ms, 3), "gpu_ms_per_step": round(gpu_ms, 3),
           "gpu_busy": round(gpu_ms / wall_ms, 3), "rows_per_s": round(count / wall_ms * 1e3, 1)}
    if kernels:
        row["kernels"] = top_kernels(prof, PROFILED, kernels)
    return row


def admit(step, submit, drain, count: int, prompt_tokens: int, kernels: int = 0, admissions: int = ADMISSIONS) -> dict:
    """Steps that admit one prompt of ``prompt_tokens`` beside ``count`` decoding requests, and
    the decode steps between them, each timed with the GPU synced before and after (so both
    include the host's whole step: a fair pair, not the pipelined rate of ``measure``); the
    last ``PROFILED`` admissions' kernels."""
    submit(count)
    for _ in range(WARM):
        step()
    admitting, decoding = [], []

    def timed(into: list) -> None:
        sync()
        start = time.perf_counter()
        step()
        sync()
        into.append((time.perf_counter() - start) * 1e3)

    for _ in range(admissions):  # untimed: the first admissions' shapes, caches
        submit(1, ADMITTED_FRAMES, prompt_tokens)
        step()
        step()
    for _ in range(admissions):
        timed(decoding)
        submit(1, ADMITTED_FRAMES, prompt_tokens)
        timed(admitting)
    row = {"concurrency": count, "prompt_tokens": prompt_tokens, "admissions": admissions,
           "admit_ms_p50": round(statistics.median(admitting), 3), "admit_ms_max": round(max(admitting), 3),
           "decode_ms_p50": round(statistics.median(decoding), 3)}
    if kernels:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILED):
                submit(1, ADMITTED_FRAMES, prompt_tokens)
                step()
                sync()
        row["admit_gpu_ms"] = round(gpu_ms_per_step(prof, PROFILED), 3)
        row["kernels"] = top_kernels(prof, PROFILED, kernels)
    drain()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", choices=["plain", "speechctl", "higgs"], required=True,
                    help="higgs: speechctl on the real Higgs Audio v2 3B (--shape ignored)")
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--out", default="out")
    ap.add_argument("--timeline", type=int, default=0, metavar="FRAMES",
                    help="also record every step of one whole run of FRAMES frames per request")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="vLLM's token budget per step (default: the offline LLM class's, 16,384 on an H200)")
    ap.add_argument("--phases", default="measure,timeline",
                    help="in this order: 'measure' (steady steps of every concurrency), 'timeline' (whole runs), "
                         "'admit' (steps that admit a prompt, --admit-tokens); "
                         "e.g. timeline,measure,timeline to see whether a process's steps change with its history")
    ap.add_argument("--admit-tokens", type=int, default=300, metavar="N",
                    help="admit: the admitted prompt's tokens (at least; speechctl builds a text that long)")
    ap.add_argument("--host-profile", action="store_true",
                    help="cProfile steady steps of each phase (after its clock) and write the top functions by own and by cumulative time")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="record each measured row's top N GPU kernels (time and launches per step)")
    args = ap.parse_args()
    if args.system == "higgs":
        args.shape = "higgs-3b"  # the backbone's size, for the file name; the checkpoint is the real architecture
    overrides = {} if args.max_num_batched_tokens is None else {"max_num_batched_tokens": args.max_num_batched_tokens}
    levels = [int(c) for c in args.concurrency.split(",")]
    make = {"plain": plain_engine, "speechctl": speechctl_engine,
            "higgs": partial(speechctl_engine, real_higgs=True)}[args.system]
    rows, timelines, admits, host_profiles = [], [], [], {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        admitting = "admit" in args.phases.split(",")
        # the admit phase's requests beside the decoding ones: room for them in the batch and context
        system = make(SHAPES[args.shape], Path(tmp), max(levels) + (2 * ADMISSIONS + PROFILED if admitting else 0), overrides,
                      max_len=512 + (args.admit_tokens if admitting else 0))
        for index, phase in enumerate(args.phases.split(",")):
            for count in levels:
                prof = host_profiles.setdefault(f"{index}-{phase}-c{count}", cProfile.Profile()) if args.host_profile else None
                if phase == "measure":
                    rows.append({"phase": index, **measure(system.step, system.submit, system.drain, count, prof, args.kernels)})
                    print_row(args.system, rows[-1])
                elif phase == "admit":
                    admits.append({"phase": index, **admit(system.step, system.submit, system.drain, count, args.admit_tokens, args.kernels)})
                    print_row("admit", admits[-1])
                elif args.timeline and system.run_all is not None:
                    timelines.append({"phase": index, **timeline(system.submit, system.run_all, count, args.timeline, prof)})
                    print("timeline", {k: v for k, v in timelines[-1].items() if not k.endswith("per_step") and k != "step_ms"}, flush=True)
    for key, prof in host_profiles.items():
        text = io.StringIO()
        # own time finds the hot spots; cumulative time shows which phase of the step holds them
        # (the top 40 by own time alone left the twenty-first session guessing)
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(50)
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(120)
        (out / f"host-{args.system}-{key}.txt").write_text(text.getvalue())
    name = f"step-{args.system}-{args.shape}" + (f"-tokens{args.max_num_batched_tokens}" if overrides else "")
    (out / f"{name}.json").write_text(json.dumps({"system": args.system, "shape": args.shape, "engine_overrides": overrides,
                                                 "environment": environment(speechctl=args.system != "plain"), "rows": rows, "timelines": timelines, "admits": admits}, indent=1))


if __name__ == "__main__":
    main()
