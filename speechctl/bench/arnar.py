"""Decoupled AR+NAR (VALL-E style) beside a delay-pattern model of the same backbone, in one run:
frames/s and time to last audio at each concurrency, and whether the NAR stage holds the AR
step loop back.

Per model (each in a process of its own, so each engine has the whole device): a random-weight
checkpoint of the shape (``bench/shapes.py``; AR+NAR: the backbone is the AR stage, the NAR a
model of the same shape, or the AR's layers with ``nar="shared"``; the delay model: the generic
family, delays 0..K-1, same backbone and codebooks; both with the same DAC, the published shape
for the big shapes), then per concurrency c, ``repeats`` times after a warm-up:

* ``equal``: c requests submitted at once, each making exactly ``frames`` frames of all K
  codebooks (``min_frames = max_frames``): they finish together, so the NAR stage runs after the
  AR stage (the issue's figure: time to last audio);
* ``spread`` (c > 1): the same with lengths from ``frames`` down to ``frames / 2``, so requests
  finish step after step and NAR batches run while vLLM decodes the rest (the overlap).

Codebook 1 / the delay model's codebooks sampled at temperature 0.9, top-k 50; the NAR greedy,
as VALL-E. Each step's finished requests decoded by the checkpoint's codec in one call off the
step loop (``codecs/worker.py``: on CUDA a worker thread on the codec's stream), as ``Speech.run``
does; figures include the codec.

Reported per row: frames/s and audio-s/s (the median run), time to last audio per request
(submission to decoded audio: median and max over the repeats' requests); for AR+NAR also when
the AR stage went idle (``ar_end_s``: what follows is the last NAR batch and its decode), the NAR
stage's busy time and batches, the AR step's mean time with the NAR stage idle and while it
works (``ar_step_ms_alone`` / ``ar_step_ms_beside_nar``: the device shared, not the loop
blocked) and the step loop's own time around each AR step (``handoff_ms_per_step``: queueing
finished requests for the NAR stage and collecting its results).

    speechctl bench --arnar --concurrency 1,4 --frames 32                            # CPU check
    speechctl bench --arnar --shape llama-1b --concurrency 1,16,64 --frames 256 --out out/arnar.json
    python -m speechctl.bench.arnar --shape llama-1b ...                              # the same, no CLI
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

from speechctl.engine.params import Sampling

AUDIO_SAMPLING = Sampling(temperature=0.9, top_k=50)
TEXT = "The quick brown fox jumps over the lazy dog, number {i}."
KINDS = ("arnar", "delay")
# the two-stage engine's counters whose change over a run the rows report
_COUNTERS = ("ar_steps_alone", "ar_step_s_alone", "ar_steps_beside_nar", "ar_step_s_beside_nar", "handoff_s",
             "nar_busy_s", "nar_batches")


def make_checkpoint(kind: str, shape: str, nar: str, root: Path):
    """(checkpoint directory, recipe) of ``kind`` "arnar" or "delay" at ``shape``."""
    from dataclasses import replace

    from speechctl.bench.shapes import SHAPES
    from speechctl.models.generic.checkpoint import create_multistream_checkpoint
    from speechctl.models.valle.checkpoint import ValleRecipe, create_valle_checkpoint

    base = SHAPES[shape]
    if shape != "tiny":
        base = replace(base, codec={})  # transformers' DacConfig defaults: 16 kHz, hop 512, decoder 1536 channels
    if kind == "delay":
        return create_multistream_checkpoint(root / "delay", base), base
    if base.backbone != "llama":
        raise ValueError(f"the AR+NAR family runs a Llama backbone, not {base.backbone}")
    shared = {f.name for f in fields(ValleRecipe)} & {f.name for f in fields(base)} - {"delays"}
    recipe = ValleRecipe(**{name: getattr(base, name) for name in shared}, shared_layers=nar == "shared")
    return create_valle_checkpoint(root / "arnar", recipe), recipe


def lengths(count: int, frames: int, kind: str) -> list[int]:
    """Frames per request: all ``frames`` (``equal``) or from ``frames`` down to about half."""
    if kind == "equal":
        return [frames] * count
    return [frames - (i * frames) // (2 * count) for i in range(count)]


def measure(kind: str, shape: str, nar: str, concurrencies: list[int], frames: int, repeats: int, write=None) -> dict:
    """One model's rows (runs in its own process: ``--worker``); ``write(result)`` after each row."""
    from speechctl.api import Speech
    from speechctl.bench.report import environment
    from speechctl.engine.config import EngineConfig

    with tempfile.TemporaryDirectory() as tmp:
        path, recipe = make_checkpoint(kind, shape, nar, Path(tmp))
        config = EngineConfig(max_num_seqs=max(concurrencies), max_model_len=frames + 128, dtype=recipe.dtype,
                              load_format="auto" if recipe.weights else "dummy")
        started = time.perf_counter()
        speech = Speech(path, engine_config=config)
        startup = time.perf_counter() - started
        try:
            spec = speech.checkpoint.spec
            rows: list[dict] = []
            result = {"model": kind, "startup_s": round(startup, 1), "codebooks": spec.num_codebooks,
                      "delays": list(spec.pattern.delays), "codec_frame_rate": speech.codec.frame_rate,
                      "environment": environment(), "rows": rows}
            for count in concurrencies:
                for spread in ("equal", "spread") if count > 1 else ("equal",):
                    sizes = lengths(count, frames, spread)
                    _run(speech, sizes)  # warm-up at this batch size
                    row = _row(kind, spread, sizes, [_run(speech, sizes) for _ in range(repeats)], speech.codec.frame_rate)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    if write is not None:
                        write(result)
            result["stats"] = speech.engine.stats()
        finally:
            speech.close()
        return result


