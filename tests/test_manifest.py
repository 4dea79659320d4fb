"""Tests of speechctl.manifest: parsing/validation of JSONL manifests, output layout, resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from speechctl.errors import InputError
from speechctl.manifest import (
    RESULTS_FILE,
    ManifestError,
    ManifestItem,
    append_result,
    completed_ids,
    manifest_error_record,
    output_path,
    read_manifest,
    read_results,
    result_record,
)

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def write_manifest(directory: Path, *lines, name: str = "manifest.jsonl") -> Path:
    """Write ``lines`` (dicts become JSON, strings are written raw) as a manifest file."""
    path = directory / name
    text = "\n".join(json.dumps(line) if isinstance(line, dict) else line for line in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def tts(item_id: str = "a", **fields) -> dict:
    return {"id": item_id, "task": "tts", "text": "Hello there.", **fields}


def asr(item_id: str = "r", audio: str = "in.wav", **fields) -> dict:
    return {"id": item_id, "task": "asr", "audio": audio, **fields}


@pytest.fixture
def audio_file(tmp_path) -> Path:
    """A file to point ASR items and voices at (parsing does not decode it)."""
    path = tmp_path / "in.wav"
    path.write_bytes(b"RIFF")
    return path


# ------------------------------------------------------------------ valid lines


def test_valid_tts_and_asr(tmp_path, audio_file):
    path = write_manifest(
        tmp_path,
        tts("t1"),
        tts(
            "t2",
            voice="in.wav",
            seed=7,
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            audio_temperature=0,
            audio_top_k=0,
            audio_top_p=1,
            max_seconds=12,
            format="flac",
        ),
        "",
        "   ",
        asr("r1"),
        asr("r2", format="json"),
    )
    items, errors = read_manifest(path)
    assert errors == []
    assert [(i.line, i.id, i.task) for i in items] == [
        (1, "t1", "tts"), (2, "t2", "tts"), (5, "r1", "asr"), (6, "r2", "asr"),
    ]
    assert items[0].fields == {"text": "Hello there.", "format": "wav"}
    t2 = items[1].fields
    assert t2["voice"] == str(audio_file) and t2["seed"] == 7 and t2["format"] == "flac"
    assert t2["audio_temperature"] == 0.0 and isinstance(t2["max_seconds"], float)
    assert items[2].fields == {"audio": str(audio_file), "format": "txt"}
    assert items[3].fields["format"] == "json"


def test_asr_items_take_whisper_decoding_fields(tmp_path, audio_file):
    """speechctl asr's flags, "_" for "-": null where the command line takes "none"."""
    fields = dict(language="de", translate=True, beam_size=3, best_of=2, patience=1.5, length_penalty=None,
                  temperature=0.2, top_k=0, top_p=1, seed=4, temperature_increment_on_fallback=None,
                  compression_ratio_threshold=None, logprob_threshold=-2, no_speech_threshold=0.5,
                  condition_on_previous_text=False, initial_prompt="Glossary: vLLM.", without_timestamps=True,
                  word_timestamps=False)
    items, errors = read_manifest(write_manifest(tmp_path, asr("r", format="srt", **fields)))
    assert errors == []
    assert items[0].fields == {"audio": str(audio_file), "format": "srt", **fields}
    assert isinstance(items[0].fields["logprob_threshold"], float)


def test_relative_paths_resolve_against_manifest_dir(tmp_path, monkeypatch):
    (tmp_path / "sub" / "audio").mkdir(parents=True)
    (tmp_path / "sub" / "audio" / "x.wav").write_bytes(b"RIFF")
    (tmp_path / "top.wav").write_bytes(b"RIFF")
    top = str(tmp_path / "top.wav")
    path = write_manifest(
        tmp_path / "sub", asr("a", "audio/x.wav"), asr("b", "../top.wav"), asr("c", top)
    )
    monkeypatch.chdir(tmp_path.parent)  # the working directory must not matter
    items, errors = read_manifest(os.path.relpath(path))
    assert errors == []
    assert [i.fields["audio"] for i in items] == [
        str(tmp_path / "sub" / "audio" / "x.wav"),
        str(tmp_path / "top.wav"),
        str(tmp_path / "top.wav"),
    ]
    assert all(os.path.isabs(i.fields["audio"]) for i in items)


