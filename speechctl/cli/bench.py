from __future__ import annotations

import json
import shlex

import click

from speechctl.cli.options import quiet_libraries, user_errors


# The tiny shape's bench decodes with a small DAC (the published 44.1 kHz size is slow on a CPU).
_SMALL_DAC = dict(encoder_hidden_size=8, downsampling_ratios=[2, 4, 5, 8], upsampling_ratios=[8, 5, 4, 2],
                  decoder_hidden_size=32, codebook_dim=8, sampling_rate=16000, n_codebooks=4, codebook_size=64)


@click.command("bench")
@click.option("--cfg", "cfg", is_flag=True, help="CFG vs no-CFG throughput.")
@click.option("--stream", "stream", is_flag=True, help="Time to first audio and chat-turn latency, streaming vs one-shot.")
@click.option("--arnar", is_flag=True, help="AR+NAR (VALL-E style) beside a delay-pattern model of the same backbone: frames/s and time to last audio.")
@click.option("--nar", type=click.Choice(["own", "shared"]), default="own", show_default=True, help="--arnar: the NAR stage's layers, its own or the AR backbone's.")
@click.option("--workload", is_flag=True, help="Latency under load: Poisson arrivals of mixed requests at several fractions of saturation.")
@click.option("--rates", default="0.3,0.5,0.7,0.9,1.2", show_default=True, help="--workload: offered loads, as fractions of the saturated rate.")
@click.option("--eager-codec-rates", default="", help="--workload: these loads again at the end with the codec decoding eagerly (no CUDA graphs), side by side in the run (the loads before them decode in graphs unless SPEECHCTL_CODEC_GRAPHS=0).")
@click.option("--lookahead-rates", default="", help="--workload: these loads again with the first chunk waiting for --first-lookahead frames past it, not the codec's whole right context (an earlier, inexact first chunk), side by side in the run.")
@click.option("--first-lookahead", type=click.IntRange(0), default=4, show_default=True, help="--workload: the first chunk's lookahead in the --lookahead-rates rounds.")
@click.option("--requests", type=click.IntRange(1), default=64, show_default=True, help="--workload: requests per rate.")
@click.option("--model", "model", default=None, metavar="DIR|ORG/NAME", help="--workload, --stream: a checkpoint (vLLM's random weights where it has none; its own codec); default: --shape.")
@click.option("--random-weights", is_flag=True, help="--workload, --stream with --model: vLLM draws the model's weights at random (speed does not depend on their values), whatever the checkpoint holds; its codec is read from it. A checkpoint without weight files runs so anyway.")
@click.option("--max-chunks", default=None, help="--stream, --workload: the streamed chunks' largest size in frames, comma-separated: a row for each at every concurrency (--workload: at every load; its saturated rounds take the first). Default: the streamer's own.")
@click.option("--no-turn", is_flag=True, help="--stream: TTS only, skip the chat turn (Whisper + response LM).")
@click.option("--asr-model", default=None, metavar="NAME|DIR", help="--stream: the chat turn's Whisper (default whisper-tiny.en).")
@click.option("--lm-model", default=None, metavar="NAME|DIR", help="--stream: the chat turn's response LM (default tiny-lm).")
@click.option("--shape", type=click.Choice(["tiny", "llama-1b", "higgs-3b"]), default="tiny", show_default=True, help="Model shape (random weights).")
@click.option("--concurrency", default="1,4", show_default=True, help="Comma-separated concurrencies (requests, or pairs with CFG).")
@click.option("--frames", type=click.IntRange(1), default=64, show_default=True, help="Audio frames per request (fixed).")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--scale", type=float, default=3.0, show_default=True, help="CFG scale.")
@click.option("--no-plain", is_flag=True, help="Throughput: skip the plain-vLLM baseline.")
@click.option("--plain-runs", type=click.IntRange(1), default=2, show_default=True,
              help="Throughput: run the plain-vLLM baseline in this many processes and keep the fastest (host speed varies between processes).")
@click.option("--speechctl-runs", type=click.IntRange(0), default=0, show_default=True,
              help="Throughput: measure speechctl in this many processes of its own, alternating with the plain-vLLM ones, and keep the fastest (0: in this process, after them).")
