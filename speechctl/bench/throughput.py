"""Throughput of speechctl on a bench shape, beside plain vLLM on the same backbone, in one run.

Per concurrency *c* (requests submitted at once, each making exactly ``frames`` audio frames):

* plain vLLM: tokens/s of a ``LlamaForCausalLM`` with the same backbone, decoding as many tokens
  per request as speechctl runs steps (``speechctl.bench.plain``, in its own processes first, so
  each engine has the whole device; the fastest of ``plain_runs`` processes per concurrency);
* speechctl: in this process after them, or (``speechctl_runs``) in processes of its own
  alternating with plain vLLM's, the fastest kept likewise; frames/s, audio-s/s (the
  checkpoint's codec frame rate), per-request RTF (time from submission to the request's
  output ÷ its audio duration); with the per-step CUDA graphs
  (``engine/runtime/graphs.py``) and, for comparison, with them off (eager per-step work);
* the multi-stream overhead ratio: speechctl frames/s ÷ plain tokens/s (issue goal ≥ 0.85).

And the codec: decoding ``codec_requests`` requests of ``frames`` frames (and of one streaming
window each: a first chunk with the decoder's context) in one batched call vs
one call per request (a DAC of transformers' default size: decoder 1536 channels, 9 codebooks,
hop 512; random weights).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from speechctl.bench.cfg import WORKLOAD_TEXT, ShapeEngine
from speechctl.bench.report import environment, plot_rates_and_ratio
from speechctl.bench.shapes import SHAPES, describe
from speechctl.errors import EngineError


def run_throughput_bench(
    shape: str = "tiny",
    concurrencies=(1, 4),
    frames: int = 64,
    repeats: int = 3,
    *,
    plain_runs: int = 2,
    speechctl_runs: int = 0,
    eager_too: bool = True,
    codec_requests: int = 64,
    codec_config: dict | None = None,
    engine_overrides: dict | None = None,
    log=print,
) -> dict:
    """``speechctl_runs`` 0: speechctl in this process, after the plain processes. N >= 1: speechctl
    in N processes of its own too, alternating with the plain ones (plain 1, speechctl 1, plain 2,
    ...), the fastest of each system kept per concurrency: both systems measured the same way, so
    a slow host in one process (they differ by up to ~2x on a lent machine) flatters neither."""
    # Plain vLLM in processes of its own (an in-process engine does not give all its device
    # memory back when it shuts down), plain_runs of them with the fastest kept per concurrency:
    # whole processes on a lent GPU machine have run host-bound steps ~1.7x slower than others
    # (docs/benchmarks/throughput.md), so one slow baseline process would flatter the ratio.
    steps, prompt_len = _workload_shape(shape, frames)
    bases, ours = [], []
    for run in range(max(plain_runs, speechctl_runs)):  # each logged as it ends: a run cut off by a time limit says how far it got
        if run < plain_runs:
            started = time.perf_counter()
            bases.append(_plain_run(shape, concurrencies, steps, prompt_len, repeats, engine_overrides))
            log(f"plain vLLM process {run + 1}/{plain_runs} ({time.perf_counter() - started:.0f} s with its start-up): "
                + ", ".join(f"c={row['concurrency']} {row['tokens_per_s']} tokens/s" for row in bases[-1]["rows"]))
        if run < speechctl_runs:
            started = time.perf_counter()
            ours.append(_speechctl_process(shape, concurrencies, frames, repeats, eager_too, engine_overrides))
            log(f"speechctl process {run + 1}/{speechctl_runs} ({time.perf_counter() - started:.0f} s with its start-up): "
                + ", ".join(f"c={row['concurrency']} {_main_rate(row)} frames/s" for row in ours[-1]["rows"]))
    if not speechctl_runs:
        ours.append(measure_speechctl(shape, concurrencies, frames, repeats, eager_too, engine_overrides, log))
    if (ours[0]["steps_per_request"], ours[0]["prompt_tokens"]) != (steps, prompt_len):
        raise EngineError("plain baseline and speechctl workloads differ")
    rows = [_fastest([run["rows"][i] for run in ours]) for i in range(len(concurrencies))]
    if bases:
        for i, row in enumerate(rows):
            runs = [base["rows"][i]["tokens_per_s"] for base in bases]
            row["plain_vllm_tokens_per_s"], row["plain_vllm_runs"] = max(runs), runs
            row["overhead_ratio"] = round(_main_rate(row) / max(runs), 3)
            log(f"c={row['concurrency']:4d} plain vLLM {max(runs)} tokens/s (runs {runs})  ratio {row['overhead_ratio']}")
    codec = _codec_bench(codec_requests, frames, codec_config, repeats) if codec_requests else None
    if codec:
        log(f"codec: batched {codec['batched_s']} s, one by one {codec['one_by_one_s']} s, speed-up {codec['speedup']}; "
            f"{codec['window_frames']}-frame streaming windows: speed-up {codec['window_speedup']}")
    return {
        "benchmark": "throughput",
        "model": {**describe(shape), "frame_rate": ours[0]["frame_rate"]},
        "frames_per_request": frames,
        "steps_per_request": steps,
        "prompt_tokens": prompt_len,
        "repeats": repeats,
        "speechctl_processes": speechctl_runs,  # 0: measured in the bench's own process
        "engine_startup_s": ours[0]["engine_startup_s"],
        "engine_warm_up_s": ours[0]["engine_warm_up_s"],  # of which compiling the per-step work
        "environment": ours[0]["environment"],
        "speechctl_environments": [run["environment"] for run in ours] if speechctl_runs else [],
        "plain_environments": [base["environment"] for base in bases],
        "results": rows,
        "codec": codec,
    }


def measure_speechctl(shape, concurrencies, frames, repeats, eager_too=True, engine_overrides=None, log=print) -> dict:
    """speechctl's rows on one engine in this process: per concurrency, frames/s, audio-s/s and
    the median RTF with the per-step graphs (and, ``eager_too``, without them)."""
    with ShapeEngine(shape, max_num_seqs=max(concurrencies), frames=frames, overrides=engine_overrides) as bench:
        log(f"speechctl engine started in {bench.startup_s} s (compiling the per-step work: {bench.warm_up_s} s)")
        frame_rate = _frame_rate(bench.path)
        graphs = bench.engine.set_step_graphs(True)
        rows = []
        for count in concurrencies:
            row = {"concurrency": count, "frames": frames}
            modes = [("graphs" if graphs else "eager", True)] + ([("eager", False)] if graphs and eager_too else [])
            for mode, on in modes:
                bench.engine.set_step_graphs(on)
                bench.timed(count)  # warm-up at this batch size (graph capture, caches)
                captured = bench.engine.stats()["graph_captures"]
                latencies = []
                walls = [bench.timed(count, latencies=latencies) for _ in range(repeats)]
                # per-step graphs are recorded lazily per batch-size bucket: any recorded inside
                # the timed runs (a batch size the warm-up did not meet) cost time there
                if on:
                    row["graph_captures_timed"] = bench.engine.stats()["graph_captures"] - captured
                wall = statistics.median(walls)
                row[f"{mode}_frames_per_s"] = round(count * frames / wall, 1)
                row[f"{mode}_audio_s_per_s"] = round(count * frames / wall / frame_rate, 1)
                row[f"{mode}_rtf_median"] = round(statistics.median(latencies) / (frames / frame_rate), 4)
            bench.engine.set_step_graphs(graphs)
            if graphs and eager_too:
                row["graphs_speedup"] = round(row["graphs_frames_per_s"] / row["eager_frames_per_s"], 2)
            log(f"c={count:4d} " + "  ".join(f"{k}={v}" for k, v in row.items() if k.endswith(("frames_per_s", "speedup"))))
            rows.append(row)
        return {"rows": rows, "frame_rate": frame_rate, "engine_startup_s": bench.startup_s,
                "engine_warm_up_s": bench.warm_up_s, "steps_per_request": bench.engine.spec.pattern.num_steps(frames),
                "prompt_tokens": len(bench.workload(1)[0].prompt_ids), "environment": environment()}


def _main_rate(row: dict) -> float:
    """A row's frames/s with the per-step graphs where they ran, else eager."""
    return row.get("graphs_frames_per_s", row.get("eager_frames_per_s"))


