"""Whisper's token rules inside vLLM's step (``speechctl.asr.decoder.WhisperDecoding``), driven by
hand-made batch updates and random logits, against OpenAI's rules written out per row in
``test_asr_reference.Reference.filters`` (suppression, the first step, timestamp pairs and order,
the initial-timestamp limit, the timestamp-probability rule), and the sampling noise."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from speechctl.asr.decoder import SLOT_KEY, LaneSpec, WhisperDecoding, hash_uniform  # noqa: E402


@pytest.fixture(scope="module")
def model_dir():
    from speechctl.asr.checkpoint import ensure_whisper

    return ensure_whisper()


@pytest.fixture(scope="module")
def reference(model_dir):
    from test_asr_reference import Reference

    return Reference(model_dir)


def processor(model_dir, rows=8):
    config = SimpleNamespace(model_config=SimpleNamespace(model=str(model_dir), get_vocab_size=lambda: 51864),
                             scheduler_config=SimpleNamespace(max_num_seqs=rows))
    return WhisperDecoding(config, torch.device("cpu"), False)


def add(row, slot, outputs):
    return (row, SamplingParams(extra_args={SLOT_KEY: slot}), [0], outputs)


def test_every_chosen_token_follows_openais_rules(model_dir, reference):
    """Six requests (timestamps on or off, forced prefix or not) for 30 steps of random logits
    that favour timestamp tokens now and then; rows are moved and swapped on the way. Each step
    every row's token is the argmax of OpenAI's filtered logits for that request's history."""
    ref = reference
    p = processor(model_dir)
    rng = np.random.default_rng(0)
    nots = ref.no_timestamps
    lanes = {
        0: LaneSpec(timestamps=True, max_initial=50),
        1: LaneSpec(timestamps=True, max_initial=-1),
        2: LaneSpec(forced=(nots,)),
        3: LaneSpec(timestamps=True, max_initial=50, suppress_blank=False),
        4: LaneSpec(forced=(nots,), suppress_blank=False),
        5: LaneSpec(timestamps=True, max_initial=5),
    }
    p.open_lanes(lanes)
    outputs = {slot: [] for slot in lanes}  # vLLM's live lists
    row_of = {slot: slot for slot in lanes}
    p.update_state(BatchUpdate(batch_size=6, removed=[], added=[add(r, s, outputs[s]) for s, r in row_of.items()], moved=[]))
    for step in range(30):
        if step in (7, 19):  # swap two rows
            a, b = (1, 4) if step == 7 else (0, 5)
            p.update_state(BatchUpdate(batch_size=6, removed=[], added=[], moved=[(a, b, MoveDirectionality.SWAP)]))
            sa = [s for s, r in row_of.items() if r == a][0]
            sb = [s for s, r in row_of.items() if r == b][0]
            row_of[sa], row_of[sb] = b, a
        else:
            p.update_state(None)
        logits = torch.from_numpy(rng.normal(0, 2, (6, 51864)).astype(np.float32))
        logits[:, ref.ts_begin :] += float(rng.choice([-3.0, 0.0, 4.0]))
        raw = logits.clone()
        out = p.apply(logits)
        chosen = out.argmax(-1)
        assert torch.all(torch.isinf(out).sum(-1) == 51863)  # one-hot rows for vLLM's greedy sampler
        for slot, spec in lanes.items():
            r = row_of[slot]
            history = outputs[slot]
            if len(history) < len(spec.forced):
                expected = spec.forced[len(history)]
            else:
                prefix = [0] * len(spec.forced)  # (the prompt; only lengths matter to the rules)
                free = history[len(spec.forced):]
                tokens = prefix + free
                filtered = ref.filters(raw[r], tokens, len(prefix), spec.timestamps, None if spec.max_initial < 0 else spec.max_initial)
                if not spec.suppress_blank and not free:  # Reference.filters always suppresses the blank
                    filtered[ref.blank] = raw[r][ref.blank]
                    filtered[ref.suppress] = float("-inf")
                    if spec.timestamps:
                        filtered[: ref.ts_begin] = float("-inf")
                expected = int(filtered.argmax())
            assert int(chosen[r]) == expected, (step, slot)
            history.append(expected)
    assert any(t >= ref.ts_begin for t in outputs[0]) and any(t < ref.eot for t in outputs[0])


def test_sampling_noise_is_uniform_and_a_function_of_key_and_step():
    u = hash_uniform(torch.tensor([1, 1, 2]), torch.tensor([5, 5, 5]), 100_000)
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    v = hash_uniform(torch.tensor([1]), torch.tensor([6]), 100_000)
    assert abs(float(torch.corrcoef(torch.stack([u[0], v[0]]))[0, 1])) < 0.02


def test_a_seeded_draw_has_the_same_key_in_every_process():
    """The sampling key is a stable hash of (seed, job, window, temperature): two processes with
    different ``PYTHONHASHSEED`` (Python's str hash differs between them) give the same key, so
    a seeded job samples the same tokens in every run; each part of the identity changes it."""
    import os
    import subprocess
    import sys

    from speechctl.asr.whisper import sampling_key

    code = "from speechctl.asr.whisper import sampling_key; print(sampling_key(7, 'job', 2, 0.4))"
    keys = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(h)},
                           capture_output=True, text=True, check=True).stdout.strip() for h in (1, 2)}
    assert keys == {str(sampling_key(7, "job", 2, 0.4))}
    variants = [(7, "job", 2, 0.4), (8, "job", 2, 0.4), (7, "job2", 2, 0.4), (7, "job", 3, 0.4), (7, "job", 2, 0.6)]
    assert len({sampling_key(*v) for v in variants}) == len(variants)
