"""Run a manifest: every item through one engine together, outputs written as they finish."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from speechctl.api import AsrJob, FailedJob, Speech, TtsJob
from speechctl.audio import read_audio, write_audio, write_json_atomic, write_npy_atomic, write_text_atomic
from speechctl.errors import InputError
from speechctl.manifest import (
    ManifestError,
    ManifestItem,
    append_result,
    completed_ids,
    manifest_error_record,
    output_path,
    read_manifest,
    result_record,
)


@dataclass
class BatchReport:
    done: int = 0
    skipped: int = 0  # finished in an earlier run
    failed: list[str] = field(default_factory=list)  # one line per failure
    warnings: list[str] = field(default_factory=list)  # one line per warning (e.g. audio at its cap)

    @property
    def ok(self) -> bool:
        return not self.failed


def plan(manifest: str | Path, out_dir: str | Path) -> tuple[list[ManifestItem], list[ManifestError], int]:
    """(items still to run, bad lines, items already done)."""
    items, errors = read_manifest(manifest)
    done = completed_ids(out_dir)
    todo = [item for item in items if item.id not in done]
    return todo, errors, len(items) - len(todo)


def run_batch(
    speech: Speech | None,
    items: list[ManifestItem],
    errors: list[ManifestError],
    out_dir: str | Path,
    job_options: Callable[[dict], dict],
    on_result: Callable[[], None] = lambda: None,
    asr=None,
) -> BatchReport:
    """Run ``items``; record bad lines and failures in results.jsonl and keep going.
    ``asr`` (a ``speechctl.asr.WhisperAsr``), when given, runs the ASR items and ``speech`` the
    TTS items; otherwise ``speech`` runs both. Either may be None when it has nothing to run
    (TTS items without a speech LM fail one by one)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = BatchReport()
    for error in errors:
        append_result(out_dir, manifest_error_record(error))
        report.failed.append(str(error))
    by_id = {item.id: item for item in items}
    for result in _results(speech, asr, items, job_options):
        item = by_id[result.id]
        error = result.error or _write_output(item, result, out_dir)
        extras = {}
        if error is None and item.task == "tts":
            extras["duration_s"] = round(result.duration, 3)
            if result.warnings:
                extras["warnings"] = result.warnings
                report.warnings += [f"line {item.line}: {w}" for w in result.warnings]
        if error is None and item.task == "asr":
            extras.update(_transcript_record(result))
        append_result(out_dir, result_record(item, error, **extras))
        if error:
            report.failed.append(f"line {item.line}: item '{item.id}': {error}")
        else:
            report.done += 1
        on_result()
    return report


def _results(speech, asr, items: list[ManifestItem], job_options) -> Iterator:
    """Whisper runs the ASR items first (all windows batched together), then the speech LM the
    rest."""
    if asr is not None:
        yield from asr.run(_jobs(asr, [i for i in items if i.task == "asr"], job_options))
        items = [i for i in items if i.task != "asr"]
    if not items:
        return
    if speech is None:
        for item in items:
            error = f"the model is an ASR model (Whisper); {item.task} items need a speech LM (--model tiny or a checkpoint)"
            yield _failure_result(item, error)
        return
    yield from speech.run(_jobs(speech, items, job_options))


def _failure_result(item: ManifestItem, error: str):
    from speechctl.jobs import AsrResult, TtsResult

    return TtsResult(item.id, None, 0, error=error) if item.task == "tts" else AsrResult(item.id, None, error=error)


def _jobs(speech, items: list[ManifestItem], job_options) -> Iterator:
    for item in items:
        f = item.fields
        try:
            if item.task == "tts":
                voice = read_audio(f["voice"], speech.sample_rate) if "voice" in f else None
                options = job_options(f, defaults=speech.checkpoint.defaults)
                extra = {k: f[k] for k in ("max_seconds", "voice_text") if k in f}
                yield TtsJob(id=item.id, text=f["text"], voice=voice, **options, **extra)
            else:
                options = job_options(f, task="asr")
                yield AsrJob(id=item.id, audio=read_audio(f["audio"], speech.sample_rate), **options)
        except InputError as e:
            yield FailedJob(id=item.id, task=item.task, error=str(e))


def _transcript_record(result) -> dict:
    """An ASR result's text, with Whisper's language (given or detected) and timed segments (and
    their words, with word timestamps) where it has them."""
    record = {"text": result.text}
    if result.language is not None:
        record["language"] = result.language
    if result.segments is not None:
        record["segments"] = [s.to_dict() for s in result.segments]
    return record


def _write_output(item: ManifestItem, result, out_dir: Path) -> str | None:
    path = output_path(out_dir, item)
    try:
        if item.task == "tts":
            write_audio(path, result.audio, result.sample_rate, item.fields["format"])
            if item.fields.get("codes_out"):
                write_npy_atomic(path.with_name(f"{path.stem}.codes.npy"), result.codes)
        elif item.fields["format"] == "json":
            write_json_atomic(path, {"id": item.id, **_transcript_record(result)})
        elif item.fields["format"] in ("srt", "vtt"):  # subtitles: Whisper's segments (a speech LM's: one cue)
            from speechctl.asr.segments import render, result_segments

            write_text_atomic(path, render(item.fields["format"], result.text, result_segments(result)))
        else:
            write_text_atomic(path, result.text + "\n")
    except InputError as e:
        return str(e)
    return None


__all__ = ["plan", "run_batch", "BatchReport"]
