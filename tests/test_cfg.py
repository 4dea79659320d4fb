"""Classifier-free guidance by co-scheduled request pairs: greedy parity with a batch-doubling
reference (all streams), pairs kept in lock-step under preemption, aborts, prefix sharing."""

import numpy as np
import pytest

from reference import RefRequest
from test_parity import TIE_GAP, make_engine

pytestmark = pytest.mark.engine


@pytest.fixture(autouse=True)
def strict_pairs(monkeypatch):
    """The pairing scheduler raises on any pair that gets out of step (production: counts it
    and the request fails)."""
    monkeypatch.setenv("SPEECHCTL_STRICT_PAIRS", "1")


def ref_request(req, eos_id):
    g = req.guidance
    return RefRequest(
        prompt_ids=req.prompt_ids,
        audio_items=req.audio_items,
        max_tokens=req.max_tokens,
        stop_ids=tuple(req.stop_token_ids) + (eos_id,),
        starts_in_audio=req.starts_in_audio,
        allow_audio=req.allow_audio,
        max_frames=req.max_frames,
        min_frames=req.min_frames,
        uncond_prompt_ids=req.uncond_prompt_ids,
        cfg_scale=g.scale,
        cfg_streams=g.streams,
        cfg_top_k=g.top_k,
    )


def assert_matches_reference(reference, engine, reqs, outs):
    import torch

    for req in reqs:
        out = outs[req.tag]
        assert out.error is None, f"{req.tag}: {out.error}"
        if torch.cuda.is_available():  # see test_parity.assert_matches
            reference.generate(ref_request(req, engine.spec.eos_id), forced=(out.token_ids, out.aux))
            assert all(gap < TIE_GAP for _, _, gap in reference.disagreements), reference.disagreements
            continue
        ids, aux = reference.generate(ref_request(req, engine.spec.eos_id))
        assert out.token_ids == ids, f"{req.tag}: primary stream differs"
        np.testing.assert_array_equal(out.aux, aux, err_msg=f"{req.tag}: audio streams differ")


def cfg_requests(engine, rng, n, frames=(4, 20)):
    from speechctl.engine.params import Guidance
    from speechctl.models.generic.prompts import MultiStreamPrompts

    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    K, C = engine.spec.num_codebooks, engine.spec.pattern.codebook_size
    guidances = [
        Guidance(scale=3.0),
        None,
        Guidance(scale=0.5, streams="audio"),
        Guidance(scale=2.0, streams="text"),
        None,
        Guidance(scale=1.5, top_k=5),
    ]
    reqs = []
    for i in range(n):
        g = guidances[i % len(guidances)]
        voice = rng.integers(0, C, (K, 3 + i % 7)) if i % 4 == 3 else None
        # Texts repeat (i % 8) under other guidance: equal prompts, different audio.
        text = " ".join(["word"] * (1 + i % 5)) + f" {i % 8}"
        kwargs = {"guidance": g} if g is not None else {}
        reqs.append(
            prompts.tts(text, voice_codes=voice, max_frames=int(rng.integers(*frames)), tag=f"r{i}", **kwargs)
        )
    return reqs


def test_mixed_cfg_batch_equals_reference(tiny_checkpoint, reference):
    engine = make_engine(tiny_checkpoint)
    reqs = cfg_requests(engine, np.random.default_rng(0), 12)
    assert sum(r.guidance.enabled for r in reqs) >= 6
    outs = {o.tag: o for o in engine.generate(reqs)}
    assert_matches_reference(reference, engine, reqs, outs)
    stats = engine.stats()
    assert stats["pair_violations"] == 0
    # Steps where nothing waits and every running request decodes are allocated by vLLM alone
    # (pairs.py, _plain_decode_step), checked after each step here (strict pairs); the others
    # (18 rows through 8 slots: most steps) request by request.
    assert stats["pair_steps_plain"] > 0 and stats["pair_steps_checked"] > 0, stats
    # Guidance changes the output (else this test would not test it).
    from dataclasses import replace

    from speechctl.engine.params import NO_GUIDANCE

    plain = [replace(r, guidance=NO_GUIDANCE, uncond_prompt_ids=None, tag=r.tag) for r in reqs if r.guidance.enabled]
    unguided = {o.tag: o for o in engine.generate(plain)}
    assert any(not np.array_equal(unguided[t].aux, outs[t].aux) for t in unguided)
    engine.shutdown()


def test_pairs_stay_in_step_under_preemption(tiny_checkpoint, reference):
    """64 pairs (and 16 unpaired requests) through a KV cache of 6 blocks of 32 tokens: vLLM must
    preempt over and over; no pair may ever be split and every output equals the reference."""
    engine = make_engine(tiny_checkpoint, num_kv_blocks=7, max_model_len=160, max_num_seqs=8)
    rng = np.random.default_rng(1)
    reqs = cfg_requests(engine, rng, 96, frames=(3, 14))
    assert sum(r.guidance.enabled for r in reqs) >= 64
    outs = {o.tag: o for o in engine.generate(reqs)}
    stats = engine.stats()
    assert stats["resumed"] > 0, "the small KV cache should have forced preemption"
    assert stats["pair_violations"] == 0
    assert stats["pair_steps_checked"] > 0 and stats["pair_steps_plain"] > 0, stats  # both paths ran
    assert_matches_reference(reference, engine, reqs, outs)
    assert engine.stats()["live"] == 0
    engine.shutdown()


def test_abort_frees_both_members(tiny_checkpoint):
    from speechctl.engine.params import Guidance
    from speechctl.models.generic.prompts import MultiStreamPrompts

    engine = make_engine(tiny_checkpoint)
    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    req = prompts.tts("abort me", guidance=Guidance(scale=2.0), max_frames=200, tag="a")
    keep = prompts.tts("keep me", guidance=Guidance(scale=2.0), max_frames=5, tag="k")
    engine.submit(req)
    engine.submit(keep)
    for _ in range(5):
        engine.step()
    assert engine.stats()["live"] == 4  # two pairs
    engine.abort([req.tag])
    assert engine.stats()["live"] == 2
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert [o.tag for o in outs] == ["k"] and outs[0].error is None
    assert engine.stats()["live"] == 0
    assert engine.scheduler_requests() == 0
    engine.shutdown()


def test_identical_unconditional_prompts_share_cached_blocks(tiny_checkpoint):
    from speechctl.engine.params import Guidance
    from speechctl.models.generic.prompts import MultiStreamPrompts

    engine = make_engine(tiny_checkpoint)
    prompts = MultiStreamPrompts(engine.spec, engine.tokenizer)
    first = prompts.tts("a" * 90, guidance=Guidance(scale=2.0), max_frames=3, tag="1")
    second = prompts.tts("b" * 90, guidance=Guidance(scale=2.0), max_frames=3, tag="2")
    assert first.uncond_prompt_ids == second.uncond_prompt_ids
    list(engine.generate([first]))
    (out,) = engine.generate([second])
    assert out.num_cached_tokens == 0  # its own (conditional) prompt is new
    assert out.partner_cached_tokens >= 64  # the all-pad partner reuses the first pair's blocks
    engine.shutdown()