def _fastest(rows: list[dict]) -> dict:
    """One concurrency's row from the fastest process, with every process's rate beside it."""
    best = dict(max(rows, key=_main_rate))
    if len(rows) > 1:
        best["speechctl_runs"] = [_main_rate(row) for row in rows]
    return best


def _workload_shape(shape: str, frames: int) -> tuple[int, int]:
    """(decode steps per request, prompt tokens) of the bench workload, without an engine."""
    from speechctl.models.generic.prompts import MultiStreamPrompts
    from speechctl.models.generic.checkpoint import SPECIAL_TOKENS, byte_stream_spec
    from speechctl.models.tokenizer import byte_tokenizer

    recipe = SHAPES[shape]
    spec = byte_stream_spec(recipe.stream_delays, recipe.codebook_size)
    probe = MultiStreamPrompts(spec, byte_tokenizer(SPECIAL_TOKENS)).tts(WORKLOAD_TEXT.format(i=0), max_frames=frames)
    return spec.pattern.num_steps(frames), len(probe.prompt_ids)


def _frame_rate(path: Path) -> float:
    from speechctl.models.families import open_checkpoint

    config = json.loads((open_checkpoint(path).codec_dir / "config.json").read_text())
    hop = int(np.prod(config["downsampling_ratios"]))
    return config["sampling_rate"] / hop


def _plain_run(shape, concurrencies, steps, prompt_len, repeats, overrides) -> dict:
    """{rows, environment} of plain vLLM run in its own process (``speechctl.bench.plain``)."""
    return _own_process("speechctl.bench.plain", "plain vLLM baseline", [
        "--shape", shape, "--concurrency", ",".join(map(str, concurrencies)), "--tokens", str(steps),
        "--prompt-len", str(prompt_len), "--repeats", str(repeats), "--overrides", json.dumps(overrides or {})])