def _run(speech, sizes: list[int]) -> dict:
    """One run: requests of ``sizes`` frames submitted at once, stepped to the end, each step's
    finished ones decoded together off the step loop. Times from the submission."""
    from speechctl.codecs.worker import DecodeQueue

    decodes = DecodeQueue(speech.codec)
    try:
        return _stepped(speech, sizes, decodes)
    finally:
        decodes.close()


def _stepped(speech, sizes: list[int], decodes) -> dict:
    from speechctl.errors import EngineError

    engine, prompts = speech.engine, speech.prompts
    ar = getattr(engine, "ar", None)  # the two-stage engine's AR stage
    reqs = [prompts.tts(TEXT.format(i=i % 10), audio_sampling=AUDIO_SAMPLING, seed=i, max_frames=n, min_frames=n, tag=n)
            for i, n in enumerate(sizes)]
    before = _counters(engine) if ar is not None else None
    start, done, ar_end = time.perf_counter(), [], None
    for req in reqs:
        engine.submit(req)
    while engine.has_work():
        outputs = engine.step()
        if ar is not None and ar_end is None and not ar.has_work():
            ar_end = time.perf_counter() - start
        codes = []
        for out in outputs:
            if out.error:
                raise EngineError(f"benchmark request failed: {out.error}")
            (c,) = prompts.audio_segments(out, starts_in_audio=True)
            if c.shape[1] != out.tag:
                raise EngineError(f"expected {out.tag} frames, got {c.shape[1]}")
            codes.append(c)
        decodes.submit([None] * len(codes), codes)
        done += [time.perf_counter() - start for _ in decodes.ready()]  # on the host: the audio is there
    done += [time.perf_counter() - start for _ in decodes.ready(wait=True)]
    run = {"wall_s": done[-1], "ttla_s": done}
    if ar is not None:
        after = _counters(engine)
        run.update(ar_end_s=ar_end, **{k: after[k] - before[k] for k in _COUNTERS})
    return run


def _counters(engine) -> dict:
    stats = engine.stats()
    return {k: stats[k] for k in _COUNTERS}


def _row(kind: str, spread: str, sizes: list[int], runs: list[dict], frame_rate: float) -> dict:
    walls = [r["wall_s"] for r in runs]
    ttla = sorted(t for r in runs for t in r["ttla_s"])
    wall, total = statistics.median(walls), sum(sizes)
    row = {"model": kind, "concurrency": len(sizes), "lengths": spread, "frames": [min(sizes), max(sizes)],
           "frames_per_s": round(total / wall, 1), "audio_s_per_s": round(total / frame_rate / wall, 2),
           "wall_s": [round(w, 3) for w in walls], "ttla_median_s": round(statistics.median(ttla), 3),
           "ttla_max_s": round(ttla[-1], 3)}
    if "ar_end_s" in runs[0]:
        summed = {k: sum(r[k] for r in runs) for k in _COUNTERS}
        steps = summed["ar_steps_alone"] + summed["ar_steps_beside_nar"]
        mean_ms = lambda s, n: round(1000 * s / n, 3) if n else None  # noqa: E731
        row.update(
            ar_end_s=round(statistics.median(r["ar_end_s"] for r in runs), 3),
            nar_busy_s=round(statistics.median(r["nar_busy_s"] for r in runs), 3),
            nar_batches=statistics.median(r["nar_batches"] for r in runs),
            ar_step_ms_alone=mean_ms(summed["ar_step_s_alone"], summed["ar_steps_alone"]),
            ar_step_ms_beside_nar=mean_ms(summed["ar_step_s_beside_nar"], summed["ar_steps_beside_nar"]),
            ar_steps_beside_nar=summed["ar_steps_beside_nar"] // len(runs),
            handoff_ms_per_step=mean_ms(summed["handoff_s"], steps),
        )
    return row


