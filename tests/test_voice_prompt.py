"""A checkpoint's own voice prompt (config.json's ``speechctl.voice_prompt``): speech that follows
on from it, VALL-E's way. The engine's layout of it is checked token for token against the
plain-PyTorch reference in test_parity.py; here, what a user gets: the audio of the new speech
alone (the prompt's codes decoded before it as the codec's context, cut from the waveform), the
same streamed as one-shot, and the prompt left out where a job brings its own voice or guidance."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from speechctl.errors import ModelError

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("engines_of_this_module")]
TOLERANCE = 1e-6  # float rounding of a batched decode (tests/test_streaming.py's module doc)
PROMPT_FRAMES, LEAD = 12, 3


def with_voice_prompt(path, entry) -> None:
    config = json.loads((path / "config.json").read_text())
    config["speechctl"]["voice_prompt"] = entry
    (path / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    """The embedded tiny model with a voice prompt of random codes: (Speech, its prompt's codes)."""
    from speechctl.api import Speech
    from speechctl.models.tiny import ensure_tiny

    path = tmp_path_factory.mktemp("prompted") / "tiny"
    shutil.copytree(ensure_tiny(), path)
    speech = Speech(path)
    K, C = speech.engine.spec.num_codebooks, speech.engine.spec.pattern.codebook_size
    codes = np.random.default_rng(7).integers(0, C, (K, PROMPT_FRAMES))
    speech.close()
    with_voice_prompt(path, {"text": "As I was saying,", "codes": codes.tolist(), "lead_frames": LEAD})
    speech = Speech(path)
    yield speech, codes
    speech.close()


def jobs(**options):
    from speechctl.api import TtsJob

    return [TtsJob(id=f"j{i}", text=f"and so on {i}.", seed=40 + i, max_seconds=0.3 + 0.2 * i, **options) for i in range(3)]


def test_speech_after_the_prompt_is_its_own_audio_decoded_after_the_prompts(prompted):
    speech, codes = prompted
    assert speech.continuation(jobs()[0]).text == "As I was saying,"
    request = speech.request(jobs()[0], None)
    assert request.continues and np.array_equal(request.audio_items[-1], codes)
    # the model reads the prompt's text, then the job's
    assert bytes(request.prompt_ids[2:-2]).decode() == "As I was saying, and so on 0."
    hop = speech.codec.hop_length
    for result in speech.run(jobs()):
        assert result.error is None
        frames = result.codes.shape[1]
        assert 1 <= frames and result.codes.shape[0] == codes.shape[0]  # its own frames alone
        (context,) = speech.codec.decode([np.concatenate([codes, result.codes], axis=1)])
        assert len(result.audio) == (LEAD + frames) * hop  # the prompt's last LEAD frames lead in
        np.testing.assert_allclose(result.audio, context[(PROMPT_FRAMES - LEAD) * hop :], rtol=0, atol=TOLERANCE)


def test_streamed_speech_after_the_prompt_adds_up_to_one_shot(prompted):
    speech, _ = prompted
    whole = {r.id: r.audio for r in speech.run(jobs())}
    parts = {}
    for chunk in speech.stream_tts(jobs(), first_chunk=2):
        assert chunk.error is None
        parts.setdefault(chunk.id, []).append(chunk.audio)
    assert set(parts) == set(whole)
    for id, audio in whole.items():
        streamed = np.concatenate(parts[id])
        assert len(streamed) == len(audio)
        np.testing.assert_allclose(streamed, audio, rtol=0, atol=TOLERANCE)
    # a one-shot job beside streamed ones in the streamer: its whole audio cut the same way
    from speechctl.pipeline.streamer import SpeechStreamer

    streamer = SpeechStreamer(speech)
    for i, job in enumerate(jobs()):
        streamer.submit(job, stream=i != 1)
    got = {}
    while streamer.busy():
        for chunk in streamer.step():
            got.setdefault(chunk.id, []).append(chunk.audio)
    np.testing.assert_allclose(np.concatenate(got["j1"]), whole["j1"], rtol=0, atol=TOLERANCE)


def test_a_voice_of_ones_own_or_guidance_goes_without_the_prompt(prompted):
    from speechctl.api import TtsJob
    from speechctl.engine.params import Guidance

    speech, _ = prompted
    wave = np.zeros(speech.sample_rate // 2, np.float32)
    assert speech.continuation(TtsJob(id="v", text="hi", voice=wave)) is None
    assert speech.continuation(TtsJob(id="g", text="hi", guidance=Guidance(scale=2.0))) is None
    [result] = speech.run([TtsJob(id="g", text="hi", seed=1, max_seconds=0.3, guidance=Guidance(scale=2.0))])
    assert result.error is None and len(result.audio) == result.codes.shape[1] * speech.codec.hop_length


@pytest.mark.parametrize("entry, message", [
    ({"codes": [[1]]}, "KeyError"),
    ({"text": "x", "codes": [[1, 2]]}, r"voice_prompt.codes: expected codes of shape \[2, T\]"),
    ({"text": "x", "codes": [[1, 2], [3, 9]]}, r"voice_prompt.codes: codes must lie in \[0, 8\)"),
    ({"text": "x", "codes": "abc"}, "voice_prompt"),
    ({"text": "x", "codes": [[1, 2], [3, 4]], "lead_frames": 3}, "lead_frames must be 0..2"),
])
def test_a_malformed_voice_prompt_is_named(entry, message):
    from speechctl.engine.streams import DelayPattern, StreamSpec
    from speechctl.models.generic.family import voice_prompt

    spec = StreamSpec(DelayPattern((0, 1), codebook_size=8), 1, 2, 0, 3, 4, 5)
    with pytest.raises(ModelError, match=message):
        voice_prompt(entry, spec)
    lagging = StreamSpec(DelayPattern((1, 2), codebook_size=8), 1, 2, 0, 3, 4, 5)  # no stream to lead the continuation
    with pytest.raises(ModelError, match="no delay"):
        voice_prompt({"text": "x", "codes": [[1, 2], [3, 4]]}, lagging)
