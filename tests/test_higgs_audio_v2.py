"""Higgs Audio v2 through speechctl on vLLM equals transformers' own ``generate``, token for token
on the primary stream and all codebooks: a tiny random checkpoint written by transformers
(``save_pretrained``), loaded through speechctl's real loading code, greedy, a batch of prompts of
different lengths with and without a voice prompt, under default batching and under chunked
prefill with preemption. The codec decodes (and encodes) as transformers' tokenizer model does.
"""

from __future__ import annotations

from types import SimpleNamespace


import numpy as np
import pytest
import torch

pytestmark = pytest.mark.engine
DECODE_TOLERANCE = 1e-5  # max abs difference of float32 waveforms (observed ~1e-7: batch shapes)

CONFIGS = {
    "default": {},
    # 16-token prefill chunks; 10 usable KV blocks of 32 admit two of these prompts (116-180
    # tokens) but cannot hold both as they grow: preemption (checked below)
    "chunked-preemption": dict(max_num_batched_tokens=16, enable_chunked_prefill=True, num_kv_blocks=11, max_model_len=256),
}


@pytest.fixture(scope="module")
def higgs_path(tmp_path_factory):
    from speechctl.models.higgs.checkpoint import HiggsRecipe, create_higgs_checkpoint

    return create_higgs_checkpoint(tmp_path_factory.mktemp("higgs") / "tiny-higgs", HiggsRecipe(seed=1))


@pytest.fixture(scope="module")
def hf_model(higgs_path):
    from transformers import HiggsAudioV2ForConditionalGeneration

    return HiggsAudioV2ForConditionalGeneration.from_pretrained(higgs_path).eval().float()


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, higgs_path):
    from test_parity import make_engine

    eng = make_engine(higgs_path, **CONFIGS[request.param])
    eng.name = request.param
    yield eng
    eng.shutdown()


def prompts_of(engine):
    return engine.prompt_builder()


def requests(engine, rng):
    prompts = prompts_of(engine)
    K, C = engine.spec.num_codebooks, engine.spec.pattern.codebook_size
    texts = ["Hi", "Hello world", "A longer sentence to speak aloud.", "Ünïcödé ✓ " * 3]
    reqs = [prompts.tts(t, max_frames=60, tag=f"tts{i}") for i, t in enumerate(texts)]
    for i, frames in enumerate([5, 13]):
        voice = rng.integers(0, C, (K, frames))
        reqs.append(prompts.tts(f"cloned {i}", voice_codes=voice, voice_text="the reference", max_frames=60, tag=f"voice{i}"))
    return reqs


def hf_generate(model, spec, reqs) -> dict:
    """transformers' generate on the whole batch (left-padded text, right-padded audio codes laid
    out by its processor's own ``build_delay_pattern``); per request the generated (ids, aux)."""
    from transformers import HiggsAudioV2Processor

    K, pat = spec.num_codebooks, spec.pattern
    layout = SimpleNamespace(audio_stream_bos_id=pat.bos, audio_stream_eos_id=pat.eos)
    rows, audio = [], []
    for req in reqs:
        ids, steps = [], []
        for tok in req.prompt_ids:
            if tok != spec.audio_id:
                ids.append(tok)
                continue
            codes = torch.as_tensor(req.audio_items[len(steps)])[None]  # [1, K, T]
            bos, eos = torch.full((1, K, 1), pat.bos), torch.full((1, K, 1), pat.eos)
            item = HiggsAudioV2Processor.build_delay_pattern(layout, torch.cat([bos, codes, eos], dim=2))[0].T
            steps.append(item)  # [S, K]; text: AUDIO_OUT x (S - K + 1), delay x (K - 1)
            ids += [spec.audio_id] * (len(item) - K + 1) + [spec.flush_id] * (K - 1)
        rows.append(ids)
        audio.append(torch.cat(steps) if steps else torch.zeros(0, K, dtype=torch.long))
    P = max(map(len, rows))
    input_ids = torch.tensor([[spec.pad_id] * (P - len(r)) + r for r in rows])
    A = max(len(a) for a in audio)
    kwargs = {}
    if A:
        kwargs["audio_input_ids"] = torch.stack([torch.cat([a, torch.full((A - len(a), K), pat.eos)]) for a in audio])
        kwargs["audio_input_ids_mask"] = torch.arange(A)[None] < torch.tensor([len(a) for a in audio])[:, None]
    max_new = max(r.max_tokens for r in reqs)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=(input_ids != spec.pad_id).long(),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=spec.audio_eos_id,
        pad_token_id=spec.pad_id,
        return_dict_in_generate=True,
        **kwargs,
    )
    generated = out.sequences[:, P:]
    n = generated.shape[1]
    results = {}
    for b, req in enumerate(reqs):
        ids = generated[b].tolist()
        end = ids.index(spec.audio_eos_id) + 1 if spec.audio_eos_id in ids else len(ids)
        assert end < max_new - K - 2, f"{req.tag}: the reference did not end its audio by itself"
        results[req.tag] = (ids[:end], out.audio_sequences[b, -n:][:end].numpy())
    return results