def test_utf8_bom_and_crlf(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [json.dumps(tts("a")).encode(), json.dumps(tts("b")).encode()]
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines))
    items, errors = read_manifest(path)
    assert errors == [] and [i.id for i in items] == ["a", "b"]


def test_unicode_line_separator_inside_text_keeps_line_numbers(tmp_path):
    first = json.dumps(tts("a", text="one\u2028two"), ensure_ascii=False)
    path = write_manifest(tmp_path, first, tts("b"))
    items, errors = read_manifest(path)
    assert errors == [] and [(i.line, i.id) for i in items] == [(1, "a"), (2, "b")]


def test_sample_manifests():
    items, errors = read_manifest(SAMPLES / "manifest.jsonl")
    assert errors == [] and len(items) == 5
    assert sum(i.task == "tts" for i in items) == 4
    asr_item = next(i for i in items if i.task == "asr")
    assert asr_item.fields["audio"] == str(SAMPLES / "hello.wav")
    broken_items, broken_errors = read_manifest(SAMPLES / "broken.jsonl")
    assert [i.id for i in broken_items] == [i.id for i in items]
    assert len(broken_errors) == 2


# ------------------------------------------------------------------ bad lines


BAD_LINES = [
    ('{"id": "j", "task": "tts", "text": "no brace"', "j", "invalid JSON"),
    ('["id", "task"]', None, "expected a JSON object, got an array"),
    ('"just a string"', None, "expected a JSON object, got a string"),
    ({"task": "tts", "text": "x"}, None, "missing 'id'"),
    ({"id": 5, "task": "tts", "text": "x"}, None, "'id' must be a non-empty string"),
    ({"id": "", "task": "tts", "text": "x"}, None, "'id' must be a non-empty string"),
    ({"id": "m", "text": "x"}, "m", "missing 'task'"),
    ({"id": "u", "task": "chat"}, "u", "'task' must be \"tts\" or \"asr\", got \"chat\""),
    (tts("e", text=""), "e", "'text' must be a non-empty string"),
    (tts("w", text="   "), "w", "'text' must be a non-empty string"),
    ({"id": "n", "task": "tts"}, "n", "missing 'text' (required for tts)"),
    (tts("k", tempreature=1), "k", "unknown field 'tempreature' for tts (did you mean"),
    (tts("k2", volume=2), "k2", "unknown field 'volume' for tts (allowed: audio_temperature"),
    (asr("k3", text="x"), "k3", "unknown field 'text' for asr"),
    (tts("s", seed="1"), "s", "'seed' must be an integer >= 0"),
    (tts("s2", seed=1.5), "s2", "'seed' must be an integer >= 0"),
    (tts("s3", seed=True), "s3", "'seed' must be an integer >= 0"),
    (tts("t", temperature=-1), "t", "'temperature' must be >= 0"),
    (tts("t2", audio_temperature="hot"), "t2", "'audio_temperature' must be a number"),
    (tts("p", top_p=0), "p", "'top_p' must be in (0, 1]"),
    (tts("p2", audio_top_p=1.5), "p2", "'audio_top_p' must be in (0, 1]"),
    (tts("tk", top_k=-3), "tk", "'top_k' must be an integer >= 0"),
    (tts("ms", max_seconds=0), "ms", "'max_seconds' must be > 0"),
    ('{"id": "nan", "task": "tts", "text": "x", "max_seconds": NaN}', "nan", "must be a number"),
    (tts("f", format="mp3"), "f", "'format' must be 'wav' or 'flac', got \"mp3\""),
    (asr("f2", format="wav"), "f2", "'format' must be 'txt' or 'json'"),
    (asr("b0", beam_size=0), "b0", "'beam_size' must be an integer >= 1"),
    (asr("b1", best_of=2.0), "b1", "'best_of' must be an integer >= 1"),
    (asr("pa", patience=0), "pa", "'patience' must be > 0"),
    (asr("lp", length_penalty=1.5), "lp", "'length_penalty' must be in [0, 1]"),
    (asr("la", language=""), "la", "'language' must be a non-empty string"),
    (asr("tr", translate="yes"), "tr", "'translate' must be true or false"),
    (asr("tk2", task="translate"), "tk2", "'task' must be \"tts\" or \"asr\""),  # Whisper's task is "translate"
    (asr("in", temperature_increment_on_fallback=0), "in", "'temperature_increment_on_fallback' must be > 0"),
    (asr("th", logprob_threshold="low"), "th", "'logprob_threshold' must be a number"),
    (asr("wt", word_timestamps=1), "wt", "'word_timestamps' must be true or false"),
    (asr("bs", beam=5), "bs", "unknown field 'beam' for asr (did you mean 'beam_size'?)"),
    ({"id": "na", "task": "asr"}, "na", "missing 'audio' (required for asr)"),
    (asr("ma", "missing.wav"), "ma", "'audio' file not found:"),
    (tts("mv", voice="nope.wav"), "mv", "'voice' file not found:"),
    (asr("d", "."), "d", "'audio' is not a file:"),
]


