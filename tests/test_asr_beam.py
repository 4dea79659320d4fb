"""Whisper's decoding in the engine against independent references (real tiny.en weights,
``samples/asr``): beam search against the OpenAI-semantics reference (``test_asr_reference``) and
transformers' ``generate(num_beams=...)`` where the two definitions coincide; the encoder run
once per window whatever the beam width and the fallback; sampling, no-speech, context; groups
whose lanes fall out of step decoded again."""

import numpy as np
import pytest

from speechctl.api import AsrJob
from speechctl.asr.options import PLAIN_GREEDY, WhisperOptions
from test_asr_reference import Reference, hf_generate, speech_clips

pytestmark = pytest.mark.engine
CLIPS = ["01", "05", "06", "07", "09", "12", "13", "22"]
# Like for like with the reference's ``decode``: one temperature, no context, no timestamps.
PLAIN = PLAIN_GREEDY.with_(beam_size=5)


@pytest.fixture(scope="module")
def asr():
    import torch

    from speechctl.cli.options import EngineChoice

    # The comparisons below hold float32's numbers (a beam score to 0.002, a no-speech probability
    # to 1e-4): "auto" is float32 on the CPU (the engine the other Whisper modules share), float16
    # on a GPU, where they did not hold (forty-second session); there this module asks for float32.
    dtype = "float32" if torch.cuda.is_available() else "auto"
    return EngineChoice(None, 64, 4096, dtype).whisper()


@pytest.fixture(scope="module")
def reference(asr):
    return Reference(asr.model_dir)


@pytest.fixture(scope="module")
def clips():
    return speech_clips([int(n) for n in CLIPS])


def decode(asr, clips, **options):
    opts = PLAIN.with_(**options)
    return {r.id: r for r in asr.run(AsrJob(id=n, audio=a, whisper=opts) for n, a in clips.items())}


@pytest.fixture(scope="module")
def beams(asr, clips):
    asr.peak_live = 0
    out = decode(asr, clips)
    assert asr.peak_live >= 30  # the beams of several files ran together
    return out


def test_beam_search_equals_the_reference(asr, reference, clips, beams):
    """Beam 5, OpenAI's defaults (length normalisation, patience 1): tokens and average
    log-probability equal the reference's on every clip; with timestamps too."""
    stamped = decode(asr, clips, timestamps=True)
    for name, audio in clips.items():
        ref = reference.decode(audio, beam_size=5)
        assert beams[name].tokens == [ref["tokens"]], name
        assert beams[name].segments[0].avg_logprob == pytest.approx(ref["sum_logprob"] / (len(ref["tokens"]) + 1), abs=2e-3)
        ref_ts = reference.decode(audio, beam_size=5, timestamps=True)
        assert stamped[name].tokens == [ref_ts["tokens"]], name
    assert asr.decoding.stats["kv_copies"] > 0 and asr.stats["restarts"] == 0


def test_beam_settings_equal_the_reference(asr, reference, clips):
    """Beam width 3, patience 2, and Google NMT's length penalty."""
    few = {n: clips[n] for n in ("01", "07", "13")}
    for options in (dict(beam_size=3), dict(beam_size=4, patience=2.0), dict(length_penalty=0.5)):
        ours = decode(asr, few, **options)
        for name, audio in few.items():
            ref = reference.decode(audio, **{"beam_size": 5, **options})
            assert ours[name].tokens == [ref["tokens"]], (name, options)


def test_beam_search_equals_transformers_where_the_definitions_coincide(asr, reference, clips):
    """length_penalty 0 (transformers: 0.0), patience 1 (early_stopping=True), <|notimestamps|>:
    transformers' tokens, except where an <|endoftext|> ranked B-th or later finished a beam (the
    reference says where; clip 05 here), which only OpenAI's definition counts."""
    ours = decode(asr, clips, length_penalty=0.0)
    compared = 0
    for name, audio in clips.items():
        ref = reference.decode(audio, beam_size=5, length_penalty=0.0)
        assert ours[name].tokens == [ref["tokens"]], name
        if ref["hf_divergent"]:
            continue
        theirs = hf_generate(reference, audio, num_beams=5, length_penalty=0.0, early_stopping=True, max_new_tokens=224)
        assert ours[name].tokens == [theirs], name
        compared += 1
    assert compared >= 5