def test_greedy_generation_equals_transformers(engine, hf_model):
    reqs = requests(engine, np.random.default_rng(0))
    outs = {o.tag: o for o in engine.generate(reqs)}
    expected = hf_generate(hf_model, engine.spec, reqs)
    for req in reqs:
        out = outs[req.tag]
        assert out.error is None, out.error
        ids, aux = expected[req.tag]
        name = f"{engine.name}/{req.tag}"
        assert out.token_ids == ids, f"{name}: primary stream differs"
        np.testing.assert_array_equal(out.aux, aux, err_msg=f"{name}: codebooks differ")
    assert len({len(o.token_ids) for o in outs.values()}) >= 3, "requests should end at different steps"
    if engine.name == "chunked-preemption":
        assert engine.stats()["resumed"] > 0, "the small KV cache should have forced preemption"


def test_voice_prompt_changes_the_output(engine):
    """The voice codes reach the model (else the voice tests above would test nothing)."""
    prompts = prompts_of(engine)
    K, C = engine.spec.num_codebooks, engine.spec.pattern.codebook_size
    rng = np.random.default_rng(5)
    a = prompts.tts("same text", voice_codes=rng.integers(0, C, (K, 9)), voice_text="x", max_frames=20, tag="a")
    b = prompts.tts("same text", voice_codes=rng.integers(0, C, (K, 9)), voice_text="x", max_frames=20, tag="b")
    outs = {o.tag: o for o in engine.generate([a, b])}
    assert not np.array_equal(outs["a"].aux, outs["b"].aux)


def test_audio_segments_read_like_the_processor(engine, hf_model):
    """Our reading of generated streams into codes equals the processor's ``batch_decode``
    slicing and ``revert_delay_pattern`` (the codec call itself is tested below)."""
    from transformers import HiggsAudioV2Processor

    prompts = prompts_of(engine)
    reqs = requests(engine, np.random.default_rng(1))[:3]
    pat = engine.spec.pattern
    for out in engine.generate(reqs):
        (codes,) = prompts.audio_segments(out)
        steps = torch.as_tensor(out.aux)
        ends = (steps == pat.eos).all(-1).nonzero()
        end = int(ends[0]) if len(ends) else len(steps)
        processor = SimpleNamespace()
        reverted = HiggsAudioV2Processor.revert_delay_pattern(processor, steps[1:end]).clip(0, pat.bos - 1)
        np.testing.assert_array_equal(codes, reverted.T.numpy())


@pytest.fixture(scope="module")
def codec(higgs_path):
    from speechctl.codecs import load_codec

    return load_codec(higgs_path / "audio_tokenizer")


def test_codec_decode_equals_transformers(codec):
    """Batched decode of items of different lengths equals transformers' decode of each alone."""
    model = codec.model
    rng = np.random.default_rng(2)
    items = [rng.integers(0, codec.codebook_size, (codec.num_codebooks, n)) for n in (1, 7, 30, 64)]
    waves = codec.decode(items)
    for item, wave in zip(items, waves):
        with torch.no_grad():
            ref = model.decode(torch.as_tensor(item)[None]).audio_values[0, 0].numpy()
        assert wave.shape == (item.shape[1] * codec.hop_length,) == ref.shape
        np.testing.assert_allclose(wave, ref, atol=DECODE_TOLERANCE, rtol=0)


def test_codec_encode_equals_transformers(codec):
    rng = np.random.default_rng(3)
    waves = [(0.1 * rng.standard_normal(n * codec.hop_length)).astype(np.float32) for n in (3, 12, 12, 40)]
    for wave, codes in zip(waves, codec.encode(waves)):
        with torch.no_grad():
            ref = codec.model.encode(torch.as_tensor(wave)[None, None]).audio_codes[0].numpy()
        np.testing.assert_array_equal(codes, ref)


