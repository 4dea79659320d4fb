"""The shipped default voice speaks (issue 20, item 7): what it says, Whisper (speechctl's own
whisper-tiny.en) hears. Each bar is relative to the synthesizer the voice learned from: espeak-ng's
own audio of the same held-out sentences, transcribed by the same Whisper, is the baseline (tiny.en
misreads espeak-ng itself). Runs where the install ships the voice (speechctl/voices/default/) and
espeak-ng is installed (`make install` sets up both); skipped otherwise, with the reason."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import speechctl.voices as voices  # noqa: E402
from recipes.voice.evaluate import transcribe, wer  # noqa: E402  (jiwer on lower-cased words)

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(voices.unavailable() is not None, reason=str(voices.unavailable())),
]
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")

SENTENCES = 40  # of the recipe's 203 held-out ones: enough for a WER to mean something, a minute here
SEED = 1234


@pytest.fixture(scope="module")
def voice(engines_of_this_module):
    """speechctl's default model, as `Speech()` gives it to a user who names none."""
    import os

    from speechctl.api import Speech

    saved = os.environ.pop("SPEECHCTL_MODEL", None)
    try:
        speech = Speech()
    finally:
        if saved is not None:
            os.environ["SPEECHCTL_MODEL"] = saved
    assert speech.checkpoint.name == "voice"
    yield speech
    speech.close()


@pytest.fixture(scope="module")
def whisper():
    from speechctl.api import load_asr

    asr = load_asr("whisper-tiny.en")
    yield asr
    asr.close()


def heldout() -> list[str]:
    from recipes.voice.config import DataConfig
    from recipes.voice.text import make_corpus

    recipe = voices.provenance().get("recipe", {})
    config = DataConfig(**recipe["data"]) if "data" in recipe else DataConfig()
    return make_corpus(config).heldout[:SENTENCES]


def say(voice, texts: list[str], seed: int = SEED) -> list[np.ndarray]:
    from speechctl.api import TtsJob

    results = {r.id: r for r in voice.run(TtsJob(id=str(i), text=t, seed=seed + i) for i, t in enumerate(texts))}
    assert all(r.error is None for r in results.values()), [r.error for r in results.values() if r.error]
    return [results[str(i)].audio for i in range(len(texts))]


# Issue 20's bars, which the shipped voice does not meet yet (the LM is still training): each is
# asserted as an expected failure (strict: a voice that meets one fails its test, and the mark goes),
# beside a bar the voice meets today, so that a broken voice (noise: WER ~1) fails either way.
NOT_YET = "issue 20: the step-17,320 voice does not meet this bar yet (docs/voice/lm-progress.md)"


@pytest.fixture(scope="module")
def heard_heldout(voice, whisper):
    """(WER of espeak-ng's own audio, WER of the voice) on the held-out sentences."""
    from recipes.voice.config import DataConfig
    from recipes.voice.data import utterance

    texts = heldout()
    config = DataConfig(**voices.provenance()["recipe"]["data"])
    espeak = [utterance(t, config)[0].astype(np.float32) / 32768.0 for t in texts]
    ours = say(voice, texts)
    return wer(texts, transcribe(espeak, whisper, config.sample_rate)), wer(texts, transcribe(ours, whisper, voice.sample_rate))


@needs_espeak
def test_held_out_sentences_are_heard_within_twenty_five_points_of_the_synthesizer(heard_heldout):
    wer_espeak, wer_voice = heard_heldout  # step 17,320: 0.340 against 0.201 (15,206: 0.368)
    assert wer_voice <= wer_espeak + 0.25, f"voice {wer_voice:.3f} vs espeak-ng {wer_espeak:.3f}"


@needs_espeak
@pytest.mark.xfail(strict=True, reason=NOT_YET)
def test_held_out_sentences_are_heard_within_five_points_of_the_synthesizer(heard_heldout):
    wer_espeak, wer_voice = heard_heldout
    assert wer_voice <= wer_espeak + 0.05, f"voice {wer_voice:.3f} vs espeak-ng {wer_espeak:.3f}"