@pytest.mark.parametrize("bad, expected_id, fragment", BAD_LINES)
def test_bad_line_is_reported_and_the_rest_parse(tmp_path, audio_file, bad, expected_id, fragment):
    path = write_manifest(tmp_path, tts("first"), bad, asr("last"))
    items, errors = read_manifest(path)
    assert [i.id for i in items] == ["first", "last"]
    assert len(errors) == 1
    error = errors[0]
    assert error.line == 2 and error.id == expected_id
    assert fragment in error.message, error.message
    text = str(error)
    assert "\n" not in text and text.startswith(f"{path}:2: ")
    if expected_id is not None:
        assert text.startswith(f"{path}:2: item '{expected_id}': ")


def test_error_str_format():
    assert str(ManifestError(3, "x", "'text' must be a non-empty string", "manifest.jsonl")) == (
        "manifest.jsonl:3: item 'x': 'text' must be a non-empty string"
    )
    assert str(ManifestError(4, None, "invalid JSON", "m.jsonl")) == "m.jsonl:4: invalid JSON"


@pytest.mark.parametrize(
    "unsafe", ["a/b", "../up", "a\\b", ".", "..", "with space", "tab\t", "é", "x" * 201, "a:b"]
)
def test_unsafe_ids_rejected(tmp_path, unsafe):
    items, errors = read_manifest(write_manifest(tmp_path, tts(unsafe), tts("ok")))
    assert [i.id for i in items] == ["ok"]
    assert len(errors) == 1 and errors[0].line == 1 and "'id'" in errors[0].message


@pytest.mark.parametrize("safe", ["a", "A-1_b.c", ".hidden", "x" * 200, "..."])
def test_safe_ids_accepted(tmp_path, safe):
    items, errors = read_manifest(write_manifest(tmp_path, tts(safe)))
    assert errors == [] and items[0].id == safe


def test_duplicate_ids(tmp_path, audio_file):
    path = write_manifest(tmp_path, tts("same"), tts("other"), asr("same"), tts("same"))
    items, errors = read_manifest(path)
    assert [(i.line, i.id) for i in items] == [(1, "same"), (2, "other")]
    assert [(e.line, e.id) for e in errors] == [(3, "same"), (4, "same")]
    assert all("duplicate id (first used on line 1)" in e.message for e in errors)


def test_invalid_line_does_not_claim_its_id(tmp_path):
    path = write_manifest(tmp_path, tts("x", text=""), tts("x"))
    items, errors = read_manifest(path)
    assert [(i.line, i.id) for i in items] == [(2, "x")] and errors[0].line == 1


@pytest.mark.parametrize(
    "setup, fragment",
    [("missing", "no such manifest file"), ("dir", "is a directory"), ("binary", "not UTF-8")],
)
def test_unreadable_manifest_is_input_error(tmp_path, setup, fragment):
    path = tmp_path / "m.jsonl"
    if setup == "dir":
        path.mkdir()
    elif setup == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError) as e:
        read_manifest(path)
    assert str(path) in str(e.value) and fragment in str(e.value) and "\n" not in str(e.value)


def test_empty_manifest(tmp_path):
    assert read_manifest(write_manifest(tmp_path, "")) == ([], [])


# ------------------------------------------------------------------ outputs and results


def item(item_id: str, task: str = "tts", fmt: str = "wav") -> ManifestItem:
    return ManifestItem(line=1, id=item_id, task=task, fields={"format": fmt})


