"""The staged pipeline: phrase splitting, end-of-utterance detection, and stages on real engines
(tiny-lm -> tiny TTS): TTS starts on the LM's first phrase, the reply audio is the phrases' one-shot
TTS in order, an empty transcript gives no reply, a cancel leaves no engine work behind."""

from __future__ import annotations

import numpy as np
import pytest

RATE = 16000


pytestmark = pytest.mark.usefixtures("engines_of_this_module")  # tests/conftest.py


# -- phrases --------------------------------------------------------------------------------------


def feed(splitter, text, step=1):
    out = []
    for i in range(0, len(text), step):
        out += splitter.push(text[i : i + step])
    return out, splitter.finish()


def test_phrases_end_at_punctuation_as_soon_as_it_is_followed_by_space():
    from speechctl.pipeline.phrases import PhraseSplitter

    splitter = PhraseSplitter(min_chars=12)
    assert splitter.push("Hello there.") == []  # could be "there.5": wait for the next character
    assert splitter.push(" How") == ["Hello there."]
    out, rest = feed(splitter, " are you doing today, my friend? Fine: thanks")
    assert out == ["How are you doing today,", "my friend?"] and rest == ["Fine: thanks"]


def test_phrases_without_punctuation_are_cut_at_spaces_first_one_short():
    from speechctl.pipeline.phrases import PhraseSplitter

    words = " ".join(f"word{i}" for i in range(60))
    out, rest = feed(PhraseSplitter(first_max_chars=20, max_chars=60), words, step=7)
    assert len(out[0]) <= 20 and all(len(p) <= 60 for p in out)
    assert " ".join(out + rest) == words  # nothing lost, nothing doubled
    out, rest = feed(PhraseSplitter(first_max_chars=10, max_chars=10), "x" * 35)
    assert out + rest == ["x" * 10] * 3 + ["x" * 5]  # no space at all: hard cuts


# -- VAD --------------------------------------------------------------------------------------------


def tone(seconds, level=0.3):
    t = np.arange(int(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def silence(seconds):
    return np.zeros(int(seconds * RATE), np.float32)


def test_vad_ends_an_utterance_after_the_silence_and_skips_blips():
    from speechctl.pipeline.vad import EnergyVad, Skipped, SpeechStart, Utterance, VadConfig

    vad = EnergyVad(RATE, VadConfig(silence_ms=300, start_ms=60, min_speech_ms=200, preroll_ms=100))
    audio = np.concatenate([silence(0.5), tone(0.1), silence(0.5), tone(1.0), silence(0.2), tone(0.3), silence(0.6)])
    events, times = [], []
    for i in range(0, len(audio), 320):  # 20 ms microphone blocks
        for event in vad.push(audio[i : i + 320]):
            events.append(event)
            times.append((i + 320) / RATE)
    kinds = [type(e) for e in events]
    assert kinds == [SpeechStart, Skipped, SpeechStart, Utterance]
    assert times[0] == pytest.approx(0.56, abs=0.021)  # start_ms into the blip
    assert times[1] == pytest.approx(0.6 + 0.3, abs=0.041)  # blip end + silence_ms
    utterance = events[3]
    assert utterance.speech_ms == pytest.approx(1300, abs=40)  # the 0.2 s pause did not end it
    assert times[3] == pytest.approx(1.1 + 1.5 + 0.3, abs=0.041)
    assert len(utterance.audio) / RATE == pytest.approx(0.1 + 1.5 + 0.1, abs=0.05)  # preroll + speech + kept silence


def test_vad_flush_closes_an_open_utterance_and_contains_speech():
    from speechctl.pipeline.vad import EnergyVad, Utterance, contains_speech

    vad = EnergyVad(RATE)
    assert not any(isinstance(e, Utterance) for e in vad.push(tone(1.0)))
    assert isinstance(vad.flush()[0], Utterance)
    assert contains_speech(np.concatenate([silence(0.3), tone(0.5)]), RATE)
    assert not contains_speech(silence(1.0), RATE) and not contains_speech(tone(0.1), RATE)
    assert not contains_speech(tone(1.0, level=0.001), RATE)  # -63 dBFS: below the threshold


# -- stages on engines ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def speech():
    from speechctl.cli.options import EngineChoice

    return EngineChoice(None, 64, 4096, "auto").speech()  # the CLI's tiny: shared with this module's CLI calls


@pytest.fixture(scope="module")
def lm():
    from speechctl.pipeline.build import load_text_lm
    from speechctl.pipeline.lm import LmConfig

    return load_text_lm(None, LmConfig())


def lm_tts(speech, lm, seed=4, max_seconds=0.5):
    from speechctl.pipeline.lm import LmConfig, LmStage
    from speechctl.pipeline.stage import Pipeline
    from speechctl.pipeline.tts import TtsStage

    tts = TtsStage(speech, job_options=dict(seed=seed, max_seconds=max_seconds))
    return Pipeline([LmStage(lm, LmConfig(max_tokens=80, min_tokens=80, seed=3)), tts])


@pytest.mark.engine
def test_tts_speaks_the_first_phrase_while_the_lm_still_writes(speech, lm):
    from speechctl.api import TtsJob
    from speechctl.pipeline.stage import Piece

    pipeline = lm_tts(speech, lm)
    phrases = []
    turn = pipeline.start(Piece(0, "text", "Tell me something.", last=True))
    while pipeline.busy():
        phrases += [p.data.strip() for p in pipeline.step() if p.stage == "lm" and p.data.strip()]
    assert turn.done and not turn.cancelled and len(phrases) >= 2
    lm_times, tts_times = turn.times["lm"], turn.times["tts"]
    assert tts_times.first_in < lm_times.last_out  # TTS got the first phrase before the reply ended
    assert tts_times.first_out < lm_times.last_out  # and its first audio came out before, too
    assert lm_times.first_out <= tts_times.first_in
    # The reply audio is every phrase's own (one-shot) TTS, in phrase order.
    jobs = [TtsJob(id=str(i), text=p, seed=4 + i, max_seconds=0.5) for i, p in enumerate(phrases)]
    expected = {r.id: r.audio for r in speech.run(jobs)}
    whole = np.concatenate([expected[str(i)] for i in range(len(phrases))])
    assert turn.reply_audio.shape == whole.shape
    np.testing.assert_allclose(turn.reply_audio, whole, rtol=0, atol=1e-6)  # see test_streaming.py
    assert turn.texts["lm"].split() == " ".join(phrases).split()


@pytest.mark.engine
def test_empty_transcript_gives_no_reply_and_cancel_leaves_nothing_running(speech, lm):
    from speechctl.pipeline.stage import Piece

    pipeline = lm_tts(speech, lm)
    turn = pipeline.run(Piece(0, "text", "  ", last=True))
    assert turn.done and not turn.audio and not turn.texts and turn.times["tts"].first_out is None
    assert not lm.busy()

    turn = pipeline.start(Piece(0, "text", "Say a lot.", last=True))
    while turn.times["tts"].first_out is None:  # cancel while both engines are busy
        pipeline.step()
    assert lm.busy()
    pipeline.cancel()
    assert turn.cancelled and not pipeline.busy() and not lm.busy()
    assert speech.engine.scheduler_requests() == 0 and not speech.engine.has_work()
    again = pipeline.run(Piece(0, "text", "Again.", last=True))  # the stages still work
    assert again.index == turn.index + 1 and len(again.reply_audio) > 0
