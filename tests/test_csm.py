"""CSM through speechctl on vLLM equals transformers' own ``generate``, token for token on all
codebooks: a tiny random checkpoint written by transformers (``save_pretrained``, Mimi inside),
loaded through speechctl's real loading code, greedy (backbone and depth decoder), a batch of
prompts of different lengths and speakers, two with a context turn (reference audio + transcript:
transformers encodes the waveform itself, speechctl through its Mimi codec), under default
batching and under chunked prefill with preemption; the end frame stops a request where
transformers stops it. The codec decodes and encodes as transformers' Mimi does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.engine
DECODE_TOLERANCE = 1e-5  # max abs difference of float32 waveforms, relative to the peak (random
# Mimi weights decode to peaks of ~7; batched float32 rounding differs by ~2e-6 of that)

CONFIGS = {
    "default": {},
    # 16-token prefill chunks; 5 usable KV blocks of 32 for six requests of 20-70 positions:
    # preemption (checked below)
    "chunked-preemption": dict(max_num_batched_tokens=16, enable_chunked_prefill=True, num_kv_blocks=6, max_model_len=96),
}


@pytest.fixture(scope="module")
def csm_path(tmp_path_factory):
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    return create_csm_checkpoint(tmp_path_factory.mktemp("csm") / "tiny-csm", CsmRecipe(seed=2))


@pytest.fixture(scope="module")
def hf_model(csm_path):
    from transformers import CsmForConditionalGeneration

    return CsmForConditionalGeneration.from_pretrained(csm_path).eval().float()


@pytest.fixture(scope="module")
def codec(csm_path):
    from speechctl.codecs import load_codec

    return load_codec(csm_path)


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, csm_path):
    from test_parity import make_engine

    eng = make_engine(csm_path, **CONFIGS[request.param])
    eng.name = request.param
    yield eng
    eng.shutdown()


def prompts_of(engine):
    return engine.prompt_builder()


def requests(engine, codec, rng, frames=(9, 14, 20, 6, 12, 17)):
    """TTS requests and, per request, the context waveforms transformers gets."""
    from speechctl.models.csm.prompts import Turn

    prompts = prompts_of(engine)
    texts = ["Hi", "Hello world", "A longer sentence to speak aloud.", "x" * 30]
    reqs = [prompts.tts(t, speaker=i % 2, max_frames=frames[i], tag=f"tts{i}") for i, t in enumerate(texts)]
    waves = [[] for _ in reqs]
    for i, n in enumerate([3, 7]):
        wave = (0.1 * rng.standard_normal(n * codec.hop_length)).astype(np.float32)
        (codes,) = codec.encode([wave])
        turn = Turn(speaker=1, text=f"context {i}", codes=codes)
        reqs.append(prompts.tts(f"reply {i}", speaker=0, context=[turn], max_frames=frames[4 + i], tag=f"ctx{i}"))
        waves.append([wave])
    return reqs, waves


def hf_generate(model, spec, reqs, waves, max_new: int) -> dict:
    """transformers' generate on the whole batch: left-padded text, context audio as waveforms
    (``input_values`` and ``input_values_cutoffs``, as its processor builds them)."""
    rows = []
    for req in reqs:
        ids, items = [], iter(req.audio_items)
        for tok in req.prompt_ids:  # our one placeholder per turn -> <|AUDIO|> x T <|audio_eos|>
            ids += [spec.audio_id] * next(items).shape[1] + [spec.audio_eos_id] if tok == spec.audio_id else [tok]
        rows.append(ids)
    P = max(map(len, rows))
    input_ids = torch.tensor([[spec.pad_id] * (P - len(r)) + r for r in rows])
    kwargs = {}
    if any(waves):
        N = max(sum(len(w) for w in ws) for ws in waves)
        values = torch.zeros(len(reqs), 1, N)
        cutoffs = torch.full((len(reqs), 1), -1)
        for b, ws in enumerate(waves):
            if ws:
                values[b, 0, : len(ws[0])] = torch.as_tensor(ws[0])
                cutoffs[b, 0] = len(ws[0])
        kwargs = dict(input_values=values, input_values_cutoffs=cutoffs)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=(input_ids != spec.pad_id).long(),
        max_new_tokens=max_new,
        do_sample=False,
        depth_decoder_do_sample=False,
        **kwargs,
    )
    return {req.tag: out[b].numpy() for b, req in enumerate(reqs)}  # [steps, K]


def ended_at(frames: np.ndarray, eos: int) -> int | None:
    """The step of transformers' stop: a frame whose codebooks but the last are all eos."""
    ends = np.flatnonzero((frames[:, :-1] == eos).all(axis=1))
    return int(ends[0]) if len(ends) else None


def assert_equal_to_transformers(engine, model, reqs, waves):
    outs = {o.tag: o for o in engine.generate(reqs)}
    spec = engine.spec
    expected = hf_generate(model, spec, reqs, waves, max(r.max_tokens for r in reqs))
    ended = 0
    for req in reqs:
        out = outs[req.tag]
        assert out.error is None, out.error
        name = f"{engine.name}/{req.tag}"
        frames = expected[req.tag]
        end = ended_at(frames, spec.rules.eos_frame)
        length = req.max_tokens if end is None or end >= req.max_tokens else end + 1
        ended += end is not None and end < req.max_tokens
        np.testing.assert_array_equal(out.aux, frames[:length], err_msg=f"{name}: codebooks differ")
        primary = [spec.audio_id] * length
        if end is not None and end < req.max_tokens:
            primary[-1] = spec.audio_eos_id  # the end frame's primary token stops the request
        assert out.token_ids == primary, f"{name}: primary stream differs"
    return outs, ended


