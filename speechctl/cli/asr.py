from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import click

from speechctl.asr.segments import FORMATS  # numpy only: --help stays light
from speechctl.cli.options import EngineChoice, quiet_libraries, sampling_options, user_errors


class OptionalFloat(click.ParamType):
    """A float, or "none" (the check is off), as OpenAI's CLI takes its thresholds."""

    name = "FLOAT|none"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, float):
            return value
        if str(value).lower() == "none":
            return None
        try:
            return float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number or 'none'", param, ctx)


_WHISPER_PARAMS = {"language", "task", "beam_size", "best_of", "patience", "length_penalty", "increment",
                   "compression_ratio_threshold", "logprob_threshold", "no_speech_threshold",
                   "condition_on_previous_text", "initial_prompt", "without_timestamps", "word_timestamps"}


def whisper_options(fn):
    """Whisper's decoding options (OpenAI's ``transcribe`` / faster-whisper, their defaults)."""

    @click.option("--language", default=None, metavar="CODE", help="Spoken language (en, de, ...); default: detected per file (multilingual models).")
    @click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True, help="translate: into English (multilingual models).")
    @click.option("--beam-size", type=click.IntRange(1), default=5, show_default=True, help="Beams at temperature 0 (1 = greedy).")
    @click.option("--best-of", type=click.IntRange(1), default=5, show_default=True, help="Samples at a temperature above 0 (the fallback).")
    @click.option("--patience", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True, help="Beam search stops after beam-size x patience finished beams.")
    @click.option("--length-penalty", type=click.FloatRange(0, 1), default=None, help="Rank by sum / ((5 + length) / 6) ** VALUE (Google NMT) instead of sum / length.")
    @click.option("--temperature-increment-on-fallback", "increment", type=OptionalFloat(), default="0.2", show_default=True, help="Decode a window again at temperature + this while it fails the checks below (none: never).")
    @click.option("--compression-ratio-threshold", type=OptionalFloat(), default="2.4", show_default=True, help="Fallback when the text compresses better than this (gzip): repetition.")
    @click.option("--logprob-threshold", type=OptionalFloat(), default="-1.0", show_default=True, help="Fallback when the average log-probability is lower.")
    @click.option("--no-speech-threshold", type=OptionalFloat(), default="0.6", show_default=True, help="Drop a window whose no-speech probability is higher (and log-probability low).")
    @click.option("--condition-on-previous-text/--no-condition-on-previous-text", default=True, show_default=True, help="Prompt each window with the text before it.")
    @click.option("--initial-prompt", default=None, metavar="TEXT", help="Text that precedes the first window (vocabulary, spelling).")
    @click.option("--without-timestamps", is_flag=True, help="Decode without Whisper's timestamp tokens (segments then span whole windows).")
    @click.option("--word-timestamps", is_flag=True, help="Time every word (json: words per segment; srt/vtt: cues of words).")
    @functools.wraps(fn)
    def wrapper(*args, language, task, beam_size, best_of, patience, length_penalty, increment, compression_ratio_threshold,
                logprob_threshold, no_speech_threshold, condition_on_previous_text, initial_prompt, without_timestamps,
                word_timestamps, **kwargs):
        context = click.get_current_context()
        # the Whisper flags the user gave (a speech LM refuses them rather than ignore them)
        kwargs["whisper_given"] = [p.opts[0] for p in context.command.params
                                   if p.name in _WHISPER_PARAMS and context.get_parameter_source(p.name)
                                   is not click.core.ParameterSource.DEFAULT]
        kwargs["whisper"] = dict(
            language=language, task=task, beam_size=beam_size, best_of=best_of, patience=patience,
            length_penalty=length_penalty, increment=increment, compression_ratio_threshold=compression_ratio_threshold,
            logprob_threshold=logprob_threshold, no_speech_threshold=no_speech_threshold,
            condition_on_previous_text=condition_on_previous_text, initial_prompt=initial_prompt,
            timestamps=not without_timestamps, word_timestamps=word_timestamps,
        )
        return fn(*args, **kwargs)

    return wrapper


