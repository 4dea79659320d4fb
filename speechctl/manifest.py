"""Batch manifests (JSONL): parse and validate items, lay out outputs, record results, resume.

A manifest line is a JSON object ``{"id": ..., "task": "tts"|"asr", ...}``. A bad line becomes
a :class:`ManifestError` that names the line and the item; the good items still run. Outputs go
to ``out_dir/<id>.<format>`` and one JSON record per item is appended to
``out_dir/results.jsonl``; a rerun skips the items whose record says "ok" and whose output file
exists (:func:`completed_ids`).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Callable

from speechctl.errors import InputError


RESULTS_FILE = "results.jsonl"
TASKS = ("tts", "asr")
TTS_FORMATS = ("wav", "flac")
ASR_FORMATS = ("txt", "json", "srt", "vtt")
MAX_ID_CHARS = 200
_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
_ID_IN_BROKEN_JSON = re.compile(r'"id"\s*:\s*"([^"\\]{1,200})"')


class _FieldError(Exception):
    """A problem with one field of one line (becomes a ManifestError)."""


@dataclass(frozen=True)
class ManifestItem:
    """One valid manifest line.

    ``fields`` holds the validated task fields (not ``id``/``task``): paths are absolute
    strings, numbers are int/float, ``format`` is always present (its default filled in);
    other optional fields are present only when the line sets them.
    """

    line: int
    id: str
    task: str
    fields: dict


@dataclass(frozen=True)
class ManifestError:
    """A manifest line that cannot run. ``str()`` is one line: ``path:line: item 'id': message``."""

    line: int
    id: str | None
    message: str
    path: str = "manifest"

    def __str__(self) -> str:
        item = f"item {self.id!r}: " if self.id is not None else ""
        return f"{self.path}:{self.line}: {item}{self.message}"


# --------------------------------------------------------------------------------------------
# Field validators: each takes (key, value, base_dir) and returns the validated value
# --------------------------------------------------------------------------------------------


def _text(key: str, value: Any, base_dir: Path) -> str:
    """A non-empty (not just whitespace) string."""
    if not isinstance(value, str) or not value.strip():
        raise _FieldError(f"{key!r} must be a non-empty string")
    return value


def _existing_file(key: str, value: Any, base_dir: Path) -> str:
    """A path to an existing file, relative to the manifest's directory; returned absolute."""
    if not isinstance(value, str) or not value.strip():
        raise _FieldError(f"{key!r} must be a non-empty path string")
    path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(value)))
    if not os.path.exists(path):
        raise _FieldError(f"{key!r} file not found: {path}")
    if not os.path.isfile(path):
        raise _FieldError(f"{key!r} is not a file: {path}")
    return path


def _number(key: str, value: Any) -> float:
    """A finite int or float (not a bool), as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _FieldError(f"{key!r} must be a number, got {_show(value)}")
    return float(value)


def _non_negative_int(key: str, value: Any, base_dir: Path) -> int:
    """An int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _FieldError(f"{key!r} must be an integer >= 0, got {_show(value)}")
    return value


def _non_negative(key: str, value: Any, base_dir: Path) -> float:
    """A number >= 0 (a temperature: 0 = greedy; a CFG scale: 1 = off)."""
    number = _number(key, value)
    if number < 0:
        raise _FieldError(f"{key!r} must be >= 0, got {_show(value)}")
    return number


def _top_p(key: str, value: Any, base_dir: Path) -> float:
    """A number in (0, 1]."""
    number = _number(key, value)
    if not 0 < number <= 1:
        raise _FieldError(f"{key!r} must be in (0, 1], got {_show(value)}")
    return number


def _positive(key: str, value: Any, base_dir: Path) -> float:
    """A number > 0."""
    number = _number(key, value)
    if number <= 0:
        raise _FieldError(f"{key!r} must be > 0, got {_show(value)}")
    return number


