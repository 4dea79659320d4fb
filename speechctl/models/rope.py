"""Rotary position embedding as transformers writes it for its default RoPE (rotate-half,
"neox" style): for layers speechctl runs outside vLLM's attention (Dia's text encoder)."""

from __future__ import annotations

import torch


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[head_dim / 2] inverse frequencies 1 / theta^(2i / head_dim)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., L, head_dim] rotated by cos, sin [L, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
