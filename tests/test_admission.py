"""Admission without an engine: a request's budget within the engine's limits, and the vLLM
requests (members) it becomes. The engine suites run the same paths end to end; these pin the
rules one by one, with the limits set by hand."""

from types import SimpleNamespace

import numpy as np
import pytest

from speechctl.engine.admission import Admission
from speechctl.engine.params import HISTORY, Guidance, Sampling
from speechctl.engine.requests import StreamRequest
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.errors import EngineError

SPEC = StreamSpec(DelayPattern((0, 1, 2), codebook_size=16), bos_id=1, eos_id=2, pad_id=0,
                  audio_bos_id=3, audio_id=4, audio_eos_id=5)
GUIDED = Guidance(scale=2.0)


def admission(max_model_len=64, batched=32, blocks=10, block_size=4, encoder_positions=None) -> Admission:
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=batched),
                             cache_config=SimpleNamespace(num_gpu_blocks=blocks, block_size=block_size))
    return Admission(SPEC, max_model_len, config, encoder_positions)


def test_an_audio_item_counts_its_delayed_steps():
    codes = np.zeros((3, 5), dtype=np.int32)  # 5 frames under delays (0, 1, 2): 5 + 2 + 1 steps
    req = StreamRequest(prompt_ids=[7, 4, 8], max_tokens=10, audio_items=[codes])
    assert admission().prompt_length(req) == 3 - 1 + SPEC.pattern.num_steps(5) == 10


def test_frames_shrink_with_the_token_budget():
    req = StreamRequest(prompt_ids=list(range(40)), max_tokens=30, max_frames=25, starts_in_audio=True)
    assert admission(max_model_len=64).fit(req) == (24, 19)  # 6 tokens over: both lose 6
    assert admission(max_model_len=100).fit(req) == (30, 25)


@pytest.mark.parametrize("req, limits, message", [
    (StreamRequest(prompt_ids=list(range(64)), max_tokens=1), {}, "does not fit max_model_len 64"),
    (StreamRequest(prompt_ids=list(range(60)), max_tokens=10, max_frames=5, starts_in_audio=True), {},
     "leaves no room for audio"),
    (StreamRequest(prompt_ids=[1], max_tokens=5, repetition=(HISTORY + 1, 2)), {}, "past the longest speechctl keeps"),
    (StreamRequest(prompt_ids=[1, 2], max_tokens=5, guidance=GUIDED), {}, "unconditional prompt of the same length"),
    (StreamRequest(prompt_ids=[1, 2], max_tokens=5, guidance=GUIDED, uncond_prompt_ids=[1]), {}, "same length"),
    (StreamRequest(prompt_ids=list(range(20)), max_tokens=5, guidance=GUIDED, uncond_prompt_ids=list(range(20))), {},
     "both members need 40 > max_num_batched_tokens 32"),
    # 16 positions are 4 blocks of 4 each: 8 for the pair > the 7 a request may hold of 8
    (StreamRequest(prompt_ids=list(range(16)), max_tokens=5, guidance=GUIDED, uncond_prompt_ids=list(range(16))),
     {"blocks": 8}, "both members' KV exceeds the KV cache"),
])
def test_a_request_that_cannot_run_says_why(req, limits, message):
    with pytest.raises(EngineError, match=message):
        admission(**limits).fit(req)


def test_a_pairs_encoder_inputs_must_fit_one_step():
    ids = np.arange(20)
    req = StreamRequest(prompt_ids=[1], max_tokens=5, guidance=GUIDED, uncond_prompt_ids=[1], encoder_ids=ids,
                        uncond_encoder_ids=ids)
    with pytest.raises(EngineError, match="both members need 40 > the encoder's 32 per step"):
        admission(encoder_positions=None).fit(req)
    assert admission(encoder_positions=40).fit(req) == (5, 1 << 30)  # the encoder's own length is the budget


def test_an_unguided_request_is_one_member():
    codes = np.arange(12, dtype=np.int32).reshape(3, 4) % 16
    req = StreamRequest(prompt_ids=[7, 4], max_tokens=9, audio_items=[codes], seed=11, repetition=(8, 2), stream=True)
    [member] = admission().members(req, "r0")
    assert (member.key, member.partner, member.conditional, member.stream, member.max_tokens) == ("r0", None, True, True, 9)
    assert member.prompt["prompt_token_ids"] == [7, 4]
    np.testing.assert_array_equal(member.prompt["multi_modal_data"]["audio"][0], codes)
    # The repetition window starts with the prompt audio's steps, as the model saw them (delayed)
    expected = SPEC.pattern.build(codes).T[-HISTORY:]
    assert np.array_equal(np.array(member.params.history), expected)
    assert member.params.seed == 11


def test_a_cfg_request_is_a_pair_whose_partner_drops_the_condition():
    codes = np.zeros((3, 2), dtype=np.int32)
    req = StreamRequest(prompt_ids=[7, 4, 8], max_tokens=6, audio_items=[codes], guidance=GUIDED,
                        uncond_prompt_ids=[9] * 7, text=Sampling(temperature=0.7), repetition=(4, 2),
                        stream=True)
    cond, uncond = admission().members(req, "r3")
    assert (cond.key, cond.partner, cond.conditional, cond.stream) == ("r3", "r3u", True, True)
    assert (uncond.key, uncond.partner, uncond.conditional, uncond.stream) == ("r3u", "r3", False, False)
    assert uncond.prompt == {"prompt_token_ids": [9] * 7}  # no audio items: as long as the expanded prompt
    assert uncond.params.history == () and cond.params.history != ()
    # One seed, one frame budget, one guidance for both: the pair samples as one
    assert cond.params.seed == uncond.params.seed and cond.params.max_frames == uncond.params.max_frames
    assert cond.params.guidance == uncond.params.guidance == GUIDED


def test_a_request_without_a_seed_gets_a_fresh_one():
    req = StreamRequest(prompt_ids=[1], max_tokens=2)
    seeds = {admission().members(req, "r0")[0].params.seed for _ in range(4)}
    assert len(seeds) == 4
