"""transformers' own ``generate`` made to follow our tokens: the CUDA parity check of the families
whose reference is transformers (Dia, MusicGen).

On the CPU speechctl's greedy tokens equal transformers' exactly. On CUDA vLLM's float32 kernels
round otherwise (Triton dots), so a greedy choice may flip where transformers' top two scores
are a near tie, and after a flip the two runs part ways. There the reference follows our tokens
instead, as ``test_parity``'s tolerant check does with its own reference: a logits processor put
last in transformers' list (after its CFG, its channel and end rules) notes, at every step, how
far below transformers' own choice each of our free choices scores, then forces our token, so
the next step conditions on our output. A rule token that transformers forces scores -inf when
ours differs: a gap of inf, never a tie.

Guidance widens what rounding can do, and the check follows transformers' own CFG processor:
- a merge ``a * cond + b * uncond`` moves each score by up to ``|a| + |b|`` times the logits'
  rounding, so a tie on merged scores is ``TIE_GAP * (|a| + |b|)`` (MusicGen: ``uncond + s *
  (cond - uncond)``; Dia without its filter: ``cond + s * (cond - uncond)``);
- Dia's filter keeps the top k of the merged scores, then chooses among them by the conditional
  score. A token whose merged score lies within rounding of the k-th place may be in one run's
  set and out of the other's, so such a token counts as allowed for ours and is not one that
  ours had to beat (``FollowTokens.gaps``). Ours, if transformers' filter left it out, is
  judged by its conditional score, before transformers' end rules (no run has met that).
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
        self.tie_gap = TIE_GAP  # on the scores this processor sees; put_last widens it under guidance
        self.dia_filter: tuple[torch.Tensor, torch.Tensor, int, float] | None = None  # this step's
        # (merged scores, conditional scores, k, rounding of the merged scores), from put_last

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[-1]
        tokens, free = self.at(position)
        ours = torch.as_tensor(np.asarray(tokens), dtype=torch.int64, device=scores.device)
        strict = scores.max(dim=-1).values - scores.gather(1, ours[:, None])[:, 0]
        gap = self.gaps(scores, ours).float().cpu().numpy()
        for row in np.flatnonzero(np.asarray(free) & (strict > 0).cpu().numpy()):
            self.disagreements.append((int(row), position, max(float(gap[row]), 0.0)))
        self.checked += int(np.count_nonzero(free))
        return torch.full_like(scores, float("-inf")).scatter_(1, ours[:, None], 0.0)

    def gaps(self, scores: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
        """How far below the best token it had to beat each of ours scores. Without Dia's filter
        that is transformers' argmax. With it, tokens within rounding of the filter's k-th place
        are unsure: ours may be one of them, and our run's set held the sure ones plus enough
        unsure ones to fill k places (at best for ours, those it beats most easily)."""
        if self.dia_filter is None:
            return scores.max(dim=-1).values - scores.gather(1, ours[:, None])[:, 0]
        merged, cond, k, rounding = self.dia_filter
        top = merged.topk(k + 1, dim=-1).values
        last_in, first_out = top[:, k - 1 : k], top[:, k : k + 1]
        unsure = (merged > last_in - rounding) & (merged < first_out + rounding)
        sure = (merged >= last_in) & ~unsure  # in transformers' set, and so in ours
        allowed = torch.where(unsure & torch.isinf(scores), cond, scores)  # an unsure token may be in ours
        gaps = torch.empty(len(ours), device=scores.device)
        for row, token in enumerate(ours.tolist()):
            others = unsure[row].clone()
            others[token] = False
            places = k - int(sure[row].sum()) - int(unsure[row, token])  # left for unsure others
            to_beat = scores[row][sure[row]].max() if sure[row].any() else scores.new_tensor(float("-inf"))
            if places > 0:
                to_beat = torch.maximum(to_beat, allowed[row][others].sort().values[places - 1])
            gaps[row] = to_beat - allowed[row, token]
        return gaps


class _WatchDiaFilter:
    """Dia's CFG processor with its filter, noting for ``follow`` what the filter saw."""

    def __init__(self, cfg, follow: FollowTokens):
        self.cfg, self.follow = cfg, follow

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scale = self.cfg.guidance_scale
        cond, uncond = scores.split(scores.shape[0] // 2, dim=0)  # transformers' layout: conditional rows first
        merged = cond + (cond - uncond) * scale  # transformers' Dia merge
        self.follow.dia_filter = (merged, cond, self.cfg.guidance_top_k, TIE_GAP * (1 + 2 * abs(scale)))
        return self.cfg(input_ids, scores)


@contextlib.contextmanager
def put_last(model, follow: FollowTokens):
    """Within: ``model.generate`` runs ``follow`` after the model's own logits processors (the
    list its ``_get_logits_processor`` builds), with its ties sized to their guidance. Passing it
    to ``generate`` would not do: Dia's list drops what it is passed, and MusicGen's runs it
    before its CFG merge."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (
        ClassifierFreeGuidanceLogitsProcessor,
        DiaClassifierFreeGuidanceLogitsProcessor,
    )

    chain = model._get_logits_processor

    def then_follow(*args, **kwargs):
        processors = list(chain(*args, **kwargs))
        for i, processor in enumerate(processors):
            if isinstance(processor, ClassifierFreeGuidanceLogitsProcessor):  # uncond + s (cond - uncond)
                scale = processor.guidance_scale
                follow.tie_gap = TIE_GAP * (abs(scale) + abs(1 - scale))
            elif isinstance(processor, DiaClassifierFreeGuidanceLogitsProcessor):  # cond + s (cond - uncond)
                if processor.guidance_top_k is None:  # the merged scores themselves
                    follow.tie_gap = TIE_GAP * (1 + 2 * abs(processor.guidance_scale))
                else:  # the conditional scores of the filter's top k
                    processors[i] = _WatchDiaFilter(processor, follow)
        return LogitsProcessorList([*processors, follow])

    model._get_logits_processor = then_follow
    try:
        yield
    finally:
        del model._get_logits_processor  # the class's method again


def assert_near_ties(follow: FollowTokens, name: str) -> None:
    """Each free choice of ours is transformers' own or within a tie of it, and such ties are
    rare (at most one choice in a hundred, or two)."""
    gaps = [gap for _, _, gap in follow.disagreements]
    assert all(gap < follow.tie_gap for gap in gaps), f"{name}: not a near tie: {follow.disagreements}"
    assert len(gaps) <= max(2, follow.checked // 100), f"{name}: too many near-tie flips: {follow.disagreements}"