def test_speech_api_and_models_command(higgs_path):
    """--model DIR picks the family by its config.json: prompts, codec, voice cloning."""
    from click.testing import CliRunner

    from speechctl.api import Speech, TtsJob
    from speechctl.cli import cli
    from speechctl.engine.engine import EngineConfig

    result = CliRunner().invoke(cli, ["models"])
    assert "HiggsAudioV2ForConditionalGeneration" in result.output
    result = CliRunner().invoke(cli, ["models", str(higgs_path)])
    assert result.exit_code == 0 and "higgs_audio_v2_tokenizer" in result.output, result.output

    config = EngineConfig(max_model_len=512, max_num_seqs=4, dtype="float32", block_size=32, kv_cache_bytes=1 << 26)
    speech = Speech(higgs_path, engine_config=config)
    try:
        rate = speech.sample_rate
        voice = (0.1 * np.sin(np.arange(rate) * 0.05)).astype(np.float32)
        jobs = [
            TtsJob(id="plain", text="Hello there.", max_seconds=2.0),
            TtsJob(id="cloned", text="Hello there.", voice=voice, voice_text="a reference", max_seconds=2.0),
        ]
        results = {r.id: r for r in speech.run(jobs)}
        for r in results.values():
            assert r.error is None, r.error
            assert r.codes.shape[0] == speech.codec.num_codebooks
            assert len(r.audio) == r.codes.shape[1] * speech.codec.hop_length
        assert not np.array_equal(results["plain"].codes, results["cloned"].codes)
        # Streaming reads the family's layout as it grows: the same audio as the one-shot run.
        from test_streaming import assert_stream_equals_run

        assert_stream_equals_run(speech, lambda: [TtsJob(id=f"s{i}", text=f"Streamed {i}.", seed=i, max_seconds=1.0) for i in range(3)])
    finally:
        speech.close()


def test_cli_voice_with_its_transcript(higgs_path, tmp_path):
    """`tts --voice WAV --voice-text TEXT`: the transcript reaches the Higgs prompt."""
    import soundfile as sf
    from click.testing import CliRunner

    from speechctl.cli import cli
    from speechctl.api import _LOADED

    from speechctl.models.catalog import codec_sample_rate
    from speechctl.models.families import open_checkpoint

    rate = codec_sample_rate(open_checkpoint(higgs_path))
    voice = tmp_path / "voice.wav"
    sf.write(voice, (0.1 * np.sin(np.arange(rate) * 0.05)).astype(np.float32), rate)
    common = ["tts", "Hello there.", "--model", str(higgs_path), "--voice", str(voice), "--audio-temperature", "0",
              "--max-seconds", "1", "--max-num-seqs", "4", "--max-model-len", "512", "--dtype", "float32"]
    outs = {}
    for name, extra in (("bare", []), ("transcribed", ["--voice-text", "a reference recording"])):
        outs[name] = tmp_path / f"{name}.wav"
        result = CliRunner().invoke(cli, common + extra + ["-o", str(outs[name])])
        assert result.exit_code == 0, result.output
    bare, transcribed = (sf.read(outs[n])[0] for n in ("bare", "transcribed"))
    assert len(bare) and len(transcribed)
    assert len(bare) != len(transcribed) or not np.array_equal(bare, transcribed), "the transcript changed nothing"
    result = CliRunner().invoke(cli, ["tts", "Hi", "-o", str(tmp_path / "x.wav"), "--voice-text", "orphan"])
    assert result.exit_code != 0 and "--voice-text needs --voice" in result.output
    for key in [k for k in _LOADED if k[:2] == ("speech", str(higgs_path))]:
        _LOADED.pop(key).close()


def test_torchaudio_stand_in_resamples():
    """transformers' tokenizer resamples 24 kHz to 16 kHz with torchaudio; where torchaudio does
    not import, speechctl's stand-in does it (its algorithm, checked bit-exact against torchaudio
    2.9.0 once, see docs/families.md): lengths round up, a tone keeps its pitch and level."""
    from speechctl.codecs.torchaudio_shim import resample

    t = torch.arange(24000) / 24000
    tone = torch.sin(2 * torch.pi * 440 * t)[None, None]
    out = resample(tone, 24000, 16000)
    assert out.shape == (1, 1, 16000)
    assert resample(torch.zeros(2, 1001), 24000, 16000).shape == (2, 668)
    expected = torch.sin(2 * torch.pi * 440 * torch.arange(16000) / 16000)
    middle = slice(100, -100)  # the ends see the zero padding
    assert (out[0, 0, middle] - expected[middle]).abs().max() < 0.02


