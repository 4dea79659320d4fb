"""Sampling of the auxiliary (audio) streams on the model's device, batched over rows and streams.

Randomness comes from a counter-based hash of (seed, step, stream, token), so a request draws
the same tokens whatever else is in the batch, on any device, with no per-request generator
objects and no host sync.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (Wellons) on int64 tensors holding 32-bit values; products wrap, low bits stay."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seed: torch.Tensor, step: torch.Tensor, num_streams: int, vocab: int) -> torch.Tensor:
    """[R, K, V] float32 Gumbel noise keyed by (seed[R], step[R], stream, token)."""
    device = seed.device
    k = torch.arange(num_streams, device=device, dtype=torch.int64)
    v = torch.arange(vocab, device=device, dtype=torch.int64)
    base = _hash32(seed[:, None] ^ _hash32(step[:, None] * 0x9E3779B1 + (seed[:, None] >> 32)))
    base = _hash32(base + k[None, :] * 0x85EBCA6B)  # [R, K]
    bits = _hash32(base[:, :, None] + v[None, None, :] * 0xC2B2AE35)  # [R, K, V]
    u = ((bits >> 8).to(torch.float32) + 0.5) / 16777216.0  # 24 bits: exact in float32
    return -torch.log(-torch.log(u))


def sample_streams(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    step: torch.Tensor,
    *,
    any_random: bool = True,
    any_filter: bool = True,
) -> torch.Tensor:
    """Sample one token per (row, stream).

    logits: [R, K, V] float32, already masked (-inf) where a token is not allowed.
    temperature, top_p: [R] float32 (temperature 0 = greedy; top_p 1 = off); top_k: [R] int64
    (0 = off); seed, step: [R] int64. ``any_random``/``any_filter`` let the caller skip work it
    knows no row needs (decided on the host from request settings, never by a device sync).
    Returns [R, K] int64.
    """
    greedy = logits.argmax(dim=-1)
    if not any_random:
        return greedy
    R, K, V = logits.shape
    temp = temperature.clamp(min=1e-5)[:, None, None]
    scaled = logits / temp
    if any_filter:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        rank = torch.arange(V, device=logits.device)[None, None, :]
        k = torch.where(top_k > 0, top_k, V)[:, None, None]
        sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass strictly above this token
        drop = (before >= top_p[:, None, None]) & (rank > 0)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    noise = gumbel_noise(seed, step, K, V)
    sampled = (scaled + noise).argmax(dim=-1)
    return torch.where(temperature[:, None] > 0, sampled, greedy)
