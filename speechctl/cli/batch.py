from __future__ import annotations

import click

from speechctl.cli.asr import manifest_job_options, whisper_options
from speechctl.cli.options import engine_options, sampling_options, user_errors


@click.command("batch")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--out-dir", "-o", required=True, type=click.Path(file_okay=False), help="Outputs and results.jsonl go here.")
@sampling_options
@whisper_options
@engine_options
@user_errors
def command(manifest, out_dir, sampling, whisper, whisper_given, engine):
    """Run every item of a JSONL MANIFEST through one engine, continuously batched.

    Each line is {"id": ..., "task": "tts"|"asr", ...}. Outputs are written atomically to
    OUT_DIR/<id>.<format>, one record per item to OUT_DIR/results.jsonl. A rerun skips the items
    already done. A bad line is reported and the rest still run; the exit code is 1 if any item
    failed. Whisper's flags set how ASR items decode; an item's own fields win over them.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speechctl.batch import plan, run_batch
    from speechctl.errors import InputError

    console = Console(stderr=True)
    items, errors, skipped = plan(manifest, out_dir)
    on_whisper = engine.asr_on_whisper()
    if whisper_given and not on_whisper and any(item.task == "asr" for item in items):
        raise InputError(f"{', '.join(whisper_given)}: Whisper decoding options; {engine.model} is a speech LM "
                         "(its ASR samples text greedily or with --temperature/--top-k/--top-p)")
    for error in errors:
        console.print(f"[red]Error:[/red] {error}", highlight=False, soft_wrap=True)
    if skipped:
        console.print(f"{skipped} item(s) already done in {out_dir}, skipped")
    report = None
    if items or errors:
        speech, asr = engine.batch_engines(items)
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task("batch", total=len(items))
            report = run_batch(
                speech, items, errors, out_dir, manifest_job_options(sampling, whisper if on_whisper else None),
                lambda: progress.advance(bar), asr=asr,
            )
        for line in report.failed[len(errors):]:
            console.print(f"[red]Error:[/red] {line}", highlight=False, soft_wrap=True)
        for line in report.warnings:
            console.print(f"[yellow]Warning:[/yellow] {line}", highlight=False, soft_wrap=True)
        console.print(f"{report.done} done, {skipped} skipped, {len(report.failed)} failed -> {out_dir}")
    else:
        console.print("nothing to do")
    if report is not None and not report.ok:
        raise SystemExit(1)