@click.option("--no-eager", is_flag=True, help="Throughput: skip the run with the per-step CUDA graphs off.")
@click.option("--codec-requests", type=click.IntRange(0), default=64, show_default=True, help="Throughput: requests in the batched-vs-one-by-one codec decode (0: skip).")
@click.option("--max-graph-tokens", type=click.IntRange(0), default=None, help="The most tokens a step may hold and still replay vLLM's CUDA graphs (a step that admits a prompt holds its tokens; default: speechctl's 512; 0: vLLM's default, twice the most requests up to 512).")
@click.option("--graph-mode", type=click.Choice(["full_and_piecewise", "full", "piecewise"]), default=None, help="vLLM's CUDA graph mode (default: vLLM's, full_and_piecewise; full: whole-forward graphs for steps that prefill too).")
@click.option("--tensor-parallel-size", "-tp", type=click.IntRange(1), default=1, show_default=True, help="Shard the model over this many GPUs (vLLM's tensor parallelism). Data parallelism: benchmarks/multi_gpu.py.")
@click.option("--out", "out", type=click.Path(dir_okay=False), help="Write the result as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG plot here (needs matplotlib).")
@click.option("--verbose", "-v", is_flag=True)
@user_errors
def command(cfg, stream, arnar, nar, workload, rates, eager_codec_rates, lookahead_rates, first_lookahead, requests, model, random_weights, max_chunks, no_turn, asr_model, lm_model, shape, concurrency, frames, repeats, scale, no_plain, plain_runs, speechctl_runs, no_eager, codec_requests, max_graph_tokens, graph_mode, tensor_parallel_size, out, plot, verbose):
    """Measure side by side in one run and print the ratios: throughput (default: speechctl vs
    plain vLLM, per-step graphs on vs off, batched codec), --cfg, --stream, --workload or --arnar."""
    from speechctl.audio import write_json_atomic
    from speechctl.bench.cfg import plot_cfg, run_cfg_bench
    from speechctl.errors import InputError

    quiet_libraries(verbose)
    ctx = click.get_current_context()

    def save(result: dict) -> None:  # every result names the exact command that made it
        if out:
            write_json_atomic(out, {"command": command_line(ctx), **result})

    levels = [int(x) for x in concurrency.split(",") if x.strip()]
    chunks = _max_chunks(max_chunks)
    overrides = {"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size > 1 else {}
    if max_graph_tokens is not None:
        overrides["max_graph_tokens"] = max_graph_tokens or None
    if graph_mode is not None:
        overrides["graph_mode"] = graph_mode
    overrides = overrides or None
    if cfg + stream + workload + arnar > 1:
        raise InputError("choose one benchmark: --cfg, --stream, --workload or --arnar")
    if random_weights and not model:
        raise InputError("--random-weights goes with --model (a --shape has random weights already)")
    if chunks and not (stream or workload):
        raise InputError("--max-chunks goes with --stream or --workload (the other benches stream nothing)")
    if arnar:
        if overrides:
            raise InputError("--arnar: one device per model (no --tensor-parallel-size, --max-graph-tokens or --graph-mode)")
        from speechctl.bench.arnar import plot_arnar, run_arnar_bench
        from speechctl.errors import EngineError

        result = run_arnar_bench(shape, levels, frames, repeats, nar, log=lambda line: click.echo(line, err=True), partial=save)
        save(result)
        if plot and result["results"]:
            plot_arnar(result, plot)
        click.echo(json.dumps({"results": result["results"], "spread": result["spread"]}, indent=2))
        if result["errors"]:
            raise EngineError("; ".join(result["errors"]))
        return
    if workload:
        from speechctl.bench.workload import plot_workload, run_workload_bench

        speech = _workload_speech(model, shape, overrides, random_weights)
        try:
            result = run_workload_bench(speech, [float(x) for x in rates.split(",")], requests,
                                        log=lambda line: click.echo(line, err=True), partial=save,
                                        eager_codec_rates=[float(x) for x in eager_codec_rates.split(",") if x.strip()],
                                        lookahead_rates=[float(x) for x in lookahead_rates.split(",") if x.strip()],
                                        first_lookahead=first_lookahead, **chunks)
        finally:
            speech.close()
        save(result)
        if plot:
            plot_workload(result, plot)
        click.echo(json.dumps({"saturation": result["saturation"], "results": result["results"]}, indent=2))
        return
    if not cfg and not stream:
        from speechctl.bench.throughput import run_throughput_bench

        result = run_throughput_bench(
            shape, levels, frames, repeats, plain_runs=0 if no_plain else plain_runs, speechctl_runs=speechctl_runs,
            eager_too=not no_eager,
            codec_requests=codec_requests, codec_config=_SMALL_DAC if shape == "tiny" else None, engine_overrides=overrides,
            log=lambda line: click.echo(line, err=True),
        )
        save(result)
        if plot:
            from speechctl.bench.throughput import plot_throughput

            plot_throughput(result, plot)
        click.echo(json.dumps({"results": result["results"], "codec": result["codec"]}, indent=2))
        return
    if stream:
        from speechctl.bench.stream import run_stream_bench

        speech = _workload_speech(model, shape, overrides, random_weights) if model else None
        try:
            result = run_stream_bench(
                shape, levels, frames, repeats, turn=not no_turn, asr_model=asr_model, lm_model=lm_model, engine_overrides=overrides,
                speech=speech, log=lambda line: click.echo(line, err=True), **chunks
            )
        finally:
            if speech is not None:
                speech.close()
        save(result)
        if plot:
            from speechctl.bench.stream import plot_stream

            plot_stream(result, plot)
        click.echo(json.dumps({"tts": result["tts"], "turn": result["turn"]}, indent=2))
        return
    result = run_cfg_bench(shape, levels, frames, repeats, scale, engine_overrides=overrides, log=lambda line: click.echo(line, err=True))
    save(result)
    if plot:
        plot_cfg(result, plot)
    click.echo(json.dumps(result["results"], indent=2))


def _max_chunks(text: str | None) -> dict:
    """``--max-chunks`` as the benches' keyword (none: each bench's default, the streamer's own)."""
    from speechctl.errors import InputError

    if text is None:
        return {}
    try:
        chunks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        chunks = []
    if not chunks or min(chunks) < 2:  # (the first chunk is 2 frames)
        raise InputError(f"--max-chunks: frames (at least 2), comma-separated; got {text!r}")
    return {"max_chunks": chunks}


def _workload_speech(model, shape, overrides, random_weights=False):
    """A ``Speech`` for the workload and stream benches: ``model`` (vLLM's random weights with
    ``random_weights`` or where the checkpoint has none), else a random-weight checkpoint of
    ``shape``. (A real-size CSM made for benches holds its codec's weights alone, in the file
    that would hold the LM's: only the caller knows the LM's are not there.)"""
    import tempfile
    from pathlib import Path

    from speechctl.api import Speech
    from speechctl.engine.config import EngineConfig
    from speechctl.errors import ModelError
    from speechctl.models.catalog import resolve_checkpoint

    if model is None:
        from speechctl.bench.shapes import SHAPES
        from speechctl.models.generic.checkpoint import create_multistream_checkpoint

        model = create_multistream_checkpoint(Path(tempfile.mkdtemp()) / shape, SHAPES[shape])
    load_format = "dummy"
    if not random_weights:
        try:
            resolve_checkpoint(str(model)).weights
            load_format = "auto"
        except ModelError:  # a config-only checkpoint of a real size: speed does not depend on the values
            pass
    return Speech(model, engine_config=EngineConfig(max_num_seqs=128, load_format=load_format, **(overrides or {})))


def command_line(ctx: click.Context) -> str:
    """The command as it ran, every option spelled out (defaults too): ``speechctl bench ...``."""
    words = ["speechctl", ctx.info_name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(param, click.Option) and param.is_flag:
            words += [param.opts[0]] if value else []
        elif value is not None:
            words += [param.opts[0], str(value)]
    return shlex.join(words)
