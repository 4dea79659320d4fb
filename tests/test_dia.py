"""Dia through speechctl on vLLM's encoder-decoder path equals transformers' own ``generate``,
token for token on all 9 channels: a tiny random checkpoint written by transformers
(``save_pretrained``), loaded through speechctl's real loading code, greedy, one batch of texts
of different lengths with CFG off and on at different scales and CFG-filter top-k (each
transformers reference a batch of one guidance setting: its ``guidance_scale`` is per call),
two with a voice prompt (transformers' ``DiaProcessor`` encodes the waveform itself), requests
ending by EOS at different steps; under default batching and under forced preemption (vLLM
turns chunked prefill off for encoder-decoder models). The DAC codec (44.1 kHz) decodes and
encodes as transformers' does; ``speechctl tts --model nari-labs/Dia-1.6B-0626`` (the published
layout, offline from a hub cache) with no flags takes Dia's weights, CFG, length and codec (by
hub id) from the checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from follow_tokens import TIE_GAP, FollowTokens, assert_near_ties, put_last
from published import DIA_CODEC_REPO, DIA_REPO, into_hub_cache, nari_like

pytestmark = pytest.mark.engine
DECODE_TOLERANCE = 1e-5  # max abs difference of float32 waveforms, relative to the peak
EOS, PAD, BOS = 1024, 1025, 1026
TEXTS = ["[S1] Hello there.", "[S2] Hi!", "[S1] A much longer sentence, said slowly (laughs).", "[S1] x"]
# (guidance scale in Dia's convention or None, CFG filter top-k, max_new_tokens of transformers)
GROUPS = [(None, None, 40), (3.0, 20, 36), (2.0, 5, 44)]
CONFIGS = {
    "default": dict(max_num_batched_tokens=1024),
    # 15 usable KV blocks of 32 shared by self- and cross-attention (a request holds 2-4) for 14
    # requests and 10 unconditional members: preemption (checked below)
    "preemption": dict(max_num_batched_tokens=256, max_model_len=192, num_kv_blocks=16, max_num_seqs=6),
}

# The parts of Dia's config that its stream layout reads (``dia_spec``)
DIA_CONFIG = {"delay_pattern": [0, 8, 9, 10, 11, 12, 13, 14, 15],
              "decoder_config": {"bos_token_id": 1026, "eos_token_id": 1024, "pad_token_id": 1025, "num_channels": 9,
                                 "vocab_size": 1028}}


@pytest.fixture(scope="module")
def dia_path(tmp_path_factory):
    from speechctl.models.dia.checkpoint import DiaRecipe, create_dia_checkpoint

    return create_dia_checkpoint(tmp_path_factory.mktemp("dia") / "tiny-dia", DiaRecipe(seed=2, eos_boost=3.0))


@pytest.fixture(scope="module")
def hf_model(dia_path):
    from transformers import DiaForConditionalGeneration

    return DiaForConditionalGeneration.from_pretrained(dia_path).eval()


@pytest.fixture(scope="module")
def processor(dia_path):
    from transformers import DacModel, DiaFeatureExtractor, DiaProcessor, DiaTokenizer

    return DiaProcessor(DiaFeatureExtractor(sampling_rate=44100, hop_length=512), DiaTokenizer(),
                        DacModel.from_pretrained(dia_path / "codec"))


@pytest.fixture(scope="module")
def codec(dia_path):
    from speechctl.codecs import load_codec

    return load_codec(dia_path / "codec")


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, dia_path):
    from test_parity import make_engine

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPEECHCTL_STRICT_PAIRS", "1")  # a pair out of step raises (production: counted, fails)
        eng = make_engine(dia_path, **CONFIGS[request.param])
    eng.name = request.param
    yield eng
    eng.shutdown()


def hf_settings(max_new, scale=None, top_k=None) -> dict:
    """``generate`` keywords: greedy, ``max_new`` steps, CFG ``scale`` (Dia's convention) with
    its filter's ``top_k``."""
    return dict(max_new_tokens=max_new, do_sample=False, **(dict(guidance_scale=scale, top_k=top_k) if scale else {}))


def hf_generate(model, processor, texts, max_new, scale=None, top_k=None, voice=None) -> np.ndarray:
    """transformers' generate on ``texts`` as DiaProcessor prepares them: [B, steps, 9] after
    the decoder prompt (BOS frame and voice frames)."""
    inputs = processor(text=texts, audio=voice, return_tensors="pt")
    out = model.generate(**inputs, **hf_settings(max_new, scale, top_k))
    prompt = inputs["decoder_input_ids"].shape[1] - max(model.config.delay_pattern)
    return out.numpy()[:, prompt:]


def hf_follow(model, processor, texts, ours, voice=None, **generate) -> FollowTokens:
    """transformers' generate as ``hf_generate`` prepares it (``generate``: its keywords), made
    to follow ``ours``, speechctl's [steps, 9] channels of each text (follow_tokens.py); checks
    that transformers' output is then ours and returns the follower."""
    inputs = processor(text=texts, audio=voice, return_tensors="pt")
    delay_mask = inputs["decoder_input_ids"].numpy()  # [B, prompt + max delay, 9]: PAD where transformers chooses
    B, M, C = delay_mask.shape
    prompt = M - max(model.config.delay_pattern)

    def at(position):  # rows b * 9 + c, as transformers' Dia flattens batch and channels
        i = position - prompt
        tokens, ended = np.full((B, C), PAD), np.ones((B, C), dtype=bool)
        for b, channels in enumerate(ours):
            if i < len(channels):
                tokens[b] = channels[i]
                ended[b] = (channels[:i] == EOS).any(axis=0)  # after its EOS transformers' loop pads a channel
        free = ~ended & (delay_mask[:, position] == PAD if position < M else True)
        return tokens.reshape(-1), free.reshape(-1)

    follow = FollowTokens(at)
    with put_last(model, follow):  # after Dia's CFG, channel and end rules
        out = model.generate(**inputs, **generate).numpy()[:, prompt:]
    for b, channels in enumerate(ours):
        np.testing.assert_array_equal(out[b, : len(channels)], channels, err_msg="transformers did not follow")
        assert (out[b, len(channels):] == PAD).all(), "transformers went on past our end"
    return follow


def delayed(codes: np.ndarray, delays) -> np.ndarray:
    """[9, T] codes -> the [steps, 9] channels Dia generates: the codes and an EOS frame under
    transformers' own delay pattern (DiaProcessor's: BOS before each channel's delay, PAD after)."""
    from transformers import DiaProcessor

    T, D, C = codes.shape[1], max(delays), len(delays)
    frames = np.concatenate([codes.T, np.full((1, C), EOS), np.full((D, C), PAD)])[None]  # [1, T + 1 + D, 9]
    index = DiaProcessor.build_indices(1, T + 1 + D, C, list(delays))
    return DiaProcessor.apply_audio_delay(torch.as_tensor(frames), PAD, BOS, index)[0].numpy()


def assert_equal(out, expected, name):
    assert out.error is None, f"{name}: {out.error}"
    steps = len(out.aux)
    np.testing.assert_array_equal(out.aux, expected[:steps], err_msg=f"{name}: channels differ")
    assert (expected[steps:] == PAD).all(), f"{name}: transformers generated more steps"  # its batch pads with PAD


def test_text_ids_equal_dia_tokenizer():
    from transformers import DiaTokenizer

    from speechctl.models.dia.prompts import dia_text_ids

    text = "[S1] Hi (laughs) Ünïcödé ✓ [S2] bye."
    assert dia_text_ids(text).tolist() == DiaTokenizer()(text).input_ids


def test_captured_decode_reads_the_slot_table_before_attach():
    """vLLM captures an encoder-decoder model's decode forward whole, at start-up, before the
    runtime is attached: the one-token-per-row gather must read the slot table's persistent
    buffers even then (a constant there would be replayed on every decode step on CUDA)."""
    from speechctl.engine.runtime import StreamRuntime
    from speechctl.models.dia.family import dia_spec

    runtime = StreamRuntime(dia_spec(DIA_CONFIG), max_rows=4, max_len=16, device=torch.device("cpu"))
    assert runtime.view is None  # not attached
    table = runtime.table
    table.row_slots[1] = 0
    table.prompt_len[0] = 2
    table.prompt_aux[0, 1] = torch.arange(9, dtype=torch.int32)
    ids, positions = torch.zeros(2, dtype=torch.int64), torch.tensor([0, 1])
    aux = runtime.decoder_inputs(ids, positions, one_per_row=True)
    assert aux[1].tolist() == list(range(9)) and (aux[0] == 1025).all()  # row 0: the scratch slot's PAD
    assert (runtime.decoder_inputs(ids, positions, one_per_row=False) == 1025).all()  # a profiling run


def test_the_captured_decode_and_the_runtime_share_one_row_slot_tensor():
    """vLLM captures the decode forward (reading the row slots) before attach, which grows the
    row slots to vLLM's largest graph bucket (twice max_num_seqs): grown then, they would be a
    new tensor, and every replay would read the old one's rows (the scratch slot's inputs). The
    model sizes them from the config at once, so attach finds them large enough."""
    from types import SimpleNamespace

    from speechctl.models.dia.family import dia_spec
    from speechctl.models.encoder_decoder import EncoderDecoderModel

    vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8),
                                  model_config=SimpleNamespace(max_model_len=64, dtype=torch.float32),
                                  compilation_config=SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4, 8, 16]))
    model = SimpleNamespace()
    EncoderDecoderModel.make_stream_runtime(model, dia_spec(DIA_CONFIG), vllm_config, torch.device("cpu"), hidden_size=8)
    table = model.stream_runtime.table
    captured = table.row_slots  # what a graph captured now would read
    table.reserve_rows(16)  # attach: vLLM's largest bucket (use_step_graphs)
    assert table.row_slots is captured and captured.shape[0] == 16