def test_the_benches_tokenizer_has_the_published_frame_rate():
    """The real-size benches speak through the published tokenizer's shape: 24 kHz, 25 frames/s
    (transformers' default strides would give 75: three times the frames per second of audio)."""
    from transformers import HiggsAudioV2TokenizerConfig

    from speechctl.models.higgs.checkpoint import HIGGS_3B_WITH_TOKENIZER

    config = HiggsAudioV2TokenizerConfig(**HIGGS_3B_WITH_TOKENIZER.codec_config)
    assert (config.sample_rate, config.frame_rate, config.hop_length) == (24000, 25, 960)
    assert config.semantic_downsample_factor == 2  # HuBERT's 50 frames/s at 16 kHz, halved


def test_the_dual_ffn_warms_each_kind_of_step_size_once():
    """The fused MoE kernel's kinds past the captured graphs (the real 3B's DualFFN, vLLM's tiles
    by token count): one count of each residue mod 16 per tile set, the smallest of each, and
    every count in the range of a kind one of them has."""
    from speechctl.engine import vllm_compat
    from speechctl.models.higgs.dual_mlp import eager_token_counts

    w13 = torch.empty(2, 2 * 8192, 3072, dtype=torch.bfloat16, device="meta")
    w2 = torch.empty(2, 3072, 8192, dtype=torch.bfloat16, device="meta")
    tiles = lambda n: vllm_compat.grouped_mlp_tiles(n, w13, w2)
    assert eager_token_counts(513, 8192, tiles) == list(range(513, 529))  # (one tile set past 512)
    counts = eager_token_counts(1, 600, tiles)
    kind = lambda n: (tuple(sorted(tiles(n).items())), n % 16, n == 1)
    assert len({kind(n) for n in counts}) == len(counts) and {kind(n) for n in range(1, 601)} == {kind(n) for n in counts}
    assert all(kind(m) != kind(n) for n in counts for m in range(1, n))  # the first of its kind
    assert len({tuple(sorted(tiles(n).items())) for n in counts}) > 3  # (vLLM's tiles grow with the count)
    assert eager_token_counts(2049, 2048, tiles) == []  # graphs up to the step's largest: nothing eager


def test_warmed_dual_ffn_steps_compile_nothing(tmp_path, monkeypatch):
    """On CUDA, after ``warm_grouped_kernels`` over a range of step sizes, the grouped path at
    every size of it makes Triton compile no kernel (its on-disk cache, here a fresh folder, gains
    none); other tiles in force do (the count sees compiles)."""
    from speechctl.engine import vllm_compat

    if not torch.cuda.is_available() or not vllm_compat.grouped_mlp_available():
        pytest.skip("vLLM's fused MoE kernel runs on CUDA only")
    from triton import knobs

    from speechctl.bench.workload import _triton_compiled_since, _triton_kernels
    from speechctl.models.higgs.dual_mlp import DualMLP, warm_grouped_kernels

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "triton"))
    mlp = DualMLP(256, 512, 0, 1).to("cuda", torch.bfloat16)
    torch.nn.init.normal_(mlp.w13, std=0.05), torch.nn.init.normal_(mlp.w2, std=0.05)
    first, last = 97, 700
    assert warm_grouped_kernels(mlp, first, last)
    before = _triton_kernels()
    for n in range(first, last + 1):
        x = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16)
        vllm_compat.grouped_mlp(x, mlp.w13, mlp.w2, (torch.rand(n, 1, device="cuda") < 0.5).to(torch.int32))
    torch.cuda.synchronize()
    assert _triton_compiled_since(before)["triton_kernels_compiled"] == 0
    odd = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "SPLIT_K": 1, "num_warps": 2, "num_stages": 2}
    with vllm_compat.grouped_mlp_config(odd):
        vllm_compat.grouped_mlp(x, mlp.w13, mlp.w2, torch.ones(n, 1, device="cuda", dtype=torch.int32))
    torch.cuda.synchronize()
    assert _triton_compiled_since(before)["triton_kernels_compiled"] > 0
