"""Dia's text encoder (transformers' ``DiaEncoder``): byte embeddings, bidirectional
self-attention layers with RoPE and attention scale 1, a SiLU-gated MLP whose gate and up
projections are one matrix, RMSNorm. Module names are transformers' (``model.encoder.*``).

It runs in ``embed_multimodal`` once per request, outside vLLM's graphs: the conditions of a
step are right-padded into one batch and each attends only to its own positions, as
transformers' padded batch with its attention mask does. Weights are replicated on every
tensor-parallel rank (a twelfth of the model's compute).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speechctl.models.rope import default_inv_freq, rotate


class DiaRMSNorm(nn.Module):
    """x * rsqrt(mean(x²) + eps) in float32, then the weight (transformers' ``DiaRMSNorm``)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class DiaEncoderAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        self.head_dim = config.head_dim
        H = config.hidden_size
        self.q_proj = nn.Linear(H, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(H, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(H, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, H, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape  # x [B, L, H]; cos, sin [L, head_dim]; mask [B, 1, 1, L] True = attend
        q = self.q_proj(x).view(B, L, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, -1))


class DiaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * F.silu(gate))


class DiaEncoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pre_sa_norm = DiaRMSNorm(config.hidden_size, config.norm_eps)
        self.self_attention = DiaEncoderAttention(config)
        self.post_sa_norm = DiaRMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = DiaMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attention(self.pre_sa_norm(x), cos, sin, mask)
        return x + self.mlp(self.post_sa_norm(x))


class DiaTextEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DiaEncoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = DiaRMSNorm(config.hidden_size, config.norm_eps)
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(config, "rope_theta", 10000.0)
        self.register_buffer("inv_freq", default_inv_freq(config.head_dim, theta), persistent=False)

    def forward(self, conditions: list[torch.Tensor]) -> list[torch.Tensor]:
        """[L_i] byte ids per condition -> [L_i, H] encoder states per condition."""
        lengths = [len(c) for c in conditions]
        L = max(lengths)
        device = self.embedding.weight.device
        ids = torch.zeros(len(conditions), L, dtype=torch.int64, device=device)
        for i, c in enumerate(conditions):
            ids[i, : len(c)] = c.to(device)
        mask = (torch.arange(L, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None])[:, None, None, :]
        freqs = torch.arange(L, device=device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        x = self.embedding(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        return [x[i, :n] for i, n in enumerate(lengths)]
