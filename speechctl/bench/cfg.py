"""CFG throughput: the same TTS workload with and without classifier-free guidance, at several
concurrencies, in one engine and one run. Lengths are fixed (every request makes exactly
``frames`` audio frames), so both modes do the same decoding work per request; a CFG request
runs as a pair, so it decodes two sequences.

Exact CFG by batch doubling runs 2c rows to make c requests' frames, so it cannot beat R(2c)/2,
where R is the same engine's no-CFG rate (DESIGN.md §4). Per concurrency c the bench measures
R(c), R(2c) and CFG(c) and reports the **CFG efficiency** CFG(c) ÷ (R(2c)/2), which measures the
implementation, beside the ratio CFG(c) ÷ R(c), which the physical limit bounds."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from speechctl.bench.report import environment, plot_rates_and_ratio
from speechctl.bench.shapes import SHAPES, describe, shape_checkpoint
from speechctl.engine.params import Guidance, Sampling
from speechctl.errors import EngineError

AUDIO_SAMPLING = Sampling(temperature=0.9, top_k=50)
WORKLOAD_TEXT = "Sentence number {i} for the benchmark."


def run_cfg_bench(
    shape: str = "tiny",
    concurrencies=(1, 4),
    frames: int = 64,
    repeats: int = 3,
    scale: float = 3.0,
    engine_overrides: dict | None = None,
    log=print,
) -> dict:
    from speechctl.bench.host import SchedulerClock

    with ShapeEngine(shape, max_num_seqs=2 * max(concurrencies), frames=frames, overrides=engine_overrides) as bench:
        clock = SchedulerClock(bench.engine)
        rows = []
        guided = Guidance(scale=scale)
        modes = (("plain", 1, Guidance()), ("plain_2c", 2, Guidance()), ("cfg", 1, guided))  # (name, rows per c, guidance)
        for count in concurrencies:
            for _, per, guidance in modes:  # warm-up at these batch sizes: compiles, graphs, allocator
                bench.timed(per * count, guidance)
            captures = bench.engine.stats()["graph_captures"]
            row = {"concurrency": count, "frames": frames}
            for mode, per, guidance in modes:
                clock.reset()
                before = bench.engine.stats()
                times = [bench.timed(per * count, guidance) for _ in range(repeats)]
                seconds = statistics.median(times)
                host = clock.per_step_ms()
                row[f"{mode}_step_ms"] = round(1e3 * sum(times) / max(1, host["steps"]), 4)  # wall time per step
                row[f"{mode}_schedule_ms"] = host["schedule_ms"]  # host time in vLLM's scheduler, per step
                row[f"{mode}_update_ms"] = host["update_from_output_ms"]
                row[f"{mode}_seconds"] = round(seconds, 4)
                row[f"{mode}_runs_s"] = [round(t, 4) for t in times]
                row[f"{mode}_frames_per_s"] = round(per * count * frames / seconds, 1)
                if guidance.enabled:  # how the pair scheduler allocated the timed steps
                    after = bench.engine.stats()
                    for name in ("pair_steps_plain", "pair_steps_checked"):
                        row[f"{mode}_{name}"] = after[name] - before[name]
            row["cfg_ratio"] = round(row["cfg_frames_per_s"] / row["plain_frames_per_s"], 3)
            row["cfg_limit"] = round(row["plain_2c_frames_per_s"] / 2 / row["plain_frames_per_s"], 3)  # R(2c)/2 / R(c)
            row["cfg_efficiency"] = round(row["cfg_frames_per_s"] / (row["plain_2c_frames_per_s"] / 2), 3)
            row["graph_captures_timed"] = bench.engine.stats()["graph_captures"] - captures  # 0: warm-up had them all
            log(
                f"c={count:4d}  plain {row['plain_frames_per_s']:10.1f}  plain(2c) {row['plain_2c_frames_per_s']:10.1f}  "
                f"cfg {row['cfg_frames_per_s']:10.1f} frames/s  ratio {row['cfg_ratio']:.3f} (limit {row['cfg_limit']:.3f})  "
                f"efficiency {row['cfg_efficiency']:.3f}  scheduler ms/step: plain(2c) "
                f"{row['plain_2c_schedule_ms'] + row['plain_2c_update_ms']:.3f}, cfg {row['cfg_schedule_ms'] + row['cfg_update_ms']:.3f}"
            )
            rows.append(row)
        stats = bench.engine.stats()
        clock.close()
    return {
        "benchmark": "cfg",
        "model": describe(shape),
        "cfg_scale": scale,
        "repeats": repeats,
        "engine_startup_s": bench.startup_s,
        "engine_warm_up_s": bench.warm_up_s,  # of which compiling the per-step work
        "engine_start_up_graphs_s": stats["start_up_graphs_s"],  # and recording (compiling) the per-step graphs
        "pair_violations": stats["pair_violations"],
        "environment": environment(),
        "results": rows,
    }


class ShapeEngine:
    """A speechctl engine on a random-weight checkpoint of a bench shape, and its fixed-length
    TTS workload (every request makes exactly ``frames`` audio frames)."""

    def __init__(self, shape: str, *, max_num_seqs: int, frames: int, overrides: dict | None = None):
        self.shape, self.max_num_seqs, self.frames, self.overrides = shape, max_num_seqs, frames, overrides or {}

    def __enter__(self) -> "ShapeEngine":
        from speechctl.engine.engine import EngineConfig, SpeechEngine
        from speechctl.models.generic.prompts import MultiStreamPrompts
        from speechctl.models.generic.checkpoint import create_multistream_checkpoint

        recipe = SHAPES[self.shape]
        self.path = shape_checkpoint(self.shape, create_multistream_checkpoint)
        config = EngineConfig(
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.frames + 96,
            dtype=recipe.dtype,
            load_format="auto" if recipe.weights else "dummy",
            **self.overrides,
        )
        started = time.perf_counter()
        self.engine = SpeechEngine(self.path, config)
        self.startup_s = round(time.perf_counter() - started, 1)
        self.warm_up_s = self.engine.warm_up_s
        self.prompts = MultiStreamPrompts(self.engine.spec, self.engine.tokenizer)
        return self

    def __exit__(self, *exc) -> None:
        self.engine.shutdown()

    def workload(self, count: int, guidance: Guidance = Guidance()) -> list:
        return [
            self.prompts.tts(
                WORKLOAD_TEXT.format(i=i),
                audio_sampling=AUDIO_SAMPLING,
                seed=i,
                max_frames=self.frames,
                min_frames=self.frames,
                guidance=guidance,
                tag=i,
            )
            for i in range(count)
        ]

    def timed(self, count: int, guidance: Guidance = Guidance(), latencies: list | None = None) -> float:
        """Wall time of ``count`` requests submitted at once, checked to have done the work;
        ``latencies`` gets each request's time from submission to its output."""
        reqs = self.workload(count, guidance)
        start = time.perf_counter()
        outs = []
        for out in self.engine.generate(reqs):
            outs.append(out)
            if latencies is not None:
                latencies.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - start
        for out in outs:  # the run did the work it is named after
            if out.error:
                raise EngineError(f"benchmark request failed: {out.error}")
            (codes,) = self.prompts.audio_segments(out, starts_in_audio=True)
            if codes.shape[1] != self.frames:
                raise EngineError(f"expected {self.frames} frames, got {codes.shape[1]}")
        return elapsed


def plot_cfg(result: dict, path: str | Path) -> None:
    rates = [("plain_frames_per_s", "o-", "no CFG, c requests"), ("cfg_frames_per_s", "s-", f"CFG (scale {result['cfg_scale']}), c pairs")]
    rows = result["results"]
    if all("plain_2c_frames_per_s" in r for r in rows):
        rows = [dict(r, limit_frames_per_s=r["plain_2c_frames_per_s"] / 2) for r in rows]
        rates.append(("limit_frames_per_s", "^:", "limit R(2c)/2"))
    key = "cfg_efficiency" if all("cfg_efficiency" in r for r in rows) else "cfg_ratio"
    goals = [(0.95, "--", "g", "goal 0.95")] if key == "cfg_efficiency" else [(0.9, "--", "g", "goal 0.90"), (0.8, ":", "r", "paper 0.80")]
    label = "CFG efficiency: CFG(c) / (R(2c)/2)" if key == "cfg_efficiency" else "CFG / no-CFG throughput"
    plot_rates_and_ratio(result, path, rates, "audio frames / s", (key, "concurrent requests (pairs)", label, goals), rows=rows)
