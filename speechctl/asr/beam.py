"""Beam search as OpenAI's Whisper defines it (``whisper/decoding.py``: ``BeamSearchDecoder``,
``MaximumLikelihoodRanker``), kept on the host for many windows at once.

Each window's beam is a ``BeamGroup`` of B lanes; each lane is one vLLM request. A step takes,
for every lane, the top B+1 log-probabilities of its next token (computed on the device, after
Whisper's token rules), and returns for every lane the token it continues with and the lane
whose history it continues (its parent). A lane whose parent is another lane gets a copy of the
parent's KV cache (``vllm_compat.SelfAttentionKv``), so the search never re-runs the encoder or the
prompt. The rules, per step::

    candidates   every lane's top B+1 tokens, score = the lane's sum of log-probs + the token's
                 (float32); at the first step only lane 0 (all lanes are still identical)
    ranking      by score, best first; ties keep the order lane by lane, then token rank
    kept         the first B candidates that are not <|endoftext|>
    finished     the <|endoftext|> candidates ranked before the B-th kept one; they join the
                 window's finished list, best first, until it holds round(B * patience)
    done         when the finished list is full, or after ``sample_len`` steps; then, if fewer
                 than B finished, the running lanes (best sum first) are added as if they ended
    result       the finished sequence with the highest sum / penalty, penalty = its length in
                 tokens (length_penalty None) or ((5 + length) / 6) ** length_penalty

transformers' ``generate(num_beams=B)`` scores differently (its logits processors mask
log-probabilities after the softmax, without renormalising; an <|endoftext|> candidate finishes a
beam only when ranked among the first B; its length penalty counts the <|endoftext|>): the two
coincide with ``length_penalty=0`` (transformers: ``length_penalty=0.0``), ``patience=1``
(``early_stopping=True``), no probability mass on suppressed tokens, and no <|endoftext|> ranked
B-th or later before the B-th kept candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class BeamGroup:
    """One window's beam search: B lanes' histories and scores, and the finished list."""

    size: int
    max_candidates: int
    length_penalty: float | None
    sample_len: int  # free steps at most
    eot: int
    lanes: list[list[int]] = field(default_factory=list)  # free tokens of each lane
    sum_logprobs: np.ndarray | None = None  # [B] float32
    finished: dict = field(default_factory=dict)  # tuple(tokens + [eot]) -> score, in order found
    step: int = 0  # free steps taken
    result: tuple[list[int], float] | None = None
    seen: int = 0  # engine steps its lanes took (forced prefix included)
    broken: bool = False  # its lanes fell out of step (the window is decoded again)

    def __post_init__(self):
        self.lanes = [[] for _ in range(self.size)]
        self.sum_logprobs = np.zeros(self.size, np.float32)

    @property
    def done(self) -> bool:
        return self.result is not None

    def finalize(self) -> tuple[list[int], float]:
        """The chosen sequence (without <|endoftext|>) and its sum of log-probabilities."""
        if len(self.finished) < self.size:
            for j in np.argsort(self.sum_logprobs)[::-1]:
                self.finished[tuple(self.lanes[j]) + (self.eot,)] = float(self.sum_logprobs[j])
                if len(self.finished) >= self.size:
                    break
        sequences = [list(s[: s.index(self.eot)]) for s in self.finished]
        scores = list(self.finished.values())
        best = rank(sequences, scores, self.length_penalty)
        self.result = (sequences[best], scores[best])
        return self.result


def ranking_score(sum_logprob: float, length: int, length_penalty: float | None) -> float:
    """OpenAI's ``MaximumLikelihoodRanker`` score (an empty sequence ranks last rather than
    dividing by zero)."""
    penalty = length if length_penalty is None else ((5 + length) / 6) ** length_penalty
    return sum_logprob / penalty if penalty else -np.inf


def rank(sequences: list[list[int]], sum_logprobs: list[float], length_penalty: float | None) -> int:
    """Index of the best of several candidates (best-of-N sampling, beams)."""
    return int(np.argmax([ranking_score(lp, len(t), length_penalty) for t, lp in zip(sequences, sum_logprobs)]))


@dataclass
class StepChoice:
    """What one beam step decided for one group: lane ``dest[i]`` continues lane
    ``parent[i]``'s history with ``token[i]``."""

    dest: np.ndarray  # [B] lane indices (a permutation of 0..B-1)
    parent: np.ndarray  # [B]
    token: np.ndarray  # [B]


