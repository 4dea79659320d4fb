"""Tests of speechctl.audio: reading/resampling, wav/flac writing, stdio, errors, atomicity."""

from __future__ import annotations

import io
import json
import os
import sys
import types

import numpy as np
import pytest
import soundfile as sf

from speechctl.audio import (
    atomic_write,
    duration_seconds,
    read_audio,
    read_audio_bytes,
    resolve_audio_format,
    write_audio,
    write_json_atomic,
    write_text_atomic,
)
from speechctl.audio import io as audio_io
from speechctl.errors import InputError

RATE = 16000


def tone(seconds: float = 0.5, rate: int = RATE, freq: float = 440.0) -> np.ndarray:
    """A float32 sine at half scale."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def leftovers(directory) -> list[str]:
    """Names of temp files that an atomic write left behind in ``directory``."""
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


def fake_stdio(monkeypatch, name: str, data: bytes = b"") -> io.BytesIO:
    """Replace sys.<name> by an object whose .buffer is a BytesIO; return that buffer."""
    buf = io.BytesIO(data)
    monkeypatch.setattr(sys, name, types.SimpleNamespace(buffer=buf))
    return buf


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_round_trip(tmp_path, ext):
    wave = tone()
    path = tmp_path / f"x.{ext}"
    write_audio(path, wave, RATE)
    info = sf.info(str(path))
    assert info.format == ext.upper() and info.subtype == "PCM_16" and info.channels == 1
    back = read_audio(path, RATE)
    assert back.dtype == np.float32 and back.shape == wave.shape
    assert np.max(np.abs(back - wave)) < 1e-3  # 16-bit quantisation
    assert leftovers(tmp_path) == []


def test_explicit_format_overrides_unknown_extension(tmp_path):
    path = tmp_path / "x.audio"
    write_audio(path, tone(), RATE, fmt="FLAC")
    assert sf.info(str(path)).format == "FLAC"


def test_clips_to_unit_range_and_zeroes_nan(tmp_path):
    path = tmp_path / "loud.wav"
    write_audio(path, np.array([2.0, -3.0, 0.25, np.nan], dtype=np.float32), RATE)
    back = read_audio(path, RATE)
    assert back[0] == pytest.approx(1.0, abs=1e-4) and back[1] == pytest.approx(-1.0, abs=1e-4)
    assert back[2] == pytest.approx(0.25, abs=1e-4) and back[3] == 0.0


@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_zero_length_writes_a_valid_empty_file(tmp_path, ext):
    path = tmp_path / f"empty.{ext}"
    write_audio(path, np.zeros(0, dtype=np.float32), RATE)
    info = sf.info(str(path))
    assert info.format == ext.upper() and info.samplerate == RATE
    if ext == "wav":
        assert info.frames == 0
    with pytest.raises(InputError, match=r"empty\.%s: contains no audio" % ext):
        read_audio(path, RATE)


def test_stereo_44k_becomes_mono_16k(tmp_path):
    rate_in, seconds = 44100, 1.0
    left = tone(seconds, rate_in, 300.0)
    stereo = np.stack([left, left * 0.5], axis=1)
    path = tmp_path / "stereo.wav"
    sf.write(str(path), stereo, rate_in, subtype="PCM_16")
    mono = read_audio(path, RATE)
    assert mono.dtype == np.float32 and mono.ndim == 1
    assert abs(len(mono) - round(seconds * RATE)) <= 1
    # mean of the channels = 0.75 * left; compare RMS away from the edges
    rms = np.sqrt(np.mean(mono[1000:-1000] ** 2))
    assert rms == pytest.approx(0.75 * 0.5 / np.sqrt(2), rel=0.02)


def test_duration_seconds():
    assert duration_seconds(np.zeros(24000), RATE) == 1.5
    assert duration_seconds(np.zeros(0), RATE) == 0.0


# ------------------------------------------------------------------ stdin / stdout


def test_read_from_stdin(monkeypatch):
    buf = io.BytesIO()
    sf.write(buf, tone(), 8000, format="WAV", subtype="PCM_16")
    fake_stdio(monkeypatch, "stdin", buf.getvalue())
    wave = read_audio("-", RATE)
    assert wave.dtype == np.float32
    assert abs(len(wave) - len(tone()) * 2) <= 1  # 8000 samples at 8 kHz = 1 s = 16000 at 16 kHz


def test_write_to_stdout_defaults_to_wav(monkeypatch):
    out = fake_stdio(monkeypatch, "stdout")
    write_audio("-", tone(), RATE)
    data = out.getvalue()
    assert data[:4] == b"RIFF"
    assert read_audio_bytes(data, RATE, "stdout").shape == tone().shape


def test_write_flac_to_stdout(monkeypatch):
    out = fake_stdio(monkeypatch, "stdout")
    write_audio("-", tone(), RATE, fmt="flac")
    assert out.getvalue()[:4] == b"fLaC"


# ------------------------------------------------------------------ read errors


def assert_one_line_error(excinfo, name: str, *fragments: str) -> None:
    msg = str(excinfo.value)
    assert "\n" not in msg and name in msg, msg
    for fragment in fragments:
        assert fragment in msg, msg


def test_missing_file(tmp_path):
    path = tmp_path / "nope.wav"
    with pytest.raises(InputError) as e:
        read_audio(path, RATE)
    assert_one_line_error(e, str(path), "no such file")


def test_directory(tmp_path):
    with pytest.raises(InputError) as e:
        read_audio(tmp_path, RATE)
    assert_one_line_error(e, str(tmp_path), "is a directory")


def test_non_audio_file(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio, just some text\n" * 20)
    with pytest.raises(InputError) as e:
        read_audio(path, RATE)
    assert_one_line_error(e, str(path), "not a supported audio file")
    assert "BytesIO" not in str(e.value) and "BufferedReader" not in str(e.value)


def test_corrupt_header(tmp_path):
    path = tmp_path / "corrupt.wav"
    write_audio(path, tone(), RATE)
    data = bytearray(path.read_bytes())
    data[8:16] = b"XXXXXXXX"  # break "WAVEfmt "
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as e:
        read_audio(path, RATE)
    assert_one_line_error(e, str(path), "not a supported audio file")


def test_empty_file(tmp_path):
    path = tmp_path / "zero.wav"
    path.write_bytes(b"")
    with pytest.raises(InputError) as e:
        read_audio(path, RATE)
    assert_one_line_error(e, str(path), "empty file")


def test_empty_stdin_names_stdin(monkeypatch):
    fake_stdio(monkeypatch, "stdin", b"")
    with pytest.raises(InputError) as e:
        read_audio("-", RATE)
    assert_one_line_error(e, "stdin", "empty")


def test_zero_samples(tmp_path):
    path = tmp_path / "silence.wav"
    sf.write(str(path), np.zeros(0, dtype=np.float32), RATE, subtype="PCM_16")
    with pytest.raises(InputError) as e:
        read_audio(path, RATE)
    assert_one_line_error(e, str(path), "0 samples")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_samples(tmp_path, bad):
    path = tmp_path / "nan.wav"
    wave = tone()
    wave[10] = bad
    sf.write(str(path), wave, RATE, subtype="FLOAT")
    with pytest.raises(InputError) as e:
        read_audio(path, RATE)
    assert_one_line_error(e, str(path), "NaN or infinite")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path):
    path = tmp_path / "secret.wav"
    write_audio(path, tone(), RATE)
    path.chmod(0)
    with pytest.raises(InputError) as e:
        read_audio(path, RATE)
    assert_one_line_error(e, str(path), "cannot read")


# ------------------------------------------------------------------ write errors


@pytest.mark.parametrize(
    "name, fmt, fragment",
    [
        ("x.mp3", None, "unsupported output extension (.mp3)"),
        ("x", None, "no extension"),
        ("x.wav", "ogg", "unsupported audio format 'ogg'"),
        ("x.wav", "flac", "does not match"),
    ],
)
def test_bad_output_format(tmp_path, name, fmt, fragment):
    path = tmp_path / name
    with pytest.raises(InputError) as e:
        write_audio(path, tone(), RATE, fmt=fmt)
    assert_one_line_error(e, str(path), fragment)
    assert os.listdir(tmp_path) == []


def test_resolve_audio_format():
    assert resolve_audio_format("-") == "wav"
    assert resolve_audio_format("a/b.FLAC") == "flac"
    assert resolve_audio_format("a/b.out", "wav") == "wav"


def test_missing_output_directory(tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "x.wav"
    with pytest.raises(InputError) as e:
        write_audio(path, tone(), RATE)
    assert_one_line_error(e, str(path), "does not exist")


def test_output_is_a_directory(tmp_path):
    path = tmp_path / "taken.wav"
    path.mkdir()
    with pytest.raises(InputError) as e:
        write_audio(path, tone(), RATE)
    assert_one_line_error(e, str(path), "is a directory")
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------ atomicity


def exploding_write(*args, **kwargs):
    """Stand-in for soundfile.write that writes some bytes, then fails like a crash would."""
    args[0].write(b"RIFF-partial-data")
    raise RuntimeError("simulated crash while encoding")


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(audio_io.sf, "write", exploding_write)
    path = tmp_path / "new.wav"
    with pytest.raises(RuntimeError, match="simulated crash"):
        write_audio(path, tone(), RATE)
    assert not path.exists()
    assert os.listdir(tmp_path) == []


def test_failed_write_keeps_old_content(tmp_path, monkeypatch):
    path = tmp_path / "old.flac"
    write_audio(path, tone(), RATE)
    before = path.read_bytes()
    monkeypatch.setattr(audio_io.sf, "write", exploding_write)
    with pytest.raises(RuntimeError):
        write_audio(path, tone(0.1), RATE)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["old.flac"]


def test_interrupt_cleans_up_temp(tmp_path):
    def interrupted(f):
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "t.txt", interrupted)
    assert os.listdir(tmp_path) == []


def test_failed_rename_cleans_up_temp(tmp_path, monkeypatch):
    path = tmp_path / "r.txt"
    path.write_text("old")

    def no_replace(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(audio_io.os, "replace", no_replace)
    with pytest.raises(InputError) as e:
        write_text_atomic(path, "new")
    assert_one_line_error(e, str(path), "Permission denied")
    assert path.read_text() == "old" and leftovers(tmp_path) == []


def test_atomic_write_uses_normal_permissions(tmp_path):
    if os.name != "posix":
        pytest.skip("POSIX permissions")
    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "p.txt", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "p.txt").stat().st_mode & 0o777 == 0o644


def test_text_and_json_helpers(tmp_path):
    write_text_atomic(tmp_path / "a.txt", "héllo\n")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    write_json_atomic(tmp_path / "a.json", {"text": "héllo", "n": [1, 2]})
    assert json.loads((tmp_path / "a.json").read_text(encoding="utf-8")) == {
        "text": "héllo",
        "n": [1, 2],
    }
    write_text_atomic(tmp_path / "a.txt", "replaced")
    assert (tmp_path / "a.txt").read_text() == "replaced"
    assert leftovers(tmp_path) == []