FOX = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def fox_through_the_cli(tmp_path_factory):
    """The issue's acceptance commands, as a user types them (the default model, no flags but a
    seed): (tts's result, asr's result)."""
    import os

    from speechctl import api
    from speechctl.cli import cli

    here = os.getcwd()
    saved = os.environ.pop("SPEECHCTL_MODEL", None)
    # in the folder of fox.wav, as typed: ASR's fallback sampling is keyed by the job's name, the
    # path given (a temporary folder's path in it drew other samples in every run)
    os.chdir(tmp_path_factory.mktemp("fox"))
    try:
        spoken = CliRunner().invoke(cli, ["tts", FOX, "-o", "fox.wav", "--seed", "1"], catch_exceptions=False)
        heard = CliRunner().invoke(cli, ["asr", "fox.wav"], catch_exceptions=False)
    finally:
        os.chdir(here)
        api.close_shared()  # the CLI's engine for "no model" is the voice's: not for later tests
        if saved is not None:
            os.environ["SPEECHCTL_MODEL"] = saved
    return spoken, heard


def test_the_fox_through_the_cli_is_spoken_by_the_voice(fox_through_the_cli):
    from recipes.voice.evaluate import word_errors

    spoken, heard = fox_through_the_cli
    assert spoken.exit_code == 0 and heard.exit_code == 0, spoken.stderr + heard.stderr
    assert "noise" not in spoken.stderr  # the default is the voice, not the random `tiny`
    # one seed is one draw (step 17,320 at seed 1, 0.5 / 10: "But mid-ground fac Stumbs over the
    # leavey nam."; 0.2 / 10: two words wrong): what the voice reads in
    # general is the next test's, over many seeds; here, that Whisper heard words of the fox
    assert word_errors(FOX, heard.stdout) <= 8, heard.stdout


SHORT_SEEDS = 64  # one machine's 16 seeds swung from 12 of 16 "Hello world" exact to 1 of 16


@pytest.fixture(scope="module")
def short_texts_across_seeds(voice, whisper):
    """The fox and "Hello world" (the README's first command), each said at seeds 0-15 in one
    batch: {text: word errors by seed}."""
    from recipes.voice.evaluate import word_errors

    errors = {}
    for text in (FOX, "Hello world"):
        heard = transcribe(say(voice, [text] * SHORT_SEEDS, seed=0), whisper, voice.sample_rate)
        errors[text] = [word_errors(text, h) for h in heard]
    return errors


def test_short_texts_are_read_across_seeds(short_texts_across_seeds):
    """Bars the voice meets wherever it runs; noise reads at about every word wrong (the fox 9 of
    9, "Hello world" 2 of 2, never exactly). The same seeds draw differently on another CPU (its
    kernels round differently, and one flipped token changes the rest of the draw), so the bars
    sit below the voice's rates over 64 seeds on every CPU measured, not at one machine's draw of
    16. Step 17,320 at the voice's 0.2 / 10 (lm-progress.md): on an AVX2 EPYC (bfloat16
    emulated) "Hello world" 1.36 of 2 words wrong, exactly at 26 of 64, the fox 3.61 of 9, at
    most one wrong at 21 of 64; on an AVX-512 EPYC with bfloat16 in hardware 1.70, exactly at 15
    of 64 (blocks of 16: 1, 6, 3, 5), the fox 3.50, 13 of 64. An AVX-512 Xeon drew 12 of 16 exact
    at seeds 0-15. Since the voice follows on from its voice prompt (fifty-third session), on
    the AVX-512 EPYC "Hello world" is heard exactly at 64 of 64 seeds and the fox within one word
    at 19 (2.81 of 9 wrong): the bar on "Hello world" is raised, not yet to what one CPU drew."""
    fox, hello = short_texts_across_seeds[FOX], short_texts_across_seeds["Hello world"]
    assert np.mean(fox) <= 5.0 and sum(e <= 1 for e in fox) >= 6, fox
    assert np.mean(hello) <= 0.5 and hello.count(0) >= 40, hello


# Not strict: this is one draw (seed 1), and the same seed draws differently on another CPU (see
# the next test); the voice reads the fox within one word at about a third of its draws, so some
# machines' draw passes (an AVX-512 Xeon's in the forty-sixth session's CI) and most fail. The rate
# over many seeds is test_short_texts_are_read_across_seeds's.
@pytest.mark.xfail(strict=False, reason=NOT_YET + "; one draw, machine-dependent")
def test_the_fox_through_the_cli_has_at_most_one_word_wrong(fox_through_the_cli):
    from recipes.voice.evaluate import word_errors

    _, heard = fox_through_the_cli
    assert word_errors(FOX, heard.stdout) <= 1, heard.stdout