def test_greedy_generation_equals_transformers(engine, hf_model, processor, codec):
    """On the CPU equal to transformers' generate; on CUDA transformers follows our tokens and
    each free choice of ours is its own or a near tie (follow_tokens.py; the CPU runs that check
    too)."""
    from speechctl.engine.params import Guidance

    prompts = engine.prompt_builder()
    reqs, calls = [], []  # calls: (tags, texts, generate settings, voice) of each transformers call
    for g, (scale, top_k, max_new) in enumerate(GROUPS):
        guidance = Guidance(scale=scale + 1, streams="audio", top_k=top_k) if scale else Guidance()
        tags = [(g, i) for i in range(len(TEXTS))]
        reqs += [prompts.tts(text, max_frames=max_new - 16, guidance=guidance, tag=tag) for tag, text in zip(tags, TEXTS)]
        calls.append((tags, TEXTS, (max_new, scale, top_k), None))
    rng = np.random.default_rng(0)
    for v, (frames, scale) in enumerate([(5, 3.0), (12, None)]):  # voice prompts: one transformers call each
        wave = (0.1 * rng.standard_normal(frames * codec.hop_length)).astype(np.float32)
        (codes,) = codec.encode([wave])
        text = f"[S2] voice number {v}."
        guidance = Guidance(scale=scale + 1, streams="audio", top_k=20) if scale else Guidance()
        reqs.append(prompts.tts(text, voice_codes=codes, voice_text=f"[S1] transcript {v}.", max_frames=14,
                                guidance=guidance, tag=("voice", v)))
        calls.append(([("voice", v)], [f"[S1] transcript {v}. {text}"], (30, scale, 20), [wave]))
    outs = {o.tag: o for o in engine.generate(reqs)}
    assert len(outs) == len(reqs)
    for tags, texts, settings, voice in calls:
        if not torch.cuda.is_available():
            for tag, expected in zip(tags, hf_generate(hf_model, processor, texts, *settings, voice=voice)):
                assert_equal(outs[tag], expected, f"{engine.name}/{tag}")
        for tag in tags:
            out = outs[tag]
            assert out.error is None, f"{engine.name}/{tag}: {out.error}"
            assert out.token_ids[-1] == EOS and len(out.token_ids) == len(out.aux), f"{engine.name}/{tag}: primary stream"
        follow = hf_follow(hf_model, processor, texts, [outs[tag].aux for tag in tags], voice=voice,
                           **hf_settings(*settings))
        assert_near_ties(follow, f"{engine.name}/{tags}")
    assert len({len(o.aux) for o in outs.values()}) >= 5, "requests should end at different steps"
    stats = engine.stats()
    assert stats["pair_violations"] == 0 and stats["live"] == 0
    if engine.name == "preemption":
        assert stats["resumed"] > 0, "the small KV cache should have forced preemption"