def test_output_path(tmp_path):
    assert output_path(tmp_path, item("a")) == tmp_path / "a.wav"
    assert output_path(tmp_path, item("b", fmt="flac")) == tmp_path / "b.flac"
    assert output_path(tmp_path, item("c", "asr", "txt")) == tmp_path / "c.txt"
    assert output_path(str(tmp_path), item("d", "asr", "json")) == tmp_path / "d.json"


def test_result_records():
    ok = result_record(item("a"), duration_s=1.5)
    assert ok == {
        "id": "a", "task": "tts", "status": "ok", "output": "a.wav",
        "error": None, "duration_s": 1.5,
    }
    bad = result_record(item("b", "asr", "txt"), error="b.wav: no such file")
    assert bad["status"] == "error" and bad["output"] is None
    assert bad["error"] == "b.wav: no such file"
    rec = manifest_error_record(ManifestError(3, "x", "bad", "m.jsonl"))
    assert rec["status"] == "error" and rec["line"] == 3
    assert rec["error"] == "m.jsonl:3: item 'x': bad"


def finish(out_dir: Path, it: ManifestItem, **extras) -> None:
    """Write the item's output file and append its ok record, like the batch runner does."""
    output_path(out_dir, it).write_bytes(b"data")
    append_result(out_dir, result_record(it, **extras))


def test_append_and_resume(tmp_path):
    assert completed_ids(tmp_path) == set()  # no results.jsonl yet
    finish(tmp_path, item("a"), duration_s=1.0)
    finish(tmp_path, item("t", "asr", "txt"), text="hello world")
    append_result(tmp_path, result_record(item("b"), error="boom"))
    lines = (tmp_path / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[1])["text"] == "hello world"
    assert completed_ids(tmp_path) == {"a", "t"}


def test_resume_redoes_ok_item_whose_output_was_deleted(tmp_path):
    finish(tmp_path, item("a"))
    finish(tmp_path, item("b"))
    (tmp_path / "b.wav").unlink()
    assert completed_ids(tmp_path) == {"a"}


def test_resume_tolerates_truncated_last_line(tmp_path):
    finish(tmp_path, item("a"))
    finish(tmp_path, item("b"))
    results = tmp_path / RESULTS_FILE
    data = results.read_bytes()
    results.write_bytes(data[: len(data) - 15])  # a crash mid-write of b's record
    assert completed_ids(tmp_path) == {"a"}
    # the next append starts a fresh line, so b's new record is readable
    append_result(tmp_path, result_record(item("b")))
    assert completed_ids(tmp_path) == {"a", "b"}
    assert [r["id"] for r in read_results(tmp_path)] == ["a", "b"]


def test_resume_tolerates_garbage_and_partial_utf8(tmp_path):
    finish(tmp_path, item("a"))
    with open(tmp_path / RESULTS_FILE, "ab") as f:
        f.write(b"not json\n[1,2]\n{\"status\": \"ok\"}\n" + '{"id": "é'.encode()[:-1])
    assert completed_ids(tmp_path) == {"a"}


def test_latest_record_wins(tmp_path):
    finish(tmp_path, item("a"))
    append_result(tmp_path, result_record(item("a"), error="failed on rerun"))
    assert completed_ids(tmp_path) == set()
    append_result(tmp_path, result_record(item("a")))
    assert completed_ids(tmp_path) == {"a"}


def test_output_outside_out_dir_is_not_trusted(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere.wav").write_bytes(b"x")
    append_result(tmp_path / "out", {"id": "a", "status": "ok", "output": "../elsewhere.wav"})
    append_result(tmp_path / "out", {"id": "b", "status": "ok", "output": None})
    assert completed_ids(tmp_path / "out") == set()


def test_append_result_to_missing_dir_is_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot write results"):
        append_result(tmp_path / "nope", result_record(item("a")))


def test_voice_text_is_a_tts_field(tmp_path):
    from speechctl.manifest import read_manifest

    (tmp_path / "v.wav").write_bytes(b"")
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"id": "a", "task": "tts", "text": "hi", "voice": "v.wav", "voice_text": "what it says"}\n'
        '{"id": "b", "task": "tts", "text": "hi", "voice_text": "  "}\n'
    )
    items, errors = read_manifest(path)
    assert [i.id for i in items] == ["a"] and items[0].fields["voice_text"] == "what it says"
    assert len(errors) == 1 and "voice_text" in str(errors[0])