def _speechctl_process(shape, concurrencies, frames, repeats, eager_too, overrides) -> dict:
    """``measure_speechctl`` in a process of its own (``main`` below), as plain vLLM's runs are."""
    return _own_process("speechctl.bench.throughput", "speechctl bench process", [
        "--shape", shape, "--concurrency", ",".join(map(str, concurrencies)), "--frames", str(frames),
        "--repeats", str(repeats), "--overrides", json.dumps(overrides or {})] + ([] if eager_too else ["--no-eager"]))


def _own_process(module: str, what: str, args: list[str]) -> dict:
    """``python -m module ARGS --out FILE`` in a new process, and the JSON it wrote there."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        done = subprocess.run([sys.executable, "-m", module, *args, "--out", str(out)], capture_output=True,
                              text=True, env=os.environ.copy())
        if done.returncode != 0:
            raise EngineError(f"{what} failed: {done.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text())


def _codec_bench(requests: int, frames: int, config: dict | None, repeats: int) -> dict:
    """Batched vs one-by-one decode of ``requests`` codes of ``frames`` frames."""
    import torch
    from transformers import DacConfig, DacModel

    from speechctl.codecs.registry import load_codec

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    dac = DacConfig(**(config or {}))  # default: transformers' DacConfig (a full-size DAC)
    with tempfile.TemporaryDirectory() as tmp:
        DacModel(dac).save_pretrained(tmp)
        codec = load_codec(tmp, device)
    rng = np.random.default_rng(0)
    codes = [rng.integers(0, dac.codebook_size, (dac.n_codebooks, frames)) for _ in range(requests)]

    def timed(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    batched = timed(lambda: codec.decode(codes))
    single = timed(lambda: [codec.decode([c]) for c in codes])
    # The streaming path's case: each step decodes a short window per request (the first chunk,
    # 2 frames, with the decoder's context either side), all requests' windows in one call.
    window = 2 + sum(codec.decode_context)
    windows = [c[:, :window] for c in codes]
    window_batched = timed(lambda: codec.decode(windows))
    window_single = timed(lambda: [codec.decode([c]) for c in windows])
    eager = {}
    if codec.decode_graphs is not None:  # the same decodes without the codec's CUDA graphs, side by side
        graphs = codec.decode_graphs
        codec.decode_eagerly()
        eager = {"decode_graphs": graphs, "eager_batched_s": round(timed(lambda: codec.decode(codes)), 4),
                 "eager_window_batched_s": round(timed(lambda: codec.decode(windows)), 4),
                 "eager_window_one_by_one_s": round(timed(lambda: [codec.decode([c]) for c in windows]), 4)}
    return {"requests": requests, "frames": frames, "codec": f"DAC {dac.sampling_rate} Hz, {dac.n_codebooks} codebooks, "
            f"decoder {dac.decoder_hidden_size}", "batched_s": round(batched, 4), "one_by_one_s": round(single, 4),
            "speedup": round(single / batched, 1), "window_frames": window, "window_batched_s": round(window_batched, 4),
            "window_one_by_one_s": round(window_single, 4), "window_speedup": round(window_single / window_batched, 1),
            **eager}


def plot_throughput(result: dict, path) -> None:
    """frames/s of speechctl (graphs, eager) and tokens/s of plain vLLM per concurrency, and the
    overhead ratio (needs matplotlib)."""
    rates = [("plain_vllm_tokens_per_s", "k^--", "plain vLLM (tokens/s)")]
    rates += [(f"{mode}_frames_per_s", style, f"speechctl, step {mode} (frames/s)") for mode, style in (("graphs", "o-"), ("eager", "s:"))]
    ratio = ("overhead_ratio", "concurrent requests", "speechctl frames/s ÷ plain tokens/s", [(0.85, "--", "g", "goal 0.85")])
    plot_rates_and_ratio(result, path, rates, "per second", ratio, third=_audio_rate_and_rtf)


def _audio_rate_and_rtf(ax, rows, concurrencies) -> None:
    """speechctl's audio seconds per second (left axis) and each request's real-time factor,
    median over requests and repeats (right axis); with per-step graphs where it ran them."""
    mode = "graphs" if "graphs_audio_s_per_s" in rows[0] else "eager"
    ax.plot(concurrencies, [r[f"{mode}_audio_s_per_s"] for r in rows], "o-", label="audio-s/s")
    ax.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel="audio seconds per second")
    rtf = ax.twinx()
    rtf.plot(concurrencies, [r[f"{mode}_rtf_median"] for r in rows], "s:", c="tab:red", label="per-request RTF (median)")
    rtf.set(ylabel="per-request RTF (lower is faster)", ylim=(0, None))
    ax.legend(handles=ax.get_lines() + rtf.get_lines(), loc="upper left")


def main(argv=None) -> None:
    """One speechctl process of ``run_throughput_bench(speechctl_runs=N)``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-eager", action="store_true")
    parser.add_argument("--overrides", default="{}", help="EngineConfig fields as JSON")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = measure_speechctl(args.shape, [int(c) for c in args.concurrency.split(",")], args.frames, args.repeats,
                               not args.no_eager, json.loads(args.overrides) or None, log=lambda line: None)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