def test_following_transformers_catches_a_token_it_would_not_choose(hf_model, processor):
    """The CUDA check is not vacuous: transformers' own tokens pass it with no disagreement; one
    free token changed (channel 0, mid-sequence) is found, and far from a tie."""
    (own,) = hf_generate(hf_model, processor, TEXTS[2:3], 36, 3.0, 20)
    settings = hf_settings(36, 3.0, 20)
    own = own[: int(np.flatnonzero(own[:, -1] == EOS)[0]) + 1]  # up to the last channel's EOS
    follow = hf_follow(hf_model, processor, TEXTS[2:3], [own], **settings)
    assert follow.checked > 100 and not follow.disagreements
    changed = own.copy()
    changed[10, 0] = (own[10, 0] + 1) % 1024
    follow = hf_follow(hf_model, processor, TEXTS[2:3], [changed], **settings)
    row, position, gap = follow.disagreements[0]
    assert (row, position) == (0, 11) and gap > TIE_GAP  # row 0: channel 0; position 11: after the BOS frame
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_near_ties(follow, "changed")


def test_following_transformers_allows_a_flip_at_the_cfg_filters_edge():
    """Dia's filter keeps the merged scores' top k, then takes the best conditional score among
    them. Where the k-th and (k+1)-th merged scores are within rounding, either token may be in
    the set, and a choice that follows from the other set is a tie, however far apart their
    conditional scores are; the same choice with the edge clear is caught."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import DiaClassifierFreeGuidanceLogitsProcessor

    from follow_tokens import _WatchDiaFilter

    scale, cond = 3.0, torch.tensor([[1.0, 2.0, 3.0, 0.0]])

    def check(merged, ours):
        uncond = cond - (torch.tensor([merged]) - cond) / scale  # so that cond + s (cond - uncond) = merged
        follow = FollowTokens(lambda position: (np.array([ours]), np.array([True])))
        cfg = _WatchDiaFilter(DiaClassifierFreeGuidanceLogitsProcessor(scale, guidance_top_k=2), follow)
        LogitsProcessorList([cfg, follow])(torch.zeros((1, 5), dtype=torch.long), torch.cat([cond, uncond]))
        return follow

    # merged: token 0 clearly in, tokens 1 and 2 tied at the edge (transformers keeps 1 and chooses it)
    follow = check([10.0, 5.0, 4.999, -10.0], ours=2)
    assert len(follow.disagreements) == 1
    assert_near_ties(follow, "edge tie")
    follow = check([10.0, 5.0, 4.0, -10.0], ours=2)  # token 2 clearly out: ours could not have chosen it
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_near_ties(follow, "clear edge")
    follow = check([10.0, 5.0, 4.999, -10.0], ours=0)  # token 0 while 1 and 2 both beat it
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_near_ties(follow, "below both")


def test_cfg_filter_and_scale_change_the_output(engine):
    """Guidance changes the output (else the parity test would not test it): Dia's filter picks
    from the conditional logits on the guided top-k, so with k = the vocabulary it is off; the
    plain merge (top_k 0, speechctl's convention) takes the guided logits, and its scale counts."""
    from speechctl.engine.params import Guidance

    prompts = engine.prompt_builder()
    settings = {"off": Guidance(), "k5": Guidance(4.0, "audio", 5), "k1028": Guidance(4.0, "audio", 1028),
                "merge4": Guidance(4.0, "audio"), "merge3": Guidance(3.0, "audio")}
    outs = {o.tag: o.aux.tobytes() for o in engine.generate([prompts.tts(TEXTS[2], max_frames=20, guidance=g, tag=name)
                                                             for name, g in settings.items()])}
    assert outs["off"] == outs["k1028"]
    assert len({outs[k] for k in ("off", "k5", "merge4", "merge3")}) == 4


def test_chunked_prefill_is_off_for_encoder_decoder(engine):
    assert not engine._vllm.vllm_config.scheduler_config.enable_chunked_prefill


def test_codec_decode_equals_transformers(codec, processor):
    """Batched decode of items of different lengths equals transformers' DAC on each alone;
    encode equals its codes."""
    dac = processor.audio_tokenizer
    assert (codec.sample_rate, codec.hop_length, codec.num_codebooks) == (44100, 512, 9)
    rng = np.random.default_rng(2)
    items = [rng.integers(0, codec.codebook_size, (codec.num_codebooks, n)) for n in (1, 7, 30, 41)]
    for item, wave in zip(items, codec.decode(items)):
        with torch.no_grad():
            ref = dac.decode(audio_codes=torch.as_tensor(item)[None]).audio_values[0].numpy()
        ref = np.pad(ref, (0, len(wave) - len(ref)))
        np.testing.assert_allclose(wave, ref, atol=DECODE_TOLERANCE * max(1.0, np.abs(ref).max()), rtol=0)
    waves = [(0.1 * rng.standard_normal(n * codec.hop_length)).astype(np.float32) for n in (3, 9, 20)]
    for wave, codes in zip(waves, codec.encode(waves)):
        with torch.no_grad():
            ref = dac.encode(torch.as_tensor(wave)[None, None]).audio_codes[0].numpy()
        np.testing.assert_array_equal(codes, ref)


def test_published_layout_by_hub_id_takes_its_defaults(tmp_path_factory, dia_path, processor, monkeypatch, shared_engines_closed):
    """nari-labs/Dia-1.6B-0626 as published (``published.nari_like``: shards, decoy copies of the
    weights, the codec named by hub id in audio_tokenizer_config.json), in a hub cache offline:
    ``speechctl tts --model nari-labs/Dia-1.6B-0626`` with no flags takes its weights by
    transformers' rule, DAC from the hub cache, and generation_config.json's greedy decoding,
    guidance scale 3 with the CFG filter at its top-k 20 and its length (max_new_tokens); the
    codes equal transformers' ``generate()`` of that directory with that generation config."""
    import shutil

    from click.testing import CliRunner
    from transformers import DiaForConditionalGeneration, GenerationConfig

    from speechctl.cli import cli

    cache = tmp_path_factory.mktemp("hf-hub")
    published = tmp_path_factory.mktemp("published") / "Dia-1.6B-0626"
    shutil.copytree(dia_path, published)
    nari_like(published, cache, generation={"do_sample": False, "guidance_scale": 3.0, "top_k": 20, "max_new_tokens": 42})
    into_hub_cache(cache, DIA_REPO, published)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    described = CliRunner().invoke(cli, ["models", DIA_REPO], catch_exceptions=False)
    text = " ".join(described.output.split())
    for expected in ("model-00001-of-00002.safetensors, model-00002-of-00002.safetensors (by model.safetensors.index.json)",
                     "dia-v1.pth, pytorch_model.bin", f"hub id {DIA_CODEC_REPO} (named in audio_tokenizer_config.json)",
                     "audio greedy; CFG scale 3 (filter top-k 20); at most 26 frames", "sample_rate 44100", "layers 2",
                     "missing nothing"):
        assert expected in text, f"{expected!r} not in {text}"

    out = tmp_path_factory.mktemp("out")
    text = "[S1] Hello. [S2] Hi there."
    result = CliRunner().invoke(cli, ["tts", text, "--model", DIA_REPO, "-o", str(out / "a.wav"),
                                      "--codes-out", str(out / "a.npy")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    codes = np.load(out / "a.npy")
    model = DiaForConditionalGeneration.from_pretrained(published).eval()  # transformers' own choice of files
    defaults = GenerationConfig.from_pretrained(published)
    if not torch.cuda.is_available():
        ref = model.generate(**processor(text=[text], return_tensors="pt"), generation_config=defaults)
        ref = ref[0, 1:].numpy()  # after the BOS frame
        ends = np.flatnonzero(ref[:, 0] == EOS)
        end = int(ends[0]) if len(ends) else 42 - 16
        expected = np.stack([ref[d : d + end, c] for c, d in enumerate(model.config.delay_pattern)])
        np.testing.assert_array_equal(codes, expected)
    follow = hf_follow(model, processor, [text], [delayed(codes, model.config.delay_pattern)], generation_config=defaults)
    assert_near_ties(follow, "published layout")  # (CUDA's check; the CPU runs it too)
