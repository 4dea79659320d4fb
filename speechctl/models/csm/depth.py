"""CSM's depth decoder for vLLM: transformers' ``CsmDepthDecoderForCausalLM``, decoding one frame
for every row of a step at once.

A small Llama with its own RoPE positions 0..K: position 0 is the backbone's hidden state,
position k >= 1 the embedding of codebook k-1's token, all projected by
``inputs_embeds_projector``; ``codebooks_head.weight[k-1]`` [H_d, V] reads codebook k from position
k. One batched pass per step (prefill of positions 0-1, then one position per codebook against a
per-frame KV cache), each codebook sampled by ``sample(logits, k)``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import get_rope

from speechctl.engine import vllm_compat
from speechctl.engine.runtime import compile_per_step_work
from speechctl.engine.runtime.graphs import compile_step

# transformers' separate projections -> (our fused projection, part)
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


class _DepthAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        H = config.hidden_size
        # q, k and v in one GEMM (fewer kernels per depth step; loaded from q_proj, k_proj and
        # v_proj by CsmDepthDecoder.load_weights)
        self.sizes = (self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim)
        self.qkv_proj = nn.Linear(H, sum(self.sizes), bias=config.attention_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, H, bias=config.attention_bias)

    def forward(self, x, positions, rotary, cache: tuple[torch.Tensor, torch.Tensor], start: int, causal: bool):
        """x [R, n, H] at positions start..start+n-1; cache (k, v) [R, kv_heads, K+1, head_dim];
        ``causal``: the first call's two positions (a host bool: torch.compile traces ``n`` as a
        symbol, which SDPA's ``is_causal`` does not take)."""
        R, n, _ = x.shape
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        # eager on CUDA: vLLM's rotary kernel; compiled: the native form, which inductor fuses
        rope = rotary if torch.compiler.is_compiling() else vllm_compat.kernel_on_cuda(rotary, x)
        q, k = rope(positions, q.reshape(R * n, -1), k.reshape(R * n, -1))
        q = q.view(R, n, self.heads, self.head_dim).transpose(1, 2)
        k_cache, v_cache = cache
        k_cache[:, :, start : start + n] = k.view(R, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v_cache[:, :, start : start + n] = v.view(R, n, self.kv_heads, self.head_dim).transpose(1, 2)
        keys, values = k_cache[:, :, : start + n], v_cache[:, :, : start + n]
        # grouped-query attention in the kernel: no copy of the cache per query head group
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=causal, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(R, n, -1))


class _DepthMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        H, I = config.hidden_size, config.intermediate_size
        self.sizes = (I, I)  # the parts of gate_up_proj (CsmDepthDecoder.load_weights)
        self.gate_up_proj = nn.Linear(H, 2 * I, bias=config.mlp_bias)  # gate_proj, up_proj in one GEMM
        self.down_proj = nn.Linear(I, H, bias=config.mlp_bias)
        self.act = SiluAndMul()

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        # eager on CUDA: vLLM's fused kernel (one instead of two); compiled: inductor fuses the native form
        act = self.act if torch.compiler.is_compiling() else vllm_compat.kernel_on_cuda(self.act, gate_up)
        return self.down_proj(act(gate_up))


class _DepthLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = _DepthAttention(config)
        self.mlp = _DepthMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, positions, rotary, cache, start, causal):
        x = x + self.self_attn(_norm(self.input_layernorm, x), positions, rotary, cache, start, causal)
        return x + self.mlp(_norm(self.post_attention_layernorm, x))


def _norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """On CUDA torch's fused RMSNorm: outside vLLM's compiled forward vLLM's own runs as its
    native decomposition (~8 kernels), and a frame runs 9 norms for each of its 31 depth steps.
    Elsewhere vLLM's RMSNorm (its kernels take [tokens, hidden])."""
    if x.is_cuda:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return norm(x.reshape(-1, x.shape[-1])).view(x.shape)


class _DepthModel(nn.Module):
    def __init__(self, config, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens  # [K*V, H_backbone]
        self.inputs_embeds_projector = nn.Linear(config.backbone_hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([_DepthLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class _CodebooksHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_codebooks - 1, config.hidden_size, config.vocab_size))


class CsmDepthDecoder(nn.Module):
    """transformers' ``CsmDepthDecoderForCausalLM``, decoding one frame for every row at once."""

    def __init__(self, config, embed_tokens: nn.Embedding):
        super().__init__()
        self.config = config
        self.model = _DepthModel(config, embed_tokens)
        self.codebooks_head = _CodebooksHead(config)
        self.rotary_emb = get_rope(
            config.head_dim,
            max_position=config.max_position_embeddings,
            rope_parameters=getattr(config, "rope_parameters", None),
            is_neox_style=True,
        )
        if compile_per_step_work():  # ~100 small kernels per depth step, 31 steps per frame
            self._run = compile_step(self._run)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """transformers' names (relative to ``depth_decoder``); q/k/v and gate/up go into their
        part of the fused projection's rows."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            module, _, leaf = name.rpartition(".")
            parent, _, proj = module.rpartition(".")
            if proj in _FUSED:
                fused, part = _FUSED[proj]
                name = f"{parent}.{fused}.{leaf}"
                sizes = self.get_submodule(parent).sizes  # the fused projection's parts
                start = sum(sizes[:part])
                params[name].data[start : start + sizes[part]].copy_(tensor)
            else:
                params[name].data.copy_(tensor)
            loaded.add(name)
        return loaded

    def _run(self, x: torch.Tensor, positions: torch.Tensor, start: int, caches, causal: bool) -> torch.Tensor:
        """[R, n, H_backbone] inputs at positions start.. (``positions`` [R * n], row by row)
        -> [R, H_d] last position's hidden."""
        h = self.model.inputs_embeds_projector(x)
        for layer, cache in zip(self.model.layers, caches):
            h = layer(h, positions, self.rotary_emb, cache, start, causal)
        return _norm(self.model.norm, h[:, -1])

    def decode_frame(self, hidden: torch.Tensor, first: torch.Tensor, sample) -> torch.Tensor:
        """hidden [R, H_backbone] (the backbone's, which gave codebook 0), first [R] codebook 0
        -> [R, K] the frame; ``sample(logits [R, V], k)`` picks codebook k."""
        K, V = self.config.num_codebooks, self.config.vocab_size
        R = hidden.shape[0]
        shape = (R, self.config.num_key_value_heads, K + 1, self.config.head_dim)
        caches = [(hidden.new_empty(shape), hidden.new_empty(shape)) for _ in self.model.layers]
        table = self.model.embed_tokens.weight  # codebook k's rows at k*V..k*V+V-1
        x = torch.stack([hidden, F.embedding(first, table[:V]).to(hidden.dtype)], dim=1)  # positions 0, 1
        # every depth step's positions made once per frame: row k holds position k for every row
        positions = torch.arange(K + 1, device=hidden.device)[:, None].expand(K + 1, R).contiguous()
        tokens = [first]
        for k in range(1, K):
            pos = torch.arange(2, device=hidden.device).repeat(R) if k == 1 else positions[k]
            h = self._run(x, pos, 0 if k == 1 else k, caches, k == 1)
            tokens.append(sample(h @ self.codebooks_head.weight[k - 1], k))
            x = F.embedding(tokens[-1], table[k * V : (k + 1) * V])[:, None].to(hidden.dtype)  # position k + 1
        return torch.stack(tokens, dim=1)
