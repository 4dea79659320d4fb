"""transformers' own ``generate`` made to follow our tokens: the CUDA parity check of the families
whose reference is transformers (Dia, MusicGen).

On the CPU speechctl's greedy tokens equal transformers' exactly. On CUDA vLLM's float32 kernels
round otherwise (Triton dots), so a greedy choice may flip where transformers' top two scores
are a near tie, and after a flip the two runs part ways. There the reference follows our tokens
instead, as ``test_parity``'s tolerant check does with its own reference: a logits processor put
last in transformers' list (after its CFG, its channel and end rules) notes, at every step, how
far below transformers' own choice each of our free choices scores, then forces our token, so
the next step conditions on our output. A rule token that transformers forces scores -inf when
ours differs: a gap of inf, never a tie. (So does a token that Dia's CFG filter keeps out of
transformers' top-k by a near tie at the k-th place; no run has met one.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch

# A reference's top-two gap under this is a numerical tie (CUDA only; the tiny test models' logits
# span about ±5). Every CUDA parity check uses it (test_parity, test_valle, Dia, MusicGen).
TIE_GAP = 0.02


class FollowTokens:
    """A transformers logits processor. ``at(position) -> (tokens [rows], free [rows])``: our
    token of each row for the position generated now, and whether it is a free choice
    (positions transformers overwrites afterwards, such as a delay pattern's, are not)."""

    def __init__(self, at: Callable[[int], tuple[np.ndarray, np.ndarray]]):
        self.at = at
        self.disagreements: list[tuple[int, int, float]] = []  # (row, position, gap)
        self.checked = 0  # free choices seen

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[-1]
        tokens, free = self.at(position)
        ours = torch.as_tensor(np.asarray(tokens), dtype=torch.int64, device=scores.device)
        gap = (scores.max(dim=-1).values - scores.gather(1, ours[:, None])[:, 0]).float().cpu().numpy()
        for row in np.flatnonzero(np.asarray(free) & (gap > 0)):
            self.disagreements.append((int(row), position, float(gap[row])))
        self.checked += int(np.count_nonzero(free))
        return torch.full_like(scores, float("-inf")).scatter_(1, ours[:, None], 0.0)


@contextlib.contextmanager
def put_last(model, follow: FollowTokens):
    """Within: ``model.generate`` runs ``follow`` after the model's own logits processors (the
    list its ``_get_logits_processor`` builds). Passing it to ``generate`` would not do: Dia's
    list drops what it is passed, and MusicGen's runs it before its CFG merge."""
    from transformers import LogitsProcessorList

    chain = model._get_logits_processor
    model._get_logits_processor = lambda *args, **kwargs: LogitsProcessorList([*chain(*args, **kwargs), follow])
    try:
        yield
    finally:
        del model._get_logits_processor  # the class's method again


def assert_near_ties(follow: FollowTokens, name: str) -> None:
    """Each free choice of ours is transformers' own or within TIE_GAP of it, and such ties are
    rare (at most one choice in a hundred, or two)."""
    gaps = [gap for _, _, gap in follow.disagreements]
    assert all(gap < TIE_GAP for gap in gaps), f"{name}: not a near tie: {follow.disagreements}"
    assert len(gaps) <= max(2, follow.checked // 100), f"{name}: too many near-tie flips: {follow.disagreements}"
