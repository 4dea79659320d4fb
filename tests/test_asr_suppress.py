"""Whisper's token suppression as a vLLM logits processor, driven by hand-made batch updates."""

import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from speechctl.asr.suppress import WhisperSuppress  # noqa: E402


@pytest.fixture
def processor(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"suppress_tokens": [1, 5], "begin_suppress_tokens": [2, 9]}))
    config = SimpleNamespace(model_config=SimpleNamespace(model=str(tmp_path)))
    return WhisperSuppress(config, torch.device("cpu"), False)


def update(size, removed=(), added=(), moved=()):
    return BatchUpdate(batch_size=size, removed=list(removed), added=list(added), moved=list(moved))


def masked(processor, rows):
    logits = processor.apply(torch.zeros(rows, 10))
    return [sorted(torch.isinf(row).nonzero().flatten().tolist()) for row in logits]


def test_begin_tokens_only_at_the_first_step_and_rows_follow_moves(processor):
    fresh, started = [], [7]
    processor.update_state(update(2, added=[(0, None, [0], fresh), (1, None, [0], started)]))
    assert processor.is_argmax_invariant() is False
    assert masked(processor, 2) == [[1, 2, 5, 9], [1, 5]]
    processor.update_state(update(2, moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert masked(processor, 2) == [[1, 5], [1, 2, 5, 9]]
    fresh.append(3)  # vLLM appends to the live output list: the first step is over
    processor.update_state(None)
    assert masked(processor, 2) == [[1, 5], [1, 5]]
    # row 0 finishes and a new request takes its place; then row 0 finishes again and row 1 is
    # condensed into it (vLLM applies removed, then added, then moved)
    processor.update_state(update(2, removed=[0], added=[(0, None, [0], [])]))
    assert masked(processor, 2) == [[1, 2, 5, 9], [1, 5]]
    processor.update_state(update(1, removed=[0], moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert masked(processor, 1) == [[1, 5]]