def build_options(settings: dict, text: dict):
    """WhisperOptions from ``whisper_options``' settings and the text sampling given
    (``--temperature`` starts the fallback schedule; ``--top-k``, ``--top-p``)."""
    from speechctl.asr.options import WhisperOptions, temperature_schedule
    from speechctl.errors import InputError

    settings = dict(settings)
    increment = settings.pop("increment")
    try:
        return WhisperOptions(temperatures=temperature_schedule(text.get("temperature") or 0.0, increment),
                              top_k=text.get("top_k") or 0, top_p=text.get("top_p") or 1.0, **settings)
    except ValueError as e:
        raise InputError(str(e)) from None


def manifest_job_options(sampling, whisper: dict | None):
    """``job_options(fields, task, defaults)`` for a batch's items: ``sampling.job_options``,
    and for an ASR item that Whisper runs (``whisper``: the command line's settings; None when a
    speech LM runs them) its WhisperOptions, the item's fields over the command line's flags.
    A speech LM's ASR item with a Whisper field fails (InputError: the item's one-line error)."""
    from speechctl.errors import InputError
    from speechctl.manifest import WHISPER_FIELDS

    def job_options(fields: dict, task: str = "tts", defaults=None) -> dict:
        options = sampling.job_options(fields, task=task, defaults=defaults)
        if task != "asr":
            return options
        if whisper is None:
            given = [key for key in WHISPER_FIELDS if key in fields]
            if given:
                raise InputError(f"{given[0]!r}: a Whisper decoding option; this batch's ASR items run on a speech LM")
            return options
        settings = dict(whisper)
        for key in (k for k in WHISPER_FIELDS if k in fields):
            value = fields[key]
            if key == "translate":
                settings["task"] = "translate" if value else "transcribe"
            elif key == "without_timestamps":
                settings["timestamps"] = not value
            elif key == "temperature_increment_on_fallback":
                settings["increment"] = value
            else:
                settings[key] = value
        text = {k: v for k, v in sampling.flags["generated"].items() if v is not None}
        text.update({k: fields[k] for k in ("temperature", "top_k", "top_p") if k in fields})
        options["whisper"] = build_options(settings, text)
        return options

    return job_options


