"""MusicGen through speechctl on vLLM's encoder-decoder path equals transformers' own
``generate``, token for token on all codebooks: a tiny random checkpoint written by transformers
(``save_pretrained``: T5, the decoder, EnCodec inside), loaded through speechctl's real loading
code, greedy, one batch of descriptions of different lengths with CFG off and on at two scales
(each transformers reference one call of one ``guidance_scale``; its codes read where its
``generate`` hands them to EnCodec), one continuing an audio prompt; under default batching and
forced preemption. EnCodec decodes and encodes as transformers' does; the streamed audio
equals the one-shot audio; ``speechctl tts --seconds`` makes music of that length;
``--model facebook/musicgen-small`` (the published layout, offline from a hub cache) with no
flags takes its weights, CFG and length from the checkpoint.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from follow_tokens import FollowTokens, assert_near_ties, put_last

pytestmark = pytest.mark.engine
DECODE_TOLERANCE = 1e-5  # max abs difference of float32 waveforms, relative to the peak
TEXTS = ["lo-fi piano, rain", "80s pop", "a slow, sad and very cinematic string piece in a minor key", "x"]
GROUPS = [(None, 40), (3.0, 36), (1.5, 30)]  # (guidance scale or None, max_new_tokens of transformers)
CONFIGS = {
    "default": dict(max_num_batched_tokens=1024),
    # 13 usable KV blocks of 32 shared by self- and cross-attention (a request grows to 3-4) for
    # 14 requests and 8 unconditional members: preemption (checked below)
    "preemption": dict(max_num_batched_tokens=128, max_model_len=128, num_kv_blocks=14, max_num_seqs=6),
}


@pytest.fixture(scope="module")
def musicgen_path(tmp_path_factory):
    from speechctl.models.musicgen.checkpoint import MusicgenRecipe, create_musicgen_checkpoint

    return create_musicgen_checkpoint(tmp_path_factory.mktemp("musicgen") / "tiny-musicgen", MusicgenRecipe(seed=1))


@pytest.fixture(scope="module")
def hf_model(musicgen_path):
    from transformers import MusicgenForConditionalGeneration

    return MusicgenForConditionalGeneration.from_pretrained(musicgen_path).eval()


@pytest.fixture(scope="module")
def codec(musicgen_path):
    from speechctl.codecs import load_codec

    return load_codec(musicgen_path)


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, musicgen_path):
    from test_parity import make_engine

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPEECHCTL_STRICT_PAIRS", "1")  # a pair out of step raises (production: counted, fails)
        eng = make_engine(musicgen_path, **CONFIGS[request.param])
    eng.name = request.param
    yield eng
    eng.shutdown()


def hf_codes(model, input_ids, attention_mask, max_new=None, scale=None, audio=None, follow=None, **generate) -> np.ndarray:
    """transformers' generate (greedy, ``max_new`` steps, ``guidance_scale`` ``scale``; or the
    ``generate`` keywords alone); the [B, K, T] codes it hands its EnCodec (the whole sequence:
    an audio prompt's frames first). ``follow``: a ``FollowTokens`` put last in its logits
    processors."""
    captured = {}
    decode = model.audio_encoder.decode

    def grab(audio_codes, *args, **kwargs):
        captured["codes"] = audio_codes.clone()
        return decode(audio_codes, *args, **kwargs)

    extra = {} if audio is None else {"input_values": torch.as_tensor(audio)[None, None]}
    model.audio_encoder.decode = grab
    try:
        if max_new is not None:
            generate = dict(max_new_tokens=max_new, do_sample=False, guidance_scale=scale or 1.0, **generate)
        with put_last(model, follow) if follow is not None else contextlib.nullcontext():
            model.generate(input_ids=input_ids, attention_mask=attention_mask, **extra, **generate)
    finally:
        model.audio_encoder.decode = decode
    return captured["codes"][0].numpy()


def hf_follow(model, input_ids, attention_mask, ours, prompt_frames=0, audio=None, **settings) -> FollowTokens:
    """``hf_codes`` made to follow ``ours``, speechctl's [K, T] codes of each description after
    ``prompt_frames`` frames of an audio prompt (follow_tokens.py); checks that transformers'
    codes are then ours and returns the follower."""
    K = model.decoder.num_codebooks
    B = len(ours)

    def at(position):  # rows b * K + k; codebook k's frame at a position: position - 1 - k (delay pattern)
        tokens, free = np.zeros((B, K), dtype=np.int64), np.zeros((B, K), dtype=bool)
        for b, codes in enumerate(ours):
            for k in range(K):
                frame = position - 1 - k - prompt_frames
                if 0 <= frame < codes.shape[1]:
                    tokens[b, k], free[b, k] = codes[k, frame], True
        return tokens.reshape(-1), free.reshape(-1)

    follow = FollowTokens(at)
    got = hf_codes(model, input_ids, attention_mask, audio=audio, follow=follow, **settings)
    for b, codes in enumerate(ours):
        np.testing.assert_array_equal(got[b, :, prompt_frames:], codes, err_msg="transformers did not follow")
    return follow


@pytest.fixture(scope="module")
def cases(musicgen_path, hf_model, codec):
    """The requests of the parity test and transformers' codes for each (computed once for both
    engine configurations)."""
    from transformers import AutoTokenizer

    from speechctl.engine.params import Guidance
    from speechctl.models.families import open_checkpoint

    prompts = open_checkpoint(musicgen_path).prompt_builder(AutoTokenizer.from_pretrained(musicgen_path))
    K = prompts.spec.num_codebooks
    reqs, expected, calls = [], {}, []  # calls: (tags, hf_follow's arguments) of each transformers call
    for g, (scale, max_new) in enumerate(GROUPS):
        batch = [prompts.tts(t, max_frames=max_new + 1 - K, guidance=Guidance(scale, "audio") if scale else Guidance(),
                             tag=(g, i)) for i, t in enumerate(TEXTS)]
        L = max(len(r.encoder_ids) for r in batch)  # right-padded, as MusicGen's processor pads
        ids = torch.tensor([list(r.encoder_ids) + [0] * (L - len(r.encoder_ids)) for r in batch])
        mask = torch.tensor([[1] * len(r.encoder_ids) + [0] * (L - len(r.encoder_ids)) for r in batch])
        for i, codes in enumerate(hf_codes(hf_model, ids, mask, max_new, scale)):
            expected[(g, i)] = codes
        reqs += batch
        calls.append(([r.tag for r in batch], dict(input_ids=ids, attention_mask=mask, max_new=max_new, scale=scale)))
    wave = (0.1 * np.random.default_rng(0).standard_normal(6 * codec.hop_length)).astype(np.float32)
    (prompt_codes,) = codec.encode([wave])
    for scale in (None, 3.0):  # an audio prompt to continue, with CFG and without
        req = prompts.tts(TEXTS[0], voice_codes=prompt_codes, max_frames=10,
                          guidance=Guidance(scale, "audio") if scale else Guidance(), tag=("audio", scale))
        ids = torch.tensor([list(req.encoder_ids)])
        codes = hf_codes(hf_model, ids, torch.ones_like(ids), 10 + K - 1, scale, audio=wave)[0]
        np.testing.assert_array_equal(codes[:, :6], prompt_codes)
        expected[("audio", scale)] = codes[:, 6:]
        reqs.append(req)
        calls.append(([req.tag], dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new=10 + K - 1,
                                      scale=scale, audio=wave, prompt_frames=6)))
    return reqs, expected, calls


def test_greedy_generation_equals_transformers(engine, hf_model, cases):
    """On the CPU equal to transformers' generate; on CUDA transformers follows our codes and
    each free choice of ours is its own or a near tie (follow_tokens.py; the CPU runs that check
    too)."""
    reqs, expected, calls = cases
    prompts, K = engine.prompt_builder(), engine.spec.num_codebooks
    outs = {o.tag: o for o in engine.generate(reqs)}
    assert len(outs) == len(reqs)
    ours = {}
    for tag, out in outs.items():
        assert out.error is None, f"{engine.name}/{tag}: {out.error}"
        (ours[tag],) = prompts.audio_segments(out)
        if not torch.cuda.is_available():
            np.testing.assert_array_equal(ours[tag], expected[tag], err_msg=f"{engine.name}/{tag}: codebooks differ")
        assert len(out.token_ids) == ours[tag].shape[1] + K - 1 and out.token_ids[-1] == engine.spec.audio_eos_id
    for tags, call in calls:
        follow = hf_follow(hf_model, ours=[ours[tag] for tag in tags], **call)
        assert_near_ties(follow, f"{engine.name}/{tags}")
    stats = engine.stats()
    assert stats["pair_violations"] == 0 and stats["live"] == 0
    if engine.name == "preemption":
        assert stats["resumed"] > 0, "the small KV cache should have forced preemption"


def test_guidance_changes_the_output(engine):
    from speechctl.engine.params import Guidance

    prompts = engine.prompt_builder()
    reqs = [prompts.tts(TEXTS[1], max_frames=12, guidance=Guidance(s, "audio"), tag=s) for s in (1.0, 2.0, 3.0)]
    outs = {o.tag: o.aux.tobytes() for o in engine.generate(reqs)}
    assert len(set(outs.values())) == 3


def test_codec_decode_and_encode_equal_transformers(codec, hf_model):
    encodec = hf_model.audio_encoder
    assert (codec.sample_rate, codec.hop_length, codec.num_codebooks) == (32000, 640, 4)
    rng = np.random.default_rng(2)
    items = [rng.integers(0, codec.codebook_size, (codec.num_codebooks, n)) for n in (1, 6, 25, 40)]
    for item, wave in zip(items, codec.decode(items)):
        with torch.no_grad():
            ref = encodec.decode(torch.as_tensor(item)[None, None], [None]).audio_values[0, 0].numpy()
        np.testing.assert_allclose(wave, ref, atol=DECODE_TOLERANCE * max(1.0, np.abs(ref).max()), rtol=0)
    waves = [(0.1 * rng.standard_normal(n * codec.hop_length)).astype(np.float32) for n in (3, 9, 20)]
    for wave, codes in zip(waves, codec.encode(waves)):
        with torch.no_grad():
            ref = encodec.encode(torch.as_tensor(wave)[None, None]).audio_codes[0, 0].numpy()
        np.testing.assert_array_equal(codes, ref)


def test_api_streams_what_it_runs_and_cli_takes_seconds(musicgen_path, tmp_path, shared_engines_closed):
    """``Speech.stream_tts`` chunks concatenate to ``Speech.tts`` (EnCodec's LSTM: windows from
    the start), and ``speechctl tts --seconds S`` writes S seconds of music."""
    from click.testing import CliRunner

    from speechctl import api
    from speechctl.audio import read_audio
    from speechctl.cli import cli
    from speechctl.engine.params import GREEDY

    speech = api.Speech(musicgen_path)
    whole = speech.tts("lo-fi piano, rain", max_seconds=0.4, audio_sampling=GREEDY, seed=1)
    chunks = list(speech.stream_tts("lo-fi piano, rain", max_seconds=0.4, audio_sampling=GREEDY, seed=1))
    streamed = np.concatenate([c.audio for c in chunks])
    assert whole.codes.shape[1] == 20 and len(streamed) == len(whole.audio) == 20 * 640
    np.testing.assert_allclose(streamed, whole.audio, atol=DECODE_TOLERANCE * max(1.0, np.abs(whole.audio).max()))
    speech.close()
    result = CliRunner().invoke(cli, ["tts", "lo-fi piano, rain", "--model", str(musicgen_path), "--seconds", "0.5",
                                      "--temperature", "0", "-o", str(tmp_path / "music.wav")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(read_audio(tmp_path / "music.wav", 32000)) == 25 * 640


def test_published_layout_by_hub_id_takes_its_defaults(tmp_path_factory, musicgen_path, monkeypatch, shared_engines_closed):
    """facebook/musicgen-small as published (``published.facebook_musicgen_like``: decoy copies
    of the weights beside model.safetensors, EnCodec inside), in a hub cache offline:
    ``speechctl tts --model facebook/musicgen-small`` with no flags takes its weights by
    transformers' rule, its EnCodec, and generation_config.json's greedy decoding, guidance scale
    3 and length (``max_length`` 30: 27 frames); the codes equal transformers' ``generate()`` of
    that directory with that generation config."""
    import shutil

    from click.testing import CliRunner
    from transformers import AutoTokenizer, GenerationConfig, MusicgenForConditionalGeneration

    from published import MUSICGEN_REPO, facebook_musicgen_like, into_hub_cache
    from speechctl.cli import cli

    cache = tmp_path_factory.mktemp("hf-hub")
    published = tmp_path_factory.mktemp("published") / "musicgen-small"
    shutil.copytree(musicgen_path, published)
    facebook_musicgen_like(published, generation={"do_sample": False, "guidance_scale": 3.0, "max_length": 30})
    into_hub_cache(cache, MUSICGEN_REPO, published)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    described = CliRunner().invoke(cli, ["models", MUSICGEN_REPO], catch_exceptions=False)
    text = " ".join(described.output.split())
    for expected in ("model.safetensors (by model.safetensors)", "compression_state_dict.bin, pytorch_model.bin, state_dict.bin",
                     "encodec, inside the checkpoint", "sample_rate 32000", "audio greedy; CFG scale 3; at most 27 frames",
                     "layers 2", "missing nothing"):
        assert expected in text, f"{expected!r} not in {text}"

    out = tmp_path_factory.mktemp("out")
    result = CliRunner().invoke(cli, ["tts", TEXTS[0], "--model", MUSICGEN_REPO, "-o", str(out / "a.wav"),
                                      "--codes-out", str(out / "a.npy")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    codes = np.load(out / "a.npy")
    model = MusicgenForConditionalGeneration.from_pretrained(published).eval()  # transformers' own choice of files
    ids = AutoTokenizer.from_pretrained(published)([TEXTS[0]], return_tensors="pt")
    defaults = GenerationConfig.from_pretrained(published)
    assert codes.shape[1] == 27
    if not torch.cuda.is_available():
        (expected,) = hf_codes(model, ids.input_ids, ids.attention_mask, generation_config=defaults)
        np.testing.assert_array_equal(codes, expected)
    follow = hf_follow(model, ids.input_ids, ids.attention_mask, [codes], generation_config=defaults)
    assert_near_ties(follow, "published layout")  # (CUDA's check; the CPU runs it too)