def test_streamed_speech_is_the_one_shot_speech(voice, whisper):
    """Chunks joined = the one-shot waveform (same seed, same codes), so the transcripts agree."""
    texts = heldout()[:4]
    whole = say(voice, texts)
    from speechctl.api import TtsJob

    pieces: dict[str, list[np.ndarray]] = {}
    for chunk in voice.stream_tts([TtsJob(id=str(i), text=t, seed=SEED + i) for i, t in enumerate(texts)]):
        assert chunk.error is None, chunk.error
        pieces.setdefault(chunk.id, []).append(chunk.audio)
    streamed = [np.concatenate(pieces[str(i)]) for i in range(len(texts))]
    for a, b in zip(whole, streamed):
        assert len(a) == len(b) and np.max(np.abs(a - b)) < 1e-3
    assert transcribe(whole, whisper, voice.sample_rate) == transcribe(streamed, whisper, voice.sample_rate)


@pytest.fixture(scope="module")
def batch_of_twenty(voice, whisper, tmp_path_factory):
    """`speechctl batch` of 20 held-out sentences: (texts, transcripts)."""
    import json

    from speechctl.cli import cli

    tmp = tmp_path_factory.mktemp("batch")
    texts = heldout()[:20]
    manifest = tmp / "items.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"s{i}", "task": "tts", "text": t, "seed": i}) + "\n" for i, t in enumerate(texts)))
    try:
        result = CliRunner().invoke(cli, ["batch", str(manifest), "--out-dir", str(tmp / "out"), "--model", "voice"],
                                    catch_exceptions=False)
    finally:
        from speechctl import api

        api.close_shared()  # the CLI's engines stay open within a process: not for later tests
    assert result.exit_code == 0, result.stderr
    waves = [sf.read(tmp / "out" / f"s{i}.wav", dtype="float32")[0] for i in range(len(texts))]
    assert all(len(w) > 0 for w in waves)
    return texts, transcribe(waves, whisper, voice.sample_rate)


@needs_espeak
def test_a_batch_of_twenty_is_heard_as_a_set(batch_of_twenty, heard_heldout):
    """The batch's items, written by `speechctl batch`, heard about as the same sentences said
    one by one (the batch path loses nothing)."""
    texts, heard = batch_of_twenty
    _, wer_voice = heard_heldout
    assert wer(texts, heard) <= wer_voice + 0.15, list(zip(texts, heard))


@pytest.mark.xfail(strict=True, reason=NOT_YET)
def test_a_batch_of_twenty_is_intelligible_item_by_item(batch_of_twenty):
    """Every item's transcript within twice the set's WER bar."""
    texts, heard = batch_of_twenty
    per_item = [wer([t], [h]) for t, h in zip(texts, heard)]
    assert max(per_item) <= 0.5, list(zip(texts, heard, per_item))


def test_a_three_hundred_word_paragraph_comes_out_whole(voice, whisper):
    """Pasted prose, split at sentences by speechctl, spoken in order: its transcript within the
    short sentences' WER + 5 points."""
    texts = heldout()
    paragraph, n = [], 0
    for t in texts:
        paragraph.append(t if t.endswith((".", "!", "?")) else t + ".")
        n += len(t.split())
        if n >= 300:
            break
    paragraph = " ".join(paragraph)
    result = voice.tts(paragraph, seed=SEED)
    assert not result.warnings, result.warnings  # nothing cut
    short = wer(texts[:10], transcribe(say(voice, texts[:10]), whisper, voice.sample_rate))
    # Whisper hears 30 s at a time: the paragraph is transcribed in its sentence-sized pieces' order
    heard = " ".join(transcribe(_windows(result.audio, voice.sample_rate), whisper, voice.sample_rate))
    assert wer([paragraph], [heard]) <= short + 0.05


def _windows(audio: np.ndarray, rate: int, seconds: float = 25.0) -> list[np.ndarray]:
    """Cut at the quietest point near every ``seconds`` so that no word is split between windows."""
    out, start, step = [], 0, int(seconds * rate)
    while len(audio) - start > step:
        lo, hi = start + step - rate * 3, start + step
        frame = rate // 50
        energy = [np.sum(audio[i:i + frame] ** 2) for i in range(lo, hi, frame)]
        cut = lo + frame * int(np.argmin(energy))
        out.append(audio[start:cut])
        start = cut
    out.append(audio[start:])
    return out