@click.command("asr")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--model", "-m", default=None, metavar="NAME|DIR|ORG/NAME", help="whisper-tiny.en (default), a Whisper checkpoint in Hugging Face format (a directory or a hub id such as openai/whisper-small, from the Hugging Face cache), or a speech LM.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="txt", show_default=True, help="json, srt and vtt carry timestamps (segments; words with --word-timestamps).")
@click.option("--out-dir", "-o", type=click.Path(file_okay=False), default=None, help="Write OUT_DIR/<file name>.<format> per input instead of printing.")
@click.option("--max-tokens", type=click.IntRange(1), default=None, help="Longest transcript, in tokens (Whisper: per window, at most 446).  [default: 256]")
@click.option("--max-window", type=click.FloatRange(3, 30), default=30.0, show_default=True, help="Whisper: longest window in seconds.")
@click.option("--max-num-seqs", type=click.IntRange(1), default=64, show_default=True, help="Sequences decoded together (Whisper: windows x beams; speech LM: requests).")
@click.option("--max-model-len", type=click.IntRange(16), default=None, help="Speech LMs: longest prompt + output, in steps (default: the checkpoint's limit, at most 4096).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto", show_default=True)
@click.option("--verbose", "-v", is_flag=True, help="Show vLLM's logs.")
@whisper_options
@sampling_options
@user_errors
def command(files, model, fmt, out_dir, max_tokens, max_window, max_num_seqs, max_model_len, dtype, verbose, whisper, whisper_given,
            sampling):
    """Transcribe audio FILEs (- for stdin). Files that fail are reported; the rest still run.

    Whisper decodes as OpenAI's whisper and faster-whisper do by default: beam search (5), a
    temperature fallback, no-speech detection, each window prompted with the text before it.
    Long files are cut into windows of at most 30 s at pauses; silent stretches are skipped.
    """
    from speechctl.jobs import AsrJob, AsrResult, FailedJob
    from speechctl.asr import WhisperAsr, is_whisper
    from speechctl.asr.segments import render, result_segments, to_record
    from speechctl.audio import read_audio, write_text_atomic
    from speechctl.errors import InputError

    if fmt in ("srt", "vtt") and len(files) > 1 and out_dir is None:
        raise click.UsageError(f"--format {fmt} with several files needs --out-dir")
    quiet_libraries(verbose)
    uses_whisper = is_whisper(model)
    choice = EngineChoice(model, max_num_seqs, max_model_len, dtype)
    rate = WhisperAsr.sample_rate if uses_whisper else choice.sample_rate()
    options = sampling.job_options(task="asr")
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    if uses_whisper:
        options["whisper"] = build_options(whisper, sampling.flags["generated"])  # asr generates text
    elif whisper_given:
        raise InputError(f"{', '.join(whisper_given)}: Whisper decoding options; {model} is a speech LM (its ASR samples text greedily or with --temperature/--top-k/--top-p)")

    # Job ids name the file (errors say which); a file given twice gets a #n suffix.
    ids = [path if files.index(path) == i else f"{path}#{i}" for i, path in enumerate(files)]

    def jobs():
        for job_id, path in zip(ids, files):
            try:
                audio = read_audio(path, rate)
            except InputError as e:
                yield FailedJob(id=job_id, task="asr", error=str(e))
                continue
            yield AsrJob(id=job_id, audio=audio, **options)

    # Files are read lazily; the engine starts only once one of them is readable.
    pending, head = jobs(), []
    for job in pending:
        head.append(job)
        if isinstance(job, AsrJob):
            break
    if any(isinstance(job, AsrJob) for job in head):
        jobs_in = itertools.chain(head, pending)
        if uses_whisper:
            results = choice.whisper().run(jobs_in, max_window=max_window)
        else:
            results = choice.speech().run(jobs_in)
    else:
        results = [AsrResult(job.id, None, error=job.error) for job in head]
    order = {job_id: i for i, job_id in enumerate(ids)}
    names = _output_names(files)
    finished = []
    for r in results:  # in the order they finish; with --out-dir each file is written at once
        if out_dir is not None and r.error is None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            path = Path(out_dir) / f"{names[order[r.id]]}.{fmt}"
            write_text_atomic(path, render(fmt, r.text, result_segments(r), files[order[r.id]], r.duration,
                                           getattr(r, "language", None)))
        finished.append(r)
    finished.sort(key=lambda r: order[r.id])
    if out_dir is None and fmt == "json":
        rows = [to_record(files[order[r.id]], r.text, None if r.error else result_segments(r), r.error, r.duration,
                          getattr(r, "language", None))
                for r in finished]
        click.echo(json.dumps(rows, ensure_ascii=False, indent=2))
    elif out_dir is None:
        for r in (r for r in finished if r.error is None):
            if fmt == "txt":
                click.echo(r.text if len(files) == 1 else f"{files[order[r.id]]}\t{r.text}")
            else:
                click.echo(render(fmt, r.text, result_segments(r)), nl=False)
    failed = [r for r in finished if r.error]
    for r in failed:
        click.echo(f"Error: {r.error}", err=True)
    if failed:
        raise SystemExit(1)


def _output_names(files) -> list[str]:
    """A distinct output name per input: the file's stem ("stdin" for -), with -2, -3... on
    clashes."""
    names, seen = [], {}
    for path in files:
        stem = "stdin" if path == "-" else Path(path).stem or "audio"
        seen[stem] = seen.get(stem, 0) + 1
        names.append(stem if seen[stem] == 1 else f"{stem}-{seen[stem]}")
    return names
