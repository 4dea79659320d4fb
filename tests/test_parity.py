"""Greedy generation through speechctl on vLLM equals the plain-PyTorch reference, token for
token on every stream, under continuous batching, chunked prefill, preemption and prefix caching."""

import numpy as np
import pytest

from follow_tokens import TIE_GAP
from reference import RefRequest

pytestmark = pytest.mark.engine
TIES = []  # near-tie flips seen on CUDA, all tests of this module

CONFIGS = {
    "default": {},
    "chunked-prefill": dict(max_num_batched_tokens=16, enable_chunked_prefill=True),
    # 4 usable blocks of 32 tokens: one request of max length at a time (requests take 20-90)
    "preemption": dict(num_kv_blocks=5, max_model_len=128),
}


def make_engine(path, **overrides):
    from speechctl.engine.engine import EngineConfig, SpeechEngine

    # A fixed, small KV cache so that several engines fit beside each other (CPU and GPU).
    settings = dict(max_model_len=512, max_num_seqs=8, dtype="float32", block_size=32, kv_cache_bytes=1 << 27)
    config = EngineConfig(**{**settings, **overrides})
    return SpeechEngine(path, config)


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, tiny_checkpoint):
    eng = make_engine(tiny_checkpoint, **CONFIGS[request.param])
    eng.name = request.param
    yield eng
    eng.shutdown()


def mixed_requests(engine, rng):
    from speechctl.models.generic.prompts import MultiStreamPrompts
    from speechctl.models.prompting import VoicePrompt

    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    K, C = engine.spec.num_codebooks, engine.spec.pattern.codebook_size
    reqs = []
    texts = ["Hi", "Hello world", "A longer sentence to speak aloud.", "x" * 40, "Ünïcödé ✓"]
    for i, text in enumerate(texts):
        reqs.append(prompts.tts(text, max_frames=4 + 9 * i, tag=f"tts{i}"))
    reqs.append(prompts.tts("with a voice", voice_codes=rng.integers(0, C, (K, 13)), max_frames=20, tag="voice"))
    reqs.append(prompts.tts("at least twelve", min_frames=12, max_frames=30, tag="min"))
    # speech that follows on from a voice prompt: its audio laid out open, its delayed streams'
    # last frames forced on the first steps (a resumed request keeps them: "preemption")
    said = VoicePrompt("so far", rng.integers(0, C, (K, 11)), lead_frames=3)
    reqs.append(prompts.tts("and then it goes on", continues=said, max_frames=18, tag="continues"))
    for i, frames in enumerate([3, 17, 40, 25]):
        reqs.append(prompts.asr(rng.integers(0, C, (K, frames)), max_tokens=6 + 7 * i, tag=f"asr{i}"))
    return reqs


def _ref_request(req, eos_id):
    ref = RefRequest(
        prompt_ids=req.prompt_ids,
        audio_items=req.audio_items,
        max_tokens=req.max_tokens,
        stop_ids=tuple(req.stop_token_ids) + (eos_id,),
        starts_in_audio=req.starts_in_audio,
        allow_audio=req.allow_audio,
        max_frames=req.max_frames,
        min_frames=req.min_frames,
        continues=req.continues,
    )
    return ref


def reference_output(reference, req, eos_id):
    return reference.generate(_ref_request(req, eos_id))


