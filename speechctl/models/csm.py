"""CSM (Sesame's Conversational Speech Model) for vLLM, loading transformers' checkpoint format
(``CsmForConditionalGeneration``, as published at sesame/csm-1b).

What transformers' model and its ``generate`` do, and so what this file reproduces:

* **Backbone**: a Llama decoder (``backbone_model``) over frames. A text position is its text
  embedding (``embed_text_tokens``) only; an audio position is the **sum of its K codebook
  embeddings** (``backbone_model.embed_tokens.embed_audio_tokens``, codebook k's rows at
  k*V..k*V+V-1) only. In prompts, ``<|AUDIO|>`` marks a frame of a context turn's audio and
  ``<|audio_eos|>`` the end frame after it (all K codes ``codebook_eos_token_id`` = 0); every
  generated position is a frame.
* **Codebook 0**: ``lm_head`` [V, H] on the backbone's last (normed) hidden state.
* **Codebooks 1..K-1**: the **depth decoder**, a small Llama with its own RoPE positions 0..K:
  position 0 is the backbone hidden state, position k >= 1 the embedding of codebook k-1's token
  (``depth_decoder.model.embed_tokens``: its own table, as transformers loads it; the
  backbone's when a checkpoint leaves it out), all projected by ``inputs_embeds_projector``; ``codebooks_head.weight[k-1]`` [H_d, V] reads codebook
  k from position k. transformers runs it as a nested ``generate`` with its own sampling settings
  (``depth_decoder_*``); here it is one batched pass per step for all rows in ``compute_logits``
  (prefill of positions 0-1, then one position per codebook against a per-step KV cache), each
  codebook sampled on the device by the stream runtime (``codebook_sampler``, its depth settings).
  Every head samples over its whole vocabulary (V = 2051; nothing is masked).
* **End**: the first frame whose codebooks 0..K-2 are all 0 ends the request and is part of the
  output; the primary stream is ``<|AUDIO|>`` per frame and ``<|audio_eos|>`` at that frame
  (``EndRules(eos_frame=0)``). The audio read back stops before the first frame of K zeros.
* The Mimi codec lives in the same checkpoint (``codec_model.*``); ``speechctl.codecs.mimi``
  loads it, this file skips it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaModel
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix
from vllm.multimodal import MULTIMODAL_REGISTRY

from speechctl.engine import vllm_compat
from speechctl.engine.state import StreamRuntime, compile_per_step_work
from speechctl.models.families import csm_spec
from speechctl.models.higgs_audio_v2 import AudioCodebookEmbedding
from speechctl.models.multistream import (
    CodesDummyInputsBuilder,
    CodesProcessingInfo,
    CodesProcessor,
    StreamModel,
)

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
            self._run = torch.compile(self._run, dynamic=True)

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


@MULTIMODAL_REGISTRY.register_processor(
    CodesProcessor, info=CodesProcessingInfo, dummy_inputs=CodesDummyInputsBuilder
)
class CsmForConditionalGeneration(StreamModel):
    backbone_name = "backbone_model"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config  # vocab_size: the text vocabulary (hf_overrides)
        self.config = config
        self.spec = csm_spec(config.to_dict())
        depth_config = config.depth_decoder_config
        K, V = config.num_codebooks, depth_config.vocab_size
        self.codebook_vocab = V
        self.backbone_model = LlamaModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "backbone_model"))
        # LlamaModel built a text-vocabulary table: it is CSM's text embedding; the backbone's
        # own embed_tokens are the codebook tables.
        self.embed_text_tokens = self.backbone_model.embed_tokens
        self.backbone_model.embed_tokens = AudioCodebookEmbedding(K, V, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, V, bias=False)
        self.depth_decoder = CsmDepthDecoder(depth_config, nn.Embedding(K * V, config.hidden_size))
        self.stream_runtime = StreamRuntime(
            self.spec,
            max_rows=vllm_config.scheduler_config.max_num_seqs,
            max_len=vllm_config.model_config.max_model_len,
            device=self.lm_head.weight.device,
        )
        self.make_empty_intermediate_tensors = self.backbone_model.make_empty_intermediate_tensors

    def embed_multimodal(self, **kwargs: object) -> list[torch.Tensor]:
        """Context turns: [K, T + 1] steps per item (T frames, then the layout's end step, which
        is CSM's end frame of zeros) -> [T + 1, H]."""
        out = []
        for item in self._audio_items(kwargs):
            frames = item.to(self.lm_head.weight.device, torch.int64).T.clone()
            frames[-1] = self.spec.rules.eos_frame
            out.append(self.backbone_model.embed_tokens(frames))
        return out

    def _embed_streams(self, input_ids: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """[n] scheduled text ids -> [n, H]: text embedding at text positions, the frame's summed
        codebook embeddings at audio positions (generated frames from the stream runtime,
        context audio from the multimodal items)."""
        is_audio = (input_ids == self.spec.audio_id) | (input_ids == self.spec.audio_eos_id)
        text = self.embed_text_tokens(input_ids)
        return torch.where(is_audio[:, None], self.backbone_model.embed_tokens(aux).to(text.dtype), text)

    def _heads(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Codebook 0 from ``lm_head``, 1..K-1 from the depth decoder, each sampled on the device;
        the primary logits start empty (no text head) and the runtime makes them one-hot.
        On CUDA the whole frame (backbone head, depth decoder, sampling) is one graph replay."""
        runtime = self.stream_runtime
        first = runtime.sample_codebook(self.lm_head(hidden_states), 0)
        depth_sampler = runtime.codebook_sampler(depth=True, streams=range(1, self.spec.num_codebooks))
        frame = self.depth_decoder.decode_frame(hidden_states, first, depth_sampler)
        logits = torch.zeros(hidden_states.shape[0], self.config.vocab_size, device=hidden_states.device)
        return runtime.sample(logits, tokens=frame)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # transformers keeps the depth decoder's codebook table apart from the backbone's
        # (``tie_codebooks_embeddings`` ties nothing while ``tie_word_embeddings`` is off); a
        # checkpoint saved with them tied may leave it out: then it is the backbone's.
        weights = ((n, w) for n, w in weights if not n.startswith("codec_model."))  # speechctl.codecs.mimi
        loaded = AutoWeightsLoader(self).load_weights(weights)
        depth_table = "depth_decoder.model.embed_tokens.weight"
        if depth_table not in loaded:
            backbone = self.backbone_model.embed_tokens.embed_audio_tokens.weight
            self.depth_decoder.model.embed_tokens.weight.data.copy_(backbone.data)
            loaded.add(depth_table)
        return loaded