def _positive_int(key: str, value: Any, base_dir: Path) -> int:
    """An int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _FieldError(f"{key!r} must be an integer >= 1, got {_show(value)}")
    return value


def _or_null(validate: Callable[[str, Any, Path], Any]) -> Callable[[str, Any, Path], Any]:
    """``validate``, or null (a Whisper check that is off, as the command line's "none")."""

    def validate_or_null(key: str, value: Any, base_dir: Path) -> Any:
        return None if value is None else validate(key, value, base_dir)

    return validate_or_null


def _any_number(key: str, value: Any, base_dir: Path) -> float:
    """A finite number (a threshold; a log-probability is negative)."""
    return _number(key, value)


def _unit(key: str, value: Any, base_dir: Path) -> float:
    """A number in [0, 1]."""
    number = _number(key, value)
    if not 0 <= number <= 1:
        raise _FieldError(f"{key!r} must be in [0, 1], got {_show(value)}")
    return number


def _flag(key: str, value: Any, base_dir: Path) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise _FieldError(f"{key!r} must be true or false, got {_show(value)}")
    return value


def _choice(*choices: str) -> Callable[[str, Any, Path], str]:
    """A validator accepting one of ``choices``."""

    def validate(key: str, value: Any, base_dir: Path) -> str:
        if value not in choices:
            allowed = " or ".join(repr(c) for c in choices)
            raise _FieldError(f"{key!r} must be {allowed}, got {_show(value)}")
        return value

    return validate


Validator = Callable[[str, Any, Path], Any]

# An ASR item's Whisper decoding: speechctl asr's flags, "_" for "-" ("translate": --task translate)
_WHISPER_FIELDS: dict[str, Validator] = {
    "language": _text,
    "translate": _flag,
    "beam_size": _positive_int,
    "best_of": _positive_int,
    "patience": _positive,
    "length_penalty": _or_null(_unit),
    "temperature_increment_on_fallback": _or_null(_positive),
    "compression_ratio_threshold": _or_null(_any_number),
    "logprob_threshold": _or_null(_any_number),
    "no_speech_threshold": _or_null(_any_number),
    "condition_on_previous_text": _flag,
    "initial_prompt": _text,
    "without_timestamps": _flag,
    "word_timestamps": _flag,
}

# Per task: field -> (validator, required). "format" is filled with its default when absent.
_SCHEMAS: dict[str, dict[str, tuple[Validator, bool]]] = {
    "tts": {
        "text": (_text, True),
        "voice": (_existing_file, False),
        "voice_text": (_text, False),  # the voice recording's transcript (Higgs Audio v2 uses it)
        "seed": (_non_negative_int, False),
        "temperature": (_non_negative, False),
        "top_k": (_non_negative_int, False),
        "top_p": (_top_p, False),
        "audio_temperature": (_non_negative, False),
        "audio_top_k": (_non_negative_int, False),
        "audio_top_p": (_top_p, False),
        "depth_temperature": (_non_negative, False),
        "depth_top_k": (_non_negative_int, False),
        "depth_top_p": (_top_p, False),
        "max_seconds": (_positive, False),
        "codes_out": (_flag, False),  # also write <id>.codes.npy: the generated codes [K, T]
        "cfg": (_non_negative, False),
        "cfg_streams": (_choice("text", "audio", "both"), False),
        "cfg_top_k": (_non_negative_int, False),
        "format": (_choice(*TTS_FORMATS), False),
    },
    "asr": {
        "audio": (_existing_file, True),
        "format": (_choice(*ASR_FORMATS), False),
        "seed": (_non_negative_int, False),
        "temperature": (_non_negative, False),  # Whisper: where the fallback schedule starts
        "top_k": (_non_negative_int, False),
        "top_p": (_top_p, False),
        **{key: (validate, False) for key, validate in _WHISPER_FIELDS.items()},
    },
}
WHISPER_FIELDS = tuple(_WHISPER_FIELDS)  # the ASR fields only Whisper reads (a speech LM's ASR refuses them)
_DEFAULT_FORMAT = {"tts": TTS_FORMATS[0], "asr": ASR_FORMATS[0]}


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def read_manifest(path: str | PathLike) -> tuple[list[ManifestItem], list[ManifestError]]:
    """Parse the JSONL manifest at ``path`` into (valid items, errors of the bad lines).

    Blank lines are skipped. Relative paths resolve against the manifest's directory. A
    missing or unreadable manifest raises InputError.
    """
    name = str(path)
    text = _read_manifest_text(path)
    base_dir = Path(os.path.abspath(path)).parent
    items: list[ManifestItem] = []
    errors: list[ManifestError] = []
    first_line_of: dict[str, int] = {}
    # split on "\n" only: str.splitlines() would also split at U+2028 etc. inside JSON strings
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        obj: dict | None = None
        try:
            obj = _parse_line(raw)
            item = _parse_item(obj, number, base_dir)
            if item.id in first_line_of:
                raise _FieldError(f"duplicate id (first used on line {first_line_of[item.id]})")
        except _FieldError as e:
            label = _guess_id(raw) if obj is None else _id_label(obj)
            errors.append(ManifestError(number, label, str(e), name))
            continue
        first_line_of[item.id] = number
        items.append(item)
    return items, errors


def _read_manifest_text(path: str | PathLike) -> str:
    """The manifest's text (UTF-8, BOM allowed); InputError if it cannot be read."""
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not a manifest file")
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except FileNotFoundError as e:
        raise InputError(f"{path}: no such manifest file") from e
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from e
    except OSError as e:
        raise InputError(f"{path}: cannot read manifest: {e.strerror or e}") from e


def _parse_line(raw: str) -> dict:
    """The JSON object on one line."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise _FieldError(f"invalid JSON: {e.msg} (column {e.colno})") from e
    if not isinstance(obj, dict):
        raise _FieldError(f"expected a JSON object, got {_json_type(obj)}")
    return obj


def _id_label(obj: dict) -> str | None:
    """The line's ``id`` as given (valid or not) to name it in errors, if it is a string."""
    item_id = obj.get("id")
    return item_id if isinstance(item_id, str) and item_id else None


def _guess_id(raw: str) -> str | None:
    """The ``"id"`` string of an unparsable line, found textually, to name it in errors."""
    match = _ID_IN_BROKEN_JSON.search(raw)
    return match.group(1) if match else None


def _item_id(obj: dict) -> str:
    """The line's validated ``id`` (non-empty, safe as a file name)."""
    if "id" not in obj:
        raise _FieldError("missing 'id'")
    item_id = obj["id"]
    if not isinstance(item_id, str) or not item_id:
        raise _FieldError(f"'id' must be a non-empty string, got {_show(item_id)}")
    if item_id in (".", "..") or not _ID_PATTERN.fullmatch(item_id):
        raise _FieldError("'id' is not safe as a file name (use letters, digits, '.', '_', '-')")
    if len(item_id) > MAX_ID_CHARS:
        raise _FieldError(f"'id' is longer than {MAX_ID_CHARS} characters")
    return item_id


def _parse_item(obj: dict, number: int, base_dir: Path) -> ManifestItem:
    """Validate the id, the task and its fields of one line; return the item."""
    item_id = _item_id(obj)
    task = obj.get("task")
    if task is None:
        raise _FieldError("missing 'task' (\"tts\" or \"asr\")")
    if task not in TASKS:
        raise _FieldError(f"'task' must be \"tts\" or \"asr\", got {_show(task)}")
    schema = _SCHEMAS[task]
    _check_unknown_keys(obj, schema, task)
    fields = {"format": _DEFAULT_FORMAT[task]}
    for key, (validate, required) in schema.items():
        if key in obj:
            fields[key] = validate(key, obj[key], base_dir)
        elif required:
            raise _FieldError(f"missing {key!r} (required for {task})")
    return ManifestItem(line=number, id=item_id, task=task, fields=fields)


def _check_unknown_keys(obj: dict, schema: dict, task: str) -> None:
    """Refuse keys the task does not know, suggesting the closest known one."""
    known = {"id", "task", *schema}
    unknown = [key for key in obj if key not in known]
    if not unknown:
        return
    key = unknown[0]
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(sorted(schema))})"
    raise _FieldError(f"unknown field {key!r} for {task}{hint}")