def assert_matches(reference, engine, reqs, outs, tolerant: bool | None = None):
    """On the CPU (IEEE float32 throughout) every token of every stream must equal the
    reference's. On CUDA, vLLM's float32 attention kernels round differently (Triton dots), so a
    greedy choice may flip where the reference's top two logits are a near tie: there the
    reference follows our tokens and each disagreement must be such a tie (gap < TIE_GAP).
    ``tolerant``: that check anywhere (tensor parallelism sums shards in another order)."""
    import torch

    tolerant = torch.cuda.is_available() if tolerant is None else tolerant
    for req in reqs:
        out = outs[req.tag]
        assert out.error is None, out.error
        name = f"{engine.name}/{req.tag}"
        if not tolerant:
            ids, aux = reference_output(reference, req, engine.spec.eos_id)
            assert out.token_ids == ids, f"{name}: primary stream differs"
            np.testing.assert_array_equal(out.aux, aux, err_msg=f"{name}: audio streams differ")
            continue
        reference.generate(_ref_request(req, engine.spec.eos_id), forced=(out.token_ids, out.aux))
        ties = reference.disagreements
        assert all(gap < TIE_GAP for _, _, gap in ties), f"{name}: not a near tie: {ties}"
        TIES.extend(ties)
    assert len(outs) == len(reqs)
    total = sum(len(o.token_ids) * (1 + engine.spec.num_codebooks) for o in outs.values())
    assert len(TIES) <= max(2, total // 100), f"too many near-tie flips: {TIES}"


def test_mixed_batch_equals_reference(engine, reference):
    reqs = mixed_requests(engine, np.random.default_rng(0))
    assert len(reqs) >= 8
    outs = {o.tag: o for o in engine.generate(reqs)}
    assert_matches(reference, engine, reqs, outs)
    lengths = {len(o.token_ids) for o in outs.values()}
    assert len(lengths) >= 5, "rows should finish at different steps"
    # the continued speech's first step holds each delayed stream's next frame of the prompt
    (codes,) = next(r for r in reqs if r.tag == "continues").audio_items
    first = outs["continues"].aux[0]
    delays = engine.spec.pattern.delays
    assert [int(first[k]) for k, d in enumerate(delays) if d] == [int(codes[k, -d]) for k, d in enumerate(delays) if d]
    # The configuration did what it is named after.
    if engine.name == "chunked-prefill":
        assert max(len(r.prompt_ids) for r in reqs) > 16 or any(r.audio_items for r in reqs)
    if engine.name == "preemption":
        assert engine.stats()["resumed"] > 0, "the tiny KV cache should have forced preemption"


def test_tts_output_is_a_complete_delay_layout(engine):
    """Every TTS output ends its audio with each stream's EOS at its delay, then <|audio_eos|>."""
    from speechctl.models.generic.prompts import MultiStreamPrompts

    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    reqs = [prompts.tts("abc" * n, max_frames=3 + n, tag=n) for n in range(4)]
    reqs.append(prompts.tts("fixed length", max_frames=9, min_frames=9, tag=6))
    for out in engine.generate(reqs):
        (codes,) = prompts.audio_segments(out, starts_in_audio=True)
        assert 1 <= codes.shape[1] <= 3 + out.tag
        if out.tag == 6:
            assert codes.shape[1] == 9
        assert out.token_ids[-1] == engine.spec.audio_eos_id


def test_prefix_cache_does_not_mix_audio(tiny_checkpoint, reference):
    """Two prompts with identical primary tokens but different audio codes: the second must not
    reuse KV computed for the first (vLLM hashes the audio items into the block hashes)."""
    from speechctl.models.generic.prompts import MultiStreamPrompts

    engine = make_engine(tiny_checkpoint)
    engine.name = "prefix-cache"
    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    rng = np.random.default_rng(7)
    K, C = engine.spec.num_codebooks, engine.spec.pattern.codebook_size
    a, b = rng.integers(0, C, (K, 60)), rng.integers(0, C, (K, 60))
    first = prompts.asr(a, max_tokens=12, tag="a")
    second = prompts.asr(b, max_tokens=12, tag="b")
    again = prompts.asr(a, max_tokens=12, tag="a2")
    assert first.prompt_ids == second.prompt_ids
    outs = {}
    for req in (first, second, again):  # one after another, so cached blocks exist
        outs.update({o.tag: o for o in engine.generate([req])})
    assert_matches(reference, engine, [first, second, again], outs)
    assert outs["a"].token_ids != outs["b"].token_ids, "test needs audio that changes the output"
    # Prefix caching is on and works: the repeat hits the cache beyond the text prefix, the
    # prompt with other audio does not.
    shared_text = 3  # <bos> <|asr|> <|audio_bos|>; the audio steps follow
    assert outs["a2"].num_cached_tokens > shared_text
    assert outs["b"].num_cached_tokens <= shared_text
    engine.shutdown()


@pytest.mark.parametrize("backbone", ["qwen3", "qwen2"])
def test_other_backbones_equal_reference(tmp_path, backbone):
    """The backbone is vLLM's own implementation chosen by config.json's model_type."""
    from reference import ReferenceModel
    from speechctl.models.generic.checkpoint import MultiStreamRecipe, create_multistream_checkpoint

    path = create_multistream_checkpoint(tmp_path / backbone, MultiStreamRecipe(backbone=backbone, seed=5, init_std=0.3))
    engine = make_engine(path)
    engine.name = backbone
    reqs = mixed_requests(engine, np.random.default_rng(1))[::2]
    outs = {o.tag: o for o in engine.generate(reqs)}
    assert_matches(ReferenceModel(path), engine, reqs, outs)
    engine.shutdown()


def test_audio_budget_shrinks_to_fit_max_model_len(engine):
    """A TTS prompt close to max_model_len gets fewer frames, but its audio still ends properly."""
    from speechctl.models.generic.prompts import MultiStreamPrompts

    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    limit = engine.config.max_model_len
    req = prompts.tts("y" * (limit - 40), max_frames=100)
    (out,) = engine.generate([req])
    assert out.error is None
    assert engine.admission.prompt_length(req) + len(out.token_ids) <= limit
    (codes,) = prompts.audio_segments(out, starts_in_audio=True)
    assert 1 <= codes.shape[1] < 100


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    """Sampled audio streams (temperature, top-k, top-p) with a seed come out the same whether
    the request runs alone or beside others with other settings."""
    from speechctl.engine.params import Sampling
    from speechctl.models.generic.prompts import MultiStreamPrompts

    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    audio = Sampling(temperature=1.0, top_k=20, top_p=0.9)

    def target():
        return prompts.tts("Sample me.", audio_sampling=audio, seed=11, max_frames=30, tag="target")

    (alone,) = engine.generate([target()])
    others = [
        prompts.tts(f"Other {i}", audio_sampling=Sampling(temperature=0.5 + i), seed=i, max_frames=10 + i, tag=i)
        for i in range(5)
    ]
    together = {o.tag: o for o in engine.generate(others[:2] + [target()] + others[2:])}
    assert together["target"].token_ids == alone.token_ids
    np.testing.assert_array_equal(together["target"].aux, alone.aux)
    greedy = prompts.tts("Sample me.", max_frames=30)
    (g,) = engine.generate([greedy])
    assert not np.array_equal(g.aux, alone.aux), "sampling should differ from greedy"


def test_generated_blocks_stay_out_of_the_prefix_cache(tiny_checkpoint):
    """A generated block's KV depends on sampled audio tokens that vLLM's block hashes do not
    see, so two requests with one prompt would share wrong KV after a preemption. Only prompt
    blocks may be cached: a prompt that repeats another request's prompt and primary outputs
    hits the cache for the prompt part only."""
    from speechctl.engine.engine import StreamRequest
    from speechctl.errors import EngineError
    from speechctl.models.generic.prompts import MultiStreamPrompts

    engine = make_engine(tiny_checkpoint)
    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    first = prompts.tts("z" * 62, max_frames=70, min_frames=70)  # 65-token prompt: 2 full blocks
    (out,) = engine.generate([first])
    assert len(out.token_ids) > 64
    replay = StreamRequest(prompt_ids=first.prompt_ids + out.token_ids[:64], max_tokens=1, allow_audio=False)
    (again,) = engine.generate([replay])
    assert again.num_cached_tokens == 64  # the prompt's two full blocks, nothing generated
    # a benchmark's next round: the same prompt prefilled anew once the cache is emptied
    engine.forget_cached_prompts()
    (fresh,) = engine.generate([StreamRequest(prompt_ids=first.prompt_ids, max_tokens=1, allow_audio=False)])
    assert fresh.num_cached_tokens == 0
    engine.submit(StreamRequest(prompt_ids=first.prompt_ids, max_tokens=4, allow_audio=False))
    with pytest.raises(EngineError, match="only while no request runs"):
        engine.forget_cached_prompts()
    list(engine.generate([]))  # (the submitted request runs to its end)
    engine.shutdown()


def test_compiled_step_equals_reference(tiny_checkpoint, reference, monkeypatch):
    """The per-step work compiled with torch.compile (SPEECHCTL_COMPILE=1) computes the same,
    after the start-up warm-up that compiles it has left the engine empty."""
    monkeypatch.setenv("SPEECHCTL_COMPILE", "1")
    engine = make_engine(tiny_checkpoint)
    # the warm-up ran (the benches report its time; near 0 when this process compiled before)
    assert engine.warm_up_s is not None
    assert not engine.has_work() and engine.scheduler_requests() == 0
    assert engine.stats()["live"] == 0
    engine.name = "compiled"
    reqs = mixed_requests(engine, np.random.default_rng(2))[::2]
    outs = {o.tag: o for o in engine.generate(reqs)}
    assert_matches(reference, engine, reqs, outs)
    engine.shutdown()


def test_per_step_work_compiles_by_default_on_cuda_only(monkeypatch):
    """Compiled on CUDA, eager on the CPU (compiling would dominate a short CPU run); the
    environment overrides either way, and a value it does not know is an error that names it."""
    import torch

    from speechctl.engine.runtime import compile_per_step_work
    from speechctl.errors import EngineError

    monkeypatch.delenv("SPEECHCTL_COMPILE", raising=False)
    for cuda in (True, False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert compile_per_step_work() is cuda
        monkeypatch.setenv("SPEECHCTL_COMPILE", "0")
        assert compile_per_step_work() is False
        monkeypatch.setenv("SPEECHCTL_COMPILE", "1")
        assert compile_per_step_work() is True
        monkeypatch.delenv("SPEECHCTL_COMPILE")
    monkeypatch.setenv("SPEECHCTL_COMPILE", "yes")
    with pytest.raises(EngineError, match="SPEECHCTL_COMPILE='yes'"):
        compile_per_step_work()


def test_streamed_pieces_add_up_to_the_whole_output(engine):
    """A ``stream`` request reports its new tokens (all streams) every step; the pieces
    concatenate to exactly what the same request returns in one piece."""
    from dataclasses import replace

    reqs = mixed_requests(engine, np.random.default_rng(3))[:6]
    whole = {o.tag: o for o in engine.generate(reqs)}
    pieces = {}
    for out in engine.generate([replace(r, stream=True) for r in reqs]):
        pieces.setdefault(out.tag, []).append(out)
    for tag, parts in pieces.items():
        assert [p.finished for p in parts] == [False] * (len(parts) - 1) + [True]
        assert len(parts) > 1 or len(whole[tag].token_ids) == 1
        assert sum((p.token_ids for p in parts), []) == whole[tag].token_ids
        np.testing.assert_array_equal(np.concatenate([p.aux for p in parts]), whole[tag].aux)


@pytest.mark.parametrize("every", [2, 5])
def test_streamed_pieces_asked_for_every_few_tokens_still_add_up(engine, every):
    """``report_after``: after its first piece a streamed request's pieces come only once
    ``every`` new tokens came (vLLM's per-request stream interval, set mid-request), its last one
    as always; nothing is dropped or repeated: they concatenate to the one-piece output."""
    from dataclasses import replace

    reqs = mixed_requests(engine, np.random.default_rng(3))[:6]
    whole = {o.tag: o for o in engine.generate(reqs)}
    pieces = {}
    for out in engine.generate([replace(r, stream=True) for r in reqs]):
        if not pieces.get(out.tag):
            engine.report_after(out, every)  # (a finished request: nothing to do)
        pieces.setdefault(out.tag, []).append(out)
    for tag, parts in pieces.items():
        assert [p.finished for p in parts] == [False] * (len(parts) - 1) + [True]
        assert all(len(p.token_ids) >= every for p in parts[1:-1])
        assert len(parts) <= 2 + len(whole[tag].token_ids) // every
        assert sum((p.token_ids for p in parts), []) == whole[tag].token_ids
        np.testing.assert_array_equal(np.concatenate([p.aux for p in parts]), whole[tag].aux)