def test_the_encoder_runs_once_per_window_whatever_the_beam_and_the_fallback(asr, clips):
    """Four windows never seen by the engine, beam 5, and a log-probability threshold that no
    result meets: every window is decoded at all six temperatures (best of 5 above 0), 26 lanes
    each, and the encoder (counted at vLLM's own encoder module) runs four times."""
    from speechctl.engine import vllm_compat

    encoder = vllm_compat.engine_runner(asr._engine).get_model().model.encoder
    seen = []
    forward = encoder.forward

    def counting(input_features, *args, **kwargs):
        seen.append(len(input_features))
        return forward(input_features, *args, **kwargs)

    rng = np.random.default_rng(0)  # (noise: windows no earlier test encoded)
    fresh = {n: clips[n] + rng.normal(0, 1e-4, len(clips[n])).astype(np.float32) for n in ("01", "06", "09", "13")}
    encoder.forward = counting
    try:
        groups = asr.stats["groups"]
        opts = PLAIN.with_(temperatures=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), logprob_threshold=0.0)
        results = {r.id: r for r in asr.run(AsrJob(id=n, audio=a, whisper=opts, max_tokens=30) for n, a in fresh.items())}
    finally:
        encoder.forward = forward
    assert sum(seen) == 4
    assert asr.stats["groups"] - groups == 4 * 6
    for r in results.values():
        assert r.segments[0].temperature == 1.0 and r.text  # the last attempt is kept


def test_sampling_is_reproducible_and_seeded(asr, clips):
    def sample(seed):
        opts = PLAIN.with_(temperatures=(0.8,), best_of=3)
        jobs = (AsrJob(id=n, audio=a, whisper=opts, seed=seed, max_tokens=30) for n, a in clips.items())
        return {r.id: r.tokens for r in asr.run(jobs)}

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other


def test_no_speech_probability_and_skip(asr, reference):
    """The <|nospeech|> probability at <|startoftranscript|> is transformers' (softmax of the raw
    logits there); noise is dropped with the defaults."""
    from speechctl.audio import read_audio
    from test_asr_reference import RATE
    from pathlib import Path

    samples = Path(__file__).parent.parent / "samples" / "asr"
    noise = read_audio(samples / "noise.flac", RATE)
    speech = speech_clips([13])["13"]
    ours = decode(asr, {"noise": noise, "13": speech})
    for name, audio in (("noise", noise), ("13", speech)):
        ref = reference.decode(audio, beam_size=5)
        assert ours[name].segments[0].no_speech_prob == pytest.approx(ref["no_speech_prob"], abs=1e-4)
    (dropped,) = asr.run([AsrJob(id="noise", audio=noise, whisper=WhisperOptions())])
    assert dropped.text == "" and dropped.segments == [] and dropped.tokens == [[]]


def test_long_audio_prompts_each_window_with_the_text_before_it(asr, reference):
    """24 utterances back to back (three windows), conditioned on previous text: each window's
    tokens are the reference's for that window (its audible part, what the model hears) with the
    earlier windows' tokens as its prompt."""
    from speechctl.asr.segments import plan_windows

    clips = speech_clips()
    gap = np.zeros(4800, np.float32)
    audio = np.concatenate([x for c in clips.values() for x in (c, gap)])
    opts = PLAIN.with_(condition_on_previous_text=True, beam_size=2)
    (ours,) = asr.run([AsrJob(id="long", audio=audio, whisper=opts)])
    windows = plan_windows(audio)
    assert len(windows) >= 3 and len(ours.tokens) == len(windows)
    prompt: list[int] = []
    for w, tokens in zip(windows, ours.tokens):
        ref = reference.decode(audio[w.speech_start : w.speech_end], beam_size=2, prompt=prompt)
        assert tokens == ref["tokens"]
        prompt += ref["tokens"]


def test_beams_that_fall_out_of_step_are_decoded_again(asr, clips, beams):
    """A planner that thinks a step takes any number of encoder inputs (vLLM takes 8 here) adds
    groups that vLLM splits over two steps: those windows are decoded again, the planner learns,
    and the tokens are those of an undisturbed run."""
    from speechctl.engine import vllm_compat

    # 8 lanes' inputs a step: the CPU's default; a GPU's takes every lane (40 here) at once
    scheduler = vllm_compat.engine_scheduler(asr._engine)
    budgets, taken = dict(asr.budgets), scheduler.max_num_encoder_input_tokens
    scheduler.max_num_encoder_input_tokens = 8 * asr.encoder_positions
    asr.budgets["encoder_tokens"] = 10**9
    restarts = asr.stats["restarts"]
    try:
        again = decode(asr, clips)
    finally:
        asr.budgets.update(budgets)
        scheduler.max_num_encoder_input_tokens = taken
    assert asr.stats["restarts"] > restarts
    assert {n: r.tokens for n, r in again.items()} == {n: r.tokens for n, r in beams.items()}
