"""The NAR stage's model: VALL-E's non-autoregressive decoder, in plain PyTorch (it runs beside
vLLM, not in it).

One pass predicts codebook j (j = 1..K-1, 0-based; codebook 0 is the AR stage's) for every frame
of an utterance at once. The sequence of a pass, attended bidirectionally (padding keys masked)::

    text bytes            text_embed[x]
    voice frames          sum over all K codebooks of audio_embed[k, code]
    utterance frames      sum over codebooks 0..j-1 of audio_embed[k, code]

Layers are Llama's (RoPE over positions 0..L-1, grouped-query attention, SwiGLU) with every RMSNorm
made adaptive to the stage, as VALL-E's AdaLN: ``norm(h) * (1 + a_j) + b_j`` with ``(a_j, b_j) =
adaln.weight @ stage_embed[j - 1]``. Head j (``heads`` rows (j-1)*C .. j*C-1) reads codebook j from
the utterance frames. With ``shared_layers`` the attention, MLP and norm weights are the AR
backbone's (``model.layers.*``, ``model.norm``); embeddings, AdaLN and heads stay the NAR's own.

Weights (``nar/model.safetensors``): ``text_embed.weight`` [V, H], ``audio_embed.weight`` [K*C, H]
(codebook k at rows k*C ..), ``stage_embed.weight`` [K-1, H], ``heads.weight`` [(K-1)*C, H], and
Llama's names without the ``model.`` prefix: ``norm.weight``, per layer ``layers.{i}.self_attn.
{q,k,v,o}_proj.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``layers.{i}.
{input,post_attention}_layernorm.weight``; each norm's AdaLN projection [2H, H] beside it
(``norm.adaln.weight``, ``layers.{i}.input_layernorm.adaln.weight``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from speechctl.errors import ModelError


@dataclass(frozen=True)
class NarConfig:
    num_codebooks: int  # K, codebook 0 (the AR stage's) included
    codebook_size: int
    text_vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    shared_layers: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> NarConfig:
        """From config.json: ``speechctl.nar``, the backbone's fields where the layers are shared."""
        section = config.get("speechctl") or {}
        nar = dict(section.get("nar") or {})
        shared = bool(nar.get("shared_layers", False))
        own = nar if not shared else {
            "hidden_size": config["hidden_size"], "num_layers": config["num_hidden_layers"],
            "num_heads": config["num_attention_heads"], "num_kv_heads": config.get("num_key_value_heads"),
            "intermediate_size": config["intermediate_size"], "rms_norm_eps": config.get("rms_norm_eps"),
            "rope_theta": config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta"),
        }
        try:
            return cls(
                num_codebooks=int(nar["num_codebooks"]), codebook_size=int(section["codebook_size"]),
                text_vocab_size=int(nar.get("text_vocab_size") or config["vocab_size"]),
                hidden_size=int(own["hidden_size"]), num_layers=int(own["num_layers"]), num_heads=int(own["num_heads"]),
                num_kv_heads=int(own.get("num_kv_heads") or own["num_heads"]),
                intermediate_size=int(own["intermediate_size"]), rms_norm_eps=float(own.get("rms_norm_eps") or 1e-5),
                rope_theta=float(own.get("rope_theta") or 10000.0), shared_layers=shared,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"config.json speechctl.nar: missing or invalid field {e}") from None