def run_arnar_bench(shape: str = "tiny", concurrencies=(1, 16, 64), frames: int = 256, repeats: int = 3,
                    nar: str = "own", kinds=KINDS, log=print, partial=None) -> dict:
    """The models ``kinds``, one process each, one result; ``partial(result)`` after each model
    (a model whose process failed keeps the rows it wrote and names its error)."""
    from speechctl.bench.shapes import describe

    models: dict[str, dict] = {}
    result = {"benchmark": "arnar", "model": {**describe(shape), "nar": nar}, "frames_per_request": frames,
              "repeats": repeats, "models": models, "errors": []}
    # the worker imports the speechctl this process runs, wherever it was started
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            out = Path(tmp) / f"{kind}.json"
            command = [sys.executable, "-m", "speechctl.bench.arnar", "--worker", kind, "--shape", shape, "--nar", nar,
                       "--concurrency", ",".join(map(str, concurrencies)), "--frames", str(frames),
                       "--repeats", str(repeats), "--out", str(out)]
            started = time.perf_counter()
            code = subprocess.run(command, env=env).returncode
            if out.exists():
                models[kind] = json.loads(out.read_text())
            if code != 0:
                result["errors"].append(f"{kind}: its process exited with status {code}")
            log(f"{kind}: {len(models.get(kind, {}).get('rows', []))} rows in {time.perf_counter() - started:.0f} s"
                + (f" (exit status {code})" if code else ""))
            result.update(_combined(models))
            if partial is not None:
                partial(result)
    return result


def _combined(models: dict) -> dict:
    """``results`` (equal lengths) and ``spread``: per concurrency the models' figures side by
    side, AR+NAR over the delay model; ``environment``: the AR+NAR process's."""
    keep = ("frames_per_s", "audio_s_per_s", "ttla_median_s", "ttla_max_s", "ar_end_s", "nar_busy_s", "nar_batches",
            "ar_step_ms_alone", "ar_step_ms_beside_nar", "ar_steps_beside_nar", "handoff_ms_per_step")
    out = {}
    for spread, name in (("equal", "results"), ("spread", "spread")):
        table: dict[int, dict] = {}
        for kind, model in models.items():
            for row in model["rows"]:
                if row["lengths"] == spread:
                    merged = table.setdefault(row["concurrency"], {"concurrency": row["concurrency"], "frames": row["frames"]})
                    merged.update({f"{kind}_{k}": row[k] for k in keep if k in row})
        for merged in table.values():
            if "arnar_frames_per_s" in merged and "delay_frames_per_s" in merged:
                merged["frames_per_s_ratio"] = round(merged["arnar_frames_per_s"] / merged["delay_frames_per_s"], 3)
                merged["ttla_median_ratio"] = round(merged["arnar_ttla_median_s"] / merged["delay_ttla_median_s"], 3)
        out[name] = [table[c] for c in sorted(table)]
    first = next(iter(models.values()), None)
    if first is not None:
        out["environment"] = first["environment"]
    return out


def plot_arnar(result: dict, path: str | Path) -> None:
    """frames/s of both models, the AR+NAR / delay ratio, time to last audio (equal lengths)."""
    from speechctl.bench.report import plot_rates_and_ratio

    def ttla(axes, rows, c):
        for kind, marker, colour in (("arnar", "o", "C0"), ("delay", "s", "C1")):
            if f"{kind}_ttla_median_s" in rows[0]:
                axes.plot(c, [r[f"{kind}_ttla_median_s"] for r in rows], marker + "-", c=colour, label=f"{kind}: median")
                axes.plot(c, [r[f"{kind}_ttla_max_s"] for r in rows], marker + ":", c=colour, label=f"{kind}: max")
        axes.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel="time to last audio (s)")
        axes.legend()

    rates = [("arnar_frames_per_s", "o-", "AR+NAR"), ("delay_frames_per_s", "s-", "delay pattern")]
    plot_rates_and_ratio(result, path, rates, "audio frames / s (codec included)",
                         ("frames_per_s_ratio", "concurrent requests", "AR+NAR / delay frames/s", [(1.0, "--", "g", "equal")]),
                         third=ttla)


def main(argv=None) -> None:
    from speechctl.bench.shapes import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--nar", default="own", choices=["own", "shared"], help="the NAR's layers: its own, or the AR's")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(KINDS), help="which to run: arnar, delay or both")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)  # one model, in this process
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    def write(result: dict) -> None:
        if args.out:
            from speechctl.audio import write_json_atomic

            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(args.out, result)

    if args.worker:
        write(measure(args.worker, args.shape, args.nar, concurrencies, args.frames, args.repeats, write))
        return
    result = run_arnar_bench(args.shape, concurrencies, args.frames, args.repeats, args.nar, args.models.split(","),
                             log=lambda line: print(line, file=sys.stderr), partial=write)
    print(json.dumps({"results": result["results"], "spread": result["spread"], "errors": result["errors"]}, indent=2))
    if result["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
