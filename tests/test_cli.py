"""The command line end to end on the embedded default model (random weights)."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from speechctl.cli import cli

SAMPLES = Path(__file__).parent.parent / "samples"
pytestmark = pytest.mark.engine


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def one_line_error(result, *fragments):
    assert result.exit_code != 0
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_help_imports_no_torch_or_vllm():
    code = (
        "import sys; from click.testing import CliRunner; from speechctl.cli import cli;"
        "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0, r.output;"
        "assert 'tts' in r.output and 'batch' in r.output;"
        "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_readme_command_writes_a_wav(tmp_path):
    """`speechctl tts "Hello world" -o hello.wav`, as a real process."""
    exe = Path(sys.executable).parent / "speechctl"
    env = {**os.environ, "SPEECHCTL_CACHE": os.environ["SPEECHCTL_CACHE"]}
    proc = subprocess.run(
        [str(exe), "tts", "Hello world", "-o", "hello.wav"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(tmp_path / "hello.wav")
    assert rate == 16000 and audio.ndim == 1 and len(audio) > 0
    # what the user reads is speechctl's own: the file it wrote and its notice, no library's logs
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    assert said and said[0].startswith("hello.wav: ") and all(line.startswith(("hello.wav: ", "note: ")) for line in said), proc.stderr


def test_the_console_script_ends_at_once_with_everything_said(tmp_path):
    """After the command, the process exits without Python's teardown of vLLM and torch
    (speechctl.cli.leave): what it wrote to stdout arrives whole, the exit status is the
    command's, and an atexit handler (the teardown's first step) never runs."""
    exe = Path(sys.executable).parent / "speechctl"
    proc = subprocess.run([str(exe), "tts", "Piped out.", "--seed", "3", "--max-seconds", "0.4", "-o", "-"],
                          cwd=tmp_path, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    piped, rate = sf.read(io.BytesIO(proc.stdout))
    assert rate == 16000 and len(piped) > 0
    written = run("tts", "Piped out.", "--seed", "3", "--max-seconds", "0.4", "-o", str(tmp_path / "same.wav"))
    assert written.exit_code == 0 and np.array_equal(sf.read(tmp_path / "same.wav")[0], piped)
    failed = subprocess.run([str(exe), "asr", "missing.wav", str(SAMPLES / "asr" / "13.flac"), "--model", "tiny"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1] == "Error: missing.wav: no such file"
    assert failed.stdout.strip()  # the readable file's transcript came out before the error's exit
    code = ("import atexit, sys; from speechctl.cli import main;"
            "atexit.register(lambda: print('TEARDOWN', file=sys.stderr)); main()")
    quick = subprocess.run([sys.executable, "-c", code, "tts", "Quick.", "--max-seconds", "0.2", "-o", "q.wav"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert quick.returncode == 0 and (tmp_path / "q.wav").is_file() and "TEARDOWN" not in quick.stderr, quick.stderr
    plain = subprocess.run([sys.executable, "-c", code, "models"], cwd=tmp_path, capture_output=True, text=True)
    assert plain.returncode == 0 and "TEARDOWN" in plain.stderr  # no vLLM loaded: Python's own exit


def test_tts_stdin_to_stdout_and_flac(tmp_path):
    result = run("tts", "-", "-o", "-", input="Text from stdin.\n")
    assert result.exit_code == 0, result.stderr
    audio, rate = sf.read(io.BytesIO(result.stdout_bytes))
    assert rate == 16000 and len(audio) > 0
    result = run("tts", "flac please", "-o", str(tmp_path / "a.flac"))
    assert result.exit_code == 0, result.stderr
    assert sf.info(str(tmp_path / "a.flac")).format == "FLAC"


def test_tts_seed_reproduces_sampling(tmp_path):
    args = ["--audio-temperature", "1.0", "--audio-top-k", "20"]
    paths = [tmp_path / f"{name}.wav" for name in ("a", "b", "c")]
    for path, seed in zip(paths, ("7", "7", "8")):
        result = run("tts", "Same text each time.", "-o", str(path), "--seed", seed, *args)
        assert result.exit_code == 0, result.stderr
    a, b, c = (sf.read(p)[0] for p in paths)
    np.testing.assert_array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a, c)


def test_tts_with_a_stereo_44k_voice(tmp_path):
    t = np.linspace(0, 1.0, 44100, endpoint=False)
    stereo = np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 330 * t)], axis=1) * 0.3
    sf.write(tmp_path / "voice.wav", stereo, 44100)
    result = run("tts", "In that voice.", "-o", str(tmp_path / "out.wav"), "--voice", str(tmp_path / "voice.wav"))
    assert result.exit_code == 0, result.stderr
    assert sf.info(str(tmp_path / "out.wav")).frames > 0


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["tts", "", "-o", "x.wav"], ["empty text"]),
        (["tts", "hi", "-o", "x.mp3"], ["x.mp3", ".mp3"]),
        (["tts", "hi", "-o", "x.wav", "--voice", "missing.wav"], ["missing.wav", "no such file"]),
        (["tts", "hi", "-o", "x.wav", "--voice", "notaudio.wav"], ["notaudio.wav", "not a supported audio file"]),
        (["tts", "hi", "-o", "x.wav", "--model", "no-such-model"], ["unknown model 'no-such-model'"]),
        (["asr", "missing.wav"], ["missing.wav", "no such file"]),
        (["batch", "missing.jsonl", "--out-dir", "out"], ["missing.jsonl"]),
        (["models", "no-such-model"], ["unknown model"]),
    ],
)
def test_bad_input_gives_one_line_errors(tmp_path, monkeypatch, args, fragments):
    monkeypatch.chdir(tmp_path)
    Path("notaudio.wav").write_text("this is not audio")
    one_line_error(run(*args), *fragments)
    assert not Path("x.wav").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["tts", "hi", "-o", "no/dir/x.wav"],
        ["tts", "hi", "--stream", "-o", "no/dir/x.wav"],
        ["chat", "--input", "in.wav", "--output", "no/dir/x.wav"],
    ],
)
def test_an_unwritable_output_fails_before_any_model_loads(tmp_path, monkeypatch, args):
    import speechctl.api

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(speechctl.api, "shared", lambda *a: pytest.fail("a model was loaded"))
    one_line_error(run(*args), "no/dir/x.wav", "cannot write", "does not exist")


def test_asr_reports_bad_files_and_transcribes_the_rest(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....WAVEjunk")
    hello = str(SAMPLES / "hello.wav")
    result = run("asr", hello, str(bad), hello, "--format", "json", "--model", "tiny")  # the speech-LM path
    assert result.exit_code == 1
    rows = json.loads(result.stdout)
    assert [r["file"] for r in rows] == [hello, str(bad), hello]
    assert rows[0]["error"] is None and isinstance(rows[0]["text"], str)
    assert rows[0]["text"] == rows[2]["text"]  # greedy: same audio, same transcript
    assert "bad.wav" in rows[1]["error"]
    assert "bad.wav" in result.stderr


def test_batch_runs_good_items_names_bad_lines_and_resumes(tmp_path):
    out = tmp_path / "out"
    result = run("batch", str(SAMPLES / "broken.jsonl"), "--out-dir", str(out))
    assert result.exit_code == 1
    assert "broken.jsonl:3: item 'empty'" in result.stderr
    assert "broken.jsonl:5" in result.stderr
    records = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]
    ok = {r["id"] for r in records if r["status"] == "ok"}
    good = [json.loads(l)["id"] for l in (SAMPLES / "manifest.jsonl").read_text().splitlines() if l.strip()]
    assert ok == set(good)
    for r in records:
        if r["status"] == "ok":
            assert (out / r["output"]).is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "temporary files left behind"
    asr = next(r for r in records if r["task"] == "asr")
    assert (out / asr["output"]).read_text().strip() == asr["text"].strip()

    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.suffix in (".wav", ".flac", ".txt")}
    again = run("batch", str(SAMPLES / "manifest.jsonl"), "--out-dir", str(out))
    assert again.exit_code == 0, again.stderr
    assert f"{len(good)} item(s) already done" in again.stderr
    after = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.suffix in (".wav", ".flac", ".txt")}
    assert before == after


def test_models_list_and_describe():
    result = run("models")
    assert result.exit_code == 0 and "tiny" in result.stdout
    result = run("models", "tiny")
    assert result.exit_code == 0
    assert "codebooks" in result.stdout and "dac" in result.stdout


def test_inputs_too_long_for_the_model_are_named(tmp_path):
    long_wav = tmp_path / "long.wav"
    sf.write(long_wav, np.random.default_rng(0).normal(0, 0.1, 16000 * 100).astype("float32"), 16000)
    result = run("asr", str(long_wav), "--model", "tiny")  # Whisper would cut it into windows
    one_line_error(result, "long.wav", "does not fit max_model_len")
    # Text too long for one request is spoken in pieces (tests/test_long_text.py), not refused
    result = run("tts", "word " * 1000, "-o", str(tmp_path / "x.wav"), "--max-seconds", "0.1")
    assert result.exit_code == 0, result.stderr
    assert sf.info(str(tmp_path / "x.wav")).duration > 20 * 0.1  # ~25 pieces of 200 characters


def test_tts_with_cfg_from_the_command_line_and_a_manifest(tmp_path):
    out = tmp_path / "cfg.wav"
    result = run("tts", "Guided speech.", "-o", str(out), "--cfg", "3", "--cfg-top-k", "20", "--seed", "1")
    assert result.exit_code == 0, result.stderr
    assert sf.info(str(out)).frames > 0
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        '{"id": "g", "task": "tts", "text": "Guided.", "cfg": 2.5, "cfg_streams": "audio"}\n'
        '{"id": "bad", "task": "tts", "text": "x", "cfg_streams": "video"}\n'
    )
    result = run("batch", str(manifest), "--out-dir", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert "m.jsonl:2: item 'bad': 'cfg_streams' must be" in result.stderr
    assert (tmp_path / "o" / "g.wav").is_file()


def test_sampling_flags_act_on_what_tts_generates(tmp_path):
    """--temperature sets the audio codebooks for tts (the only streams it samples): greedy is the
    same whatever the seed, sampling hot is not; the generated codes can be written beside."""
    outs = {}
    for name, flags in {"greedy1": ["--temperature", "0", "--seed", "1"], "greedy2": ["--temperature", "0", "--seed", "2"],
                        "hot1": ["--temperature", "1.5", "--seed", "1"], "hot2": ["--temperature", "1.5", "--seed", "2"]}.items():
        wav, codes = tmp_path / f"{name}.wav", tmp_path / f"{name}.npy"
        result = run("tts", "Sampling flags.", "-o", str(wav), "--codes-out", str(codes), "--max-seconds", "0.5", *flags)
        assert result.exit_code == 0, result.stderr
        outs[name] = np.load(codes)
        audio, rate = sf.read(wav)
        assert outs[name].shape[0] == 4 and len(audio) == outs[name].shape[1] * 320
    np.testing.assert_array_equal(outs["greedy1"], outs["greedy2"])
    assert not np.array_equal(outs["hot1"], outs["hot2"])
    assert not np.array_equal(outs["greedy1"], outs["hot1"])


def test_the_random_default_model_says_it_is_noise(tmp_path):
    result = run("tts", "Hi.", "-o", str(tmp_path / "hi.wav"), "--max-seconds", "0.2")
    assert result.exit_code == 0 and "random weights: its audio is noise" in result.stderr


def test_asr_refuses_audio_sampling_flags(tmp_path):
    result = run("asr", str(SAMPLES / "asr" / "13.flac"), "--audio-temperature", "0.5")
    one_line_error(result, "--audio-temperature", "asr generates text")


def test_a_speech_lm_refuses_whisper_flags_rather_than_ignore_them():
    result = run("asr", str(SAMPLES / "asr" / "13.flac"), "--model", "tiny", "--beam-size", "3",
                 "--temperature-increment-on-fallback", "none")
    one_line_error(result, "--beam-size, --temperature-increment-on-fallback", "tiny is a speech LM")


def test_a_batch_on_a_speech_lm_refuses_whisper_flags_and_fields(tmp_path):
    manifest = tmp_path / "m.jsonl"
    hello = str(SAMPLES / "asr" / "13.flac")
    manifest.write_text(json.dumps({"id": "plain", "task": "asr", "audio": hello}) + "\n"
                        + json.dumps({"id": "beam", "task": "asr", "audio": hello, "beam_size": 3}) + "\n")
    result = run("batch", str(manifest), "--out-dir", str(tmp_path / "out"), "--model", "tiny", "--beam-size", "3")
    one_line_error(result, "--beam-size", "tiny is a speech LM")
    assert not (tmp_path / "out").exists()  # refused before anything ran
    result = run("batch", str(manifest), "--out-dir", str(tmp_path / "out"), "--model", "tiny")
    assert result.exit_code == 1
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert records["plain"]["status"] == "ok"
    assert records["beam"]["error"] == "'beam_size': a Whisper decoding option; this batch's ASR items run on a speech LM"


def test_codes_out_needs_one_shot(tmp_path):
    result = run("tts", "Hi.", "--stream", "-o", str(tmp_path / "x.wav"), "--codes-out", str(tmp_path / "c.npy"))
    one_line_error(result, "--codes-out")


def test_batch_item_writes_its_codes_beside_the_audio(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "task": "tts", "text": "Codes too.", "max_seconds": 0.3, "codes_out": True}) + "\n"
                        + json.dumps({"id": "b", "task": "tts", "text": "Bad flag.", "codes_out": "yes"}) + "\n")
    result = run("batch", str(manifest), "--out-dir", str(tmp_path / "out"))
    assert result.exit_code == 1  # item b is refused, item a runs
    codes = np.load(tmp_path / "out" / "a.codes.npy")
    audio, _ = sf.read(tmp_path / "out" / "a.wav")
    assert codes.shape[0] == 4 and len(audio) == codes.shape[1] * 320
    assert "'codes_out' must be true or false" in result.stderr