class AdaptiveRMSNorm(nn.Module):
    """RMSNorm whose output the stage scales and shifts (VALL-E's AdaLN)."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.adaln = nn.Linear(hidden, 2 * hidden, bias=False)
        self.eps = eps

    def forward(self, h: torch.Tensor, stage: torch.Tensor) -> torch.Tensor:
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift = self.adaln(stage).chunk(2, dim=-1)
        return (self.weight * x.to(h.dtype)) * (1 + scale) + shift


class NarLayer(nn.Module):
    def __init__(self, cfg: NarConfig):
        super().__init__()
        H, hd = cfg.hidden_size, cfg.hidden_size // cfg.num_heads
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.input_layernorm = AdaptiveRMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = AdaptiveRMSNorm(H, cfg.rms_norm_eps)
        q, kv, inner = cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.intermediate_size
        self.self_attn = _linears(q_proj=(H, q), k_proj=(H, kv), v_proj=(H, kv), o_proj=(q, H))
        self.mlp = _linears(gate_proj=(H, inner), up_proj=(H, inner), down_proj=(inner, H))

    def forward(self, h, stage, rope, key_mask):
        """h [B, L, H]; rope (cos, sin) [L, head_dim]; key_mask [B, 1, 1, L] True where a key is real."""
        B, L, _ = h.shape
        a = self.self_attn
        x = self.input_layernorm(h, stage)
        q = _rotate(a["q_proj"](x).view(B, L, self.heads, self.head_dim).transpose(1, 2), rope)
        k = _rotate(a["k_proj"](x).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2), rope)
        v = a["v_proj"](x).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)  # bidirectional: no causal mask
        h = h + a["o_proj"](attn.transpose(1, 2).reshape(B, L, -1))
        x = self.post_attention_layernorm(h, stage)
        m = self.mlp
        return h + m["down_proj"](F.silu(m["gate_proj"](x)) * m["up_proj"](x))


def _linears(**shapes: tuple[int, int]) -> nn.ModuleDict:
    """Bias-free projections by name (Llama's names): name=(in, out)."""
    return nn.ModuleDict({name: nn.Linear(i, o, bias=False) for name, (i, o) in shapes.items()})


def _rotate(x: torch.Tensor, rope) -> torch.Tensor:
    """Llama's RoPE (halves rotated, not interleaved pairs): x [B, h, L, d]."""
    cos, sin = rope
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class NarTransformer(nn.Module):
    def __init__(self, cfg: NarConfig):
        super().__init__()
        self.cfg = cfg
        H, K, C = cfg.hidden_size, cfg.num_codebooks, cfg.codebook_size
        self.text_embed = nn.Embedding(cfg.text_vocab_size, H)
        self.audio_embed = nn.Embedding(K * C, H)
        self.stage_embed = nn.Embedding(K - 1, H)
        self.layers = nn.ModuleList(NarLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = AdaptiveRMSNorm(H, cfg.rms_norm_eps)
        self.heads = nn.Linear(H, (K - 1) * C, bias=False)
        self.register_buffer("offsets", torch.arange(K) * C, persistent=False)

    def embed_codes(self, codes: torch.Tensor, codebooks: torch.Tensor) -> torch.Tensor:
        """codes [...] of codebooks [...] (same shape, 0-based) -> [..., H]."""
        return self.audio_embed(codes + self.offsets[codebooks])

    def logits(self, inputs: torch.Tensor, key_mask: torch.Tensor, stage: int, gather: tuple) -> torch.Tensor:
        """One pass: inputs [B, L, H] (padding anywhere past each row's length), key_mask [B, L]
        True at real positions; codebook ``stage``'s logits [N, C] at the positions ``gather``
        = (rows [N], positions [N])."""
        L = inputs.shape[1]
        cfg = self.cfg
        hd = cfg.hidden_size // cfg.num_heads
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, device=inputs.device, dtype=torch.float32) / hd)
        angles = torch.arange(L, device=inputs.device, dtype=torch.float32)[:, None] * inv[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        rope = (angles.cos().to(inputs.dtype), angles.sin().to(inputs.dtype))
        e = self.stage_embed.weight[stage - 1]
        mask = key_mask[:, None, None, :]
        h = inputs
        for layer in self.layers:
            h = layer(h, e, rope, mask)
        h = self.norm(h[gather], e)
        C = cfg.codebook_size
        return F.linear(h, self.heads.weight[(stage - 1) * C : stage * C]).float()


def load_nar(path: Path, config: Mapping[str, Any], ar_weights: list[Path], *, device, dtype,
             dummy: bool = False) -> NarTransformer:
    """The NAR model of a checkpoint directory, on ``device`` in ``dtype``: its own weights from
    ``path/nar/model.safetensors`` and, with shared layers, the AR backbone's from ``ar_weights``.
    ``dummy``: random weights of the shape (benchmarks whose checkpoint has none)."""
    from safetensors import safe_open

    cfg = NarConfig.from_config(config)
    with torch.device(device):
        model = NarTransformer(cfg).to(dtype).eval()
    if dummy:
        return model
    wanted = model.state_dict()
    found: dict[str, torch.Tensor] = {}
    own = Path(path) / "nar" / "model.safetensors"
    if not own.is_file():
        raise ModelError(f"{own}: missing (the NAR stage's weights)")
    files = [(own, "")] + ([(f, "model.") for f in ar_weights] if cfg.shared_layers else [])
    for file, prefix in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                local = name[len(prefix):] if name.startswith(prefix) else None
                if local in wanted:  # shared layers: the AR's, read after the NAR's own file
                    found[local] = f.get_tensor(name)
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise ModelError(f"{own}: the NAR stage lacks {len(missing)} weight(s), first {missing[0]}")
    model.load_state_dict({k: v.to(dtype) for k, v in found.items()})
    return model
