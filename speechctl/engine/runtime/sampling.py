"""Sampling of the auxiliary (audio) streams on the model's device, batched over rows and streams.

Randomness comes from a counter-based hash of (seed, step, stream, token id), so a request draws
the same tokens whatever else is in the batch, on any device, with no per-request generator
objects and no host sync. Because the noise is keyed by token id, sampling among a top-k
candidate set gives exactly what sampling over the whole vocabulary with the same filter gives.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# 31-bit values and constants: every constant fits int32 (compiled Triton kernels type literals
# as int32) and every product of two fits int64.
_MASK31 = 0x7FFFFFFF


def _hash31(x: torch.Tensor) -> torch.Tensor:
    """A lowbias32-style integer hash on int64 tensors, kept to 31 bits."""
    x = x & _MASK31
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK31
    x = ((x ^ (x >> 15)) * 0x446CA68B) & _MASK31
    return x ^ (x >> 16)


def gumbel_at(seed: torch.Tensor, step: torch.Tensor, token_ids: torch.Tensor, first_stream: int = 0) -> torch.Tensor:
    """Gumbel noise for ``token_ids`` [R, K, N] keyed by (seed[R], step[R], stream, token id);
    the K streams are ``first_stream`` onwards."""
    k = torch.arange(token_ids.shape[1], device=seed.device, dtype=torch.int64) + first_stream
    base = _hash31(seed[:, None] ^ _hash31(step[:, None] * 0x1E3779B1 + (seed[:, None] >> 31)))
    base = _hash31(base + k[None, :] * 0x05EBCA6B)  # [R, K]
    bits = _hash31(base[:, :, None] + token_ids * 0x42B2AE35)
    u = ((bits >> 7).to(torch.float32) + 0.5) / 16777216.0  # 24 bits: exact in float32
    return -torch.log(-torch.log(u))


def gumbel_noise(seed: torch.Tensor, step: torch.Tensor, num_streams: int, vocab: int, first_stream: int = 0) -> torch.Tensor:
    """[R, K, V] noise for every token of the vocabulary, streams ``first_stream`` onwards."""
    ids = torch.arange(vocab, device=seed.device, dtype=torch.int64).expand(seed.shape[0], num_streams, vocab)
    return gumbel_at(seed, step, ids, first_stream)


class RowSettings(NamedTuple):
    """A batch's sampling settings in the shapes ``sample_streams`` uses. Derived once per step
    and reused for every codebook a depth decoder samples in turn (a few kernels each time)."""

    temperature: torch.Tensor  # [R, 1, 1], kept away from 0
    random: torch.Tensor  # [R, 1]: temperature > 0
    beyond_k: torch.Tensor | None  # [R, 1, n]: candidate rank >= the row's top-k (n candidates)
    not_first: torch.Tensor | None  # [n]: candidate rank > 0
    top_p: torch.Tensor  # [R, 1, 1]; inf where off


def row_settings(temperature, top_k, top_p, vocab: int, any_filter: bool = True, max_top_k: int = 0) -> RowSettings:
    """temperature, top_p [R] float32 (temperature 0 = greedy; top_p 1 = off), top_k [R] int64
    (0 = off) for a vocabulary of ``vocab``; ``any_filter``, ``max_top_k``: see ``sample_streams``."""
    beyond_k = not_first = None
    if any_filter:
        # sym_min, not min: in a compiled step the count stays symbolic, so one trace serves
        # every candidate set (``settings.candidate_set``) instead of one compile each
        n = torch.sym_min(max_top_k, vocab) if max_top_k > 0 else vocab
        rank = torch.arange(n, device=temperature.device)
        beyond_k = rank >= torch.where(top_k > 0, top_k, vocab)[:, None, None]
        not_first = rank > 0
    # top_p 1 masks nothing, not even where the mass above a tail token rounds up to 1: a row's
    # draw must not depend on whether another row of the batch filters by top-p
    top_p = torch.where(top_p < 1, top_p, float("inf"))
    return RowSettings(temperature.clamp(min=1e-5)[:, None, None], temperature[:, None] > 0, beyond_k, not_first,
                       top_p[:, None, None])


def sample_streams(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    step: torch.Tensor,
    *,
    any_random: bool = True,
    all_random: bool = False,
    any_filter: bool = True,
    max_top_k: int = 0,
    any_top_p: bool = True,
    noise: torch.Tensor | None = None,
    rows: RowSettings | None = None,
) -> torch.Tensor:
    """Sample one token per (row, stream).

    logits: [R, K, V] float32, already masked (-inf) where a token is not allowed.
    temperature, top_p: [R] float32 (temperature 0 = greedy; top_p 1 = off); top_k: [R] int64
    (0 = off); seed, step: [R] int64. The keyword flags let the caller skip work it knows no row
    needs (decided on the host from request settings, never by a device sync): ``all_random``
    (every temperature > 0: no greedy pick to compute). ``noise``
    [R, K, V]: the rows' ``gumbel_noise``, when the caller has it already; ``rows``: the
    settings' ``row_settings`` (same flags), when the caller has them already. ``any_random``
    (some temperature > 0), ``any_filter`` (some top-k/top-p), ``max_top_k`` (> 0 when every
    random row has a top-k of at most this: candidates come from one ``topk`` instead of a
    full sort), ``any_top_p`` (some top_p < 1: else the nucleus step is skipped). Returns [R, K] int64.
    """
    if not any_random:
        return logits.argmax(dim=-1)
    greedy = None if all_random else logits.argmax(dim=-1)
    V = logits.shape[-1]
    if rows is None:
        rows = row_settings(temperature, top_k, top_p, V, any_filter, max_top_k)
    scaled = logits / rows.temperature
    if not any_filter:
        ids = torch.arange(V, device=logits.device).expand(scaled.shape)
        sampled = (scaled + (gumbel_at(seed, step, ids) if noise is None else noise)).argmax(dim=-1)
        return sampled if all_random else torch.where(rows.random, sampled, greedy)
    # sorted, descending; n = V takes every token: a sort there would be a branch on n, and so a
    # compiled variant per candidate set (benchmarks/candidates_topk.py: what topk(V) costs)
    cand, ids = scaled.topk(rows.beyond_k.shape[-1], dim=-1)
    cand = cand.masked_fill(rows.beyond_k, float("-inf"))
    if any_top_p:
        probs = cand.softmax(dim=-1)
        above = probs.cumsum(dim=-1) - probs  # mass strictly above this token
        cand = cand.masked_fill((above >= rows.top_p) & rows.not_first, float("-inf"))
    pick = (cand + (gumbel_at(seed, step, ids) if noise is None else noise.gather(-1, ids))).argmax(dim=-1, keepdim=True)
    sampled = ids.gather(-1, pick)[..., 0]
    return sampled if all_random else torch.where(rows.random, sampled, greedy)


def frame_sampler(temperature, top_k, top_p, seed, step, streams: range, *, any_random: bool = True,
                  any_filter: bool = True, max_top_k: int = 0, **flags):
    """``sample(logits [R, V], stream) -> [R]`` for codebooks ``streams`` sampled one after another
    within a step (a depth decoder), with the rows' settings and keys and the host's ``flags``
    (``any_random``, ...) as in ``sample_streams``.
    The noise of every code of ``streams`` and the rows' derived settings are made at the first
    codebook: one batch of kernels per frame instead of one per codebook (the per-codebook work
    is launch-bound: a few rows, ~2k codes)."""
    frame = {}

    @torch.profiler.record_function("speechctl.sample_codebook")
    def sample(logits: torch.Tensor, stream: int) -> torch.Tensor:
        if any_random and not frame:
            vocab = logits.shape[-1]
            frame["noise"] = gumbel_noise(seed, step, len(streams), vocab, streams.start)
            frame["rows"] = row_settings(temperature, top_k, top_p, vocab, any_filter, max_top_k)
        i = stream - streams.start
        return sample_streams(logits.float()[:, None, :], temperature, top_k, top_p, seed, step,
                              noise=frame["noise"][:, i : i + 1] if frame else None, rows=frame.get("rows"),
                              any_random=any_random, any_filter=any_filter, max_top_k=max_top_k, **flags)[:, 0]

    return sample