def _show(value: Any, limit: int = 40) -> str:
    """``value`` as (possibly shortened) JSON, for error messages."""
    shown = json.dumps(value, ensure_ascii=False)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _json_type(value: Any) -> str:
    """The JSON type name of a parsed value."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------------------------
# Outputs, results and resume
# --------------------------------------------------------------------------------------------


def output_path(out_dir: str | PathLike, item: ManifestItem) -> Path:
    """Where ``item``'s output goes: ``out_dir/<id>.<format>``."""
    return Path(out_dir) / f"{item.id}.{item.fields['format']}"


def results_path(out_dir: str | PathLike) -> Path:
    """The results log of a batch: ``out_dir/results.jsonl``."""
    return Path(out_dir) / RESULTS_FILE


def result_record(item: ManifestItem, error: str | None = None, **extras: Any) -> dict:
    """The results.jsonl record of ``item``: status "ok" (output = file name) or "error".

    ``extras`` (for example ``duration_s``, ``text``) are added to the record.
    """
    ok = error is None
    return {
        "id": item.id,
        "task": item.task,
        "status": "ok" if ok else "error",
        "output": output_path("", item).name if ok else None,
        "error": error,
        **extras,
    }


def manifest_error_record(error: ManifestError) -> dict:
    """The results.jsonl record of a manifest line that could not run."""
    return {
        "id": error.id,
        "task": None,
        "status": "error",
        "output": None,
        "error": str(error),
        "line": error.line,
    }


