from __future__ import annotations

import json

import click

from speechctl.cli.options import engine_options, sampling_options, user_errors


@click.command("asr")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--format", "fmt", type=click.Choice(["txt", "json"]), default="txt", show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True, help="Longest transcript, in tokens.")
@sampling_options
@engine_options
@user_errors
def command(files, fmt, max_tokens, sampling, engine):
    """Transcribe audio FILEs (- for stdin). Files that fail are reported; the rest still run."""
    from speechctl.api import AsrJob, FailedJob
    from speechctl.audio import read_audio
    from speechctl.errors import InputError

    speech = engine.speech()
    options = sampling.job_options()
    options.pop("audio_sampling")

    # Job ids name the file (errors say which); a file given twice gets a #n suffix.
    ids = [path if files.index(path) == i else f"{path}#{i}" for i, path in enumerate(files)]

    def jobs():
        for job_id, path in zip(ids, files):
            try:
                yield AsrJob(id=job_id, audio=read_audio(path, speech.sample_rate), max_tokens=max_tokens, **options)
            except InputError as e:
                yield FailedJob(id=job_id, task="asr", error=str(e))

    order = {job_id: i for i, job_id in enumerate(ids)}
    results = sorted(speech.run(jobs()), key=lambda r: order[r.id])
    failed = [r for r in results if r.error]
    if fmt == "json":
        rows = [{"file": files[order[r.id]], "text": r.text, "error": r.error} for r in results]
        click.echo(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        for r in results:
            if r.error is None:
                click.echo(r.text if len(files) == 1 else f"{files[order[r.id]]}\t{r.text}")
    for r in failed:
        click.echo(f"Error: {r.error}", err=True)
    if failed:
        raise SystemExit(1)