def test_greedy_generation_equals_transformers(engine, hf_model, codec):
    reqs, waves = requests(engine, codec, np.random.default_rng(0))
    outs, _ = assert_equal_to_transformers(engine, hf_model, reqs, waves)
    assert len({len(o.token_ids) for o in outs.values()}) >= 4
    if engine.name == "chunked-preemption":
        assert engine.stats()["resumed"] > 0, "the small KV cache should have forced preemption"


def test_end_frame_stops_like_transformers(tmp_path_factory, codec):
    """A depth decoder whose final norm is zero always picks code 0 (all-zero logits), so a frame
    ends the audio exactly when codebook 0 is 0: requests end at different steps."""
    from test_parity import make_engine
    from transformers import CsmForConditionalGeneration

    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    path = create_csm_checkpoint(tmp_path_factory.mktemp("csm") / "ends", CsmRecipe(seed=4, silent_depth=True))
    engine = make_engine(path)
    engine.name = "end-frame"
    model = CsmForConditionalGeneration.from_pretrained(path).eval().float()
    prompts = prompts_of(engine)
    reqs = [prompts.tts(f"text number {i}" + "!" * i, speaker=i % 3, max_frames=60, tag=i) for i in range(8)]
    outs, ended = assert_equal_to_transformers(engine, model, reqs, [[] for _ in reqs])
    assert ended >= 3, "some requests should end by the end frame"
    for out in outs.values():
        if out.token_ids[-1] == engine.spec.audio_eos_id:
            (codes,) = prompts.audio_segments(out)
            assert codes.shape[1] == len(out.token_ids) - 1  # the end frame is not audio
    engine.shutdown()


def test_context_audio_changes_the_output(engine, codec):
    from speechctl.models.csm.prompts import Turn

    prompts = prompts_of(engine)
    rng = np.random.default_rng(5)
    turns = [Turn(0, "same", rng.integers(0, codec.codebook_size, (codec.num_codebooks, 5))) for _ in range(2)]
    a = prompts.tts("same text", context=[turns[0]], max_frames=8, tag="a")
    b = prompts.tts("same text", context=[turns[1]], max_frames=8, tag="b")
    outs = {o.tag: o for o in engine.generate([a, b])}
    assert not np.array_equal(outs["a"].aux, outs["b"].aux)


def test_codec_decode_equals_transformers(codec, hf_model):
    """Batched decode of items of different lengths equals transformers' Mimi on each alone."""
    rng = np.random.default_rng(2)
    items = [rng.integers(0, codec.codebook_size, (codec.num_codebooks, n)) for n in (1, 7, 30, 64)]
    for item, wave in zip(items, codec.decode(items)):
        with torch.no_grad():
            ref = hf_model.codec_model.decode(torch.as_tensor(item)[None]).audio_values[0, 0].numpy()
        assert wave.shape == (item.shape[1] * codec.hop_length,) == ref.shape
        np.testing.assert_allclose(wave, ref, atol=DECODE_TOLERANCE * max(1.0, np.abs(ref).max()), rtol=0)


def test_codec_encode_equals_transformers(codec, hf_model):
    rng = np.random.default_rng(3)
    waves = [(0.1 * rng.standard_normal(n * codec.hop_length)).astype(np.float32) for n in (2, 9, 9, 25)]
    for wave, codes in zip(waves, codec.encode(waves)):
        with torch.no_grad():
            ref = hf_model.codec_model.encode(torch.as_tensor(wave)[None, None]).audio_codes[0].numpy()
        np.testing.assert_array_equal(codes, ref)


def test_speech_api_with_a_context_voice(csm_path):
    from speechctl.api import Speech, TtsJob
    from speechctl.engine.engine import EngineConfig

    config = EngineConfig(max_model_len=256, max_num_seqs=4, dtype="float32", block_size=32, kv_cache_bytes=1 << 26)
    speech = Speech(csm_path, engine_config=config)
    try:
        voice = (0.1 * np.sin(np.arange(speech.sample_rate // 2) * 0.05)).astype(np.float32)
        jobs = [
            TtsJob(id="plain", text="Hello there.", max_seconds=1.0),
            TtsJob(id="voice", text="Hello there.", voice=voice, voice_text="a reference", max_seconds=1.0),
        ]
        results = {r.id: r for r in speech.run(jobs)}
        for r in results.values():
            assert r.error is None, r.error
            assert len(r.audio) == r.codes.shape[1] * speech.codec.hop_length
        assert not np.array_equal(results["plain"].codes, results["voice"].codes)
        # Streaming reads the family's layout as it grows: the same audio as the one-shot run.
        from test_streaming import assert_stream_equals_run

        assert_stream_equals_run(speech, lambda: [TtsJob(id=f"s{i}", text=f"Streamed {i}.", seed=i, max_seconds=1.0) for i in range(3)])
    finally:
        speech.close()