def append_result(out_dir: str | PathLike, record: dict) -> None:
    """Append ``record`` as one line to ``out_dir/results.jsonl``, flushed and fsynced.

    A partial last line left by an earlier crash is closed with a newline first, so the new
    record stays on a line of its own.
    """
    line = json.dumps(record, ensure_ascii=False) + "\n"
    path = results_path(out_dir)
    try:
        with open(path, "a+b") as f:
            if _ends_mid_line(f):
                f.write(b"\n")
            f.write(line.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise InputError(f"{path}: cannot write results: {e.strerror or e}") from e


def _ends_mid_line(f) -> bool:
    """True if the binary file ``f`` is non-empty and does not end with a newline."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return False
    f.seek(size - 1)
    return f.read(1) != b"\n"


def read_results(out_dir: str | PathLike) -> list[dict]:
    """The records of ``out_dir/results.jsonl`` in order; unparsable (e.g. truncated) lines and
    records without a string id are skipped. A missing file gives []."""
    path = results_path(out_dir)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise InputError(f"{path}: cannot read results: {e.strerror or e}") from e
    records = []
    for raw in data.decode("utf-8", errors="replace").split("\n"):
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("id"), str):
            records.append(record)
    return records


def completed_ids(out_dir: str | PathLike) -> set[str]:
    """Ids whose latest results.jsonl record is "ok" and whose output file still exists."""
    latest = {record["id"]: record for record in read_results(out_dir)}
    return {
        item_id
        for item_id, record in latest.items()
        if record.get("status") == "ok" and _output_exists(out_dir, record.get("output"))
    }


def _output_exists(out_dir: str | PathLike, output: Any) -> bool:
    """True if ``output`` is a plain file name (no directories) of a file in ``out_dir``."""
    if not isinstance(output, str) or not output or Path(output).name != output:
        return False
    return (Path(out_dir) / output).is_file()