def beam_step(groups: list[BeamGroup], top_logprobs: np.ndarray, top_tokens: np.ndarray) -> list[StepChoice]:
    """One step for ``groups`` of the same size B. ``top_logprobs`` / ``top_tokens``:
    [G, B, B+1], every lane's best next tokens (log-probs in float32, best first). Updates the
    groups (histories, scores, finished lists, ``result`` once done) and returns each group's
    choice."""
    G, B, K = top_logprobs.shape
    eot = groups[0].eot
    sums = np.stack([g.sum_logprobs for g in groups])  # [G, B]
    scores = (sums[:, :, None] + top_logprobs.astype(np.float32)).reshape(G, B * K)
    tokens = top_tokens.reshape(G, B * K)
    parents = np.broadcast_to(np.repeat(np.arange(B), K), (G, B * K))
    first = np.array([g.step == 0 for g in groups])
    scores[first, K:] = -np.inf  # at the first step every lane holds the same candidates

    order = np.argsort(-scores, axis=1, kind="stable")
    s_score = np.take_along_axis(scores, order, 1)
    s_token = np.take_along_axis(tokens, order, 1)
    s_parent = np.take_along_axis(parents, order, 1)
    text = s_token != eot
    seen = np.cumsum(text, axis=1)  # non-<|endoftext|> candidates up to and including each
    kept = text & (seen <= B)
    ended = ~text & (seen < B)  # (a masked lane's candidates sort after lane 0's B+1, past the B-th kept)
    kept_pos = np.argsort(~kept, axis=1, kind="stable")[:, :B]
    k_parent = np.take_along_axis(s_parent, kept_pos, 1)
    k_token = np.take_along_axis(s_token, kept_pos, 1)
    k_score = np.take_along_axis(s_score, kept_pos, 1).astype(np.float32)

    # Lanes: a parent's first (best) child stays in the parent's lane; the others take the lanes
    # of parents that kept no child, lowest lane first.
    same = k_parent[:, :, None] == k_parent[:, None, :]
    first_child = ~np.any(same & np.tril(np.ones((B, B), bool), -1)[None], axis=2)
    has_child = np.zeros((G, B), bool)
    np.put_along_axis(has_child, k_parent, True, 1)
    free_lanes = np.argsort(has_child, axis=1, kind="stable")
    extra_rank = np.cumsum(~first_child, axis=1) - 1
    dest = np.where(first_child, k_parent, np.take_along_axis(free_lanes, np.clip(extra_rank, 0, B - 1), 1))

    choices = []
    for g, group in enumerate(groups):
        if ended[g].any():
            for pos in np.flatnonzero(ended[g]):
                if len(group.finished) >= group.max_candidates:
                    break
                group.finished[tuple(group.lanes[s_parent[g, pos]]) + (eot,)] = float(s_score[g, pos])
        old = group.lanes
        lanes = [None] * B
        for i in range(B):
            lanes[dest[g, i]] = old[k_parent[g, i]] + [int(k_token[g, i])]
        group.lanes = lanes
        group.sum_logprobs = np.empty(B, np.float32)
        group.sum_logprobs[dest[g]] = k_score[g]
        group.step += 1
        if len(group.finished) >= group.max_candidates or group.step >= group.sample_len:
            group.finalize()
        choices.append(StepChoice(dest[g].copy(), k_parent[g].copy(), k_token[g].copy()))
    return choices
