"""Dia for vLLM, loading transformers' checkpoint format (``DiaForConditionalGeneration``, as
published at nari-labs/Dia-1.6B-0626), on vLLM's encoder-decoder path.

What transformers' model and its ``generate`` do, and so what this file reproduces:

* **Encoder** (``encoder.py``): UTF-8 bytes of the text ([S1]/[S2] as bytes 1/2), run once per
  request in ``embed_multimodal``; its states become the cross-attention keys and values in
  vLLM's KV cache.
* **Decoder**: the input of a position is the sum of its 9 channel embeddings only
  (``embeddings.embed``, channel c's rows at c·1028..); per layer RMSNorm → self-attention (GQA,
  RoPE, attention scale 1) → RMSNorm → cross-attention (no RoPE, scale 1) → RMSNorm → SiLU-gated
  MLP; a final RMSNorm; ``logits_dense`` gives 9 × 1028 logits.
* **Streams** (``family.py``): delays [0, 8, ..., 15] after an all-BOS frame; the rules of
  transformers' Dia logits processors are the family's ``EndRules``; CFG pairs run on the
  runtime with the family's ``CfgConvention`` (the unconditional member's encoder input is
  zeros of the same length).
* The primary stream is control tokens (one per frame, ``<eos>`` where the request stops);
  there is no text head.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention, CrossAttention
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.v1.attention.backend import AttentionType

from speechctl.models.dia.encoder import DiaRMSNorm, DiaTextEncoder
from speechctl.models.dia.family import dia_spec
from speechctl.models.encoder_decoder import (
    ConditionDummyInputsBuilder,
    ConditionProcessingInfo,
    ConditionProcessor,
    EncoderDecoderModel,
)


class DiaSelfAttention(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.head_dim = config.head_dim
        self.heads, self.kv_heads = config.num_attention_heads // tp, max(1, config.num_key_value_heads // tp)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, config.num_attention_heads,
                                          config.num_key_value_heads, bias=False, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False,
                                        prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(self.head_dim, max_position=config.max_position_embeddings,
                                   rope_parameters=dict(config.rope_parameters), is_neox_style=True)
        self.attn = Attention(self.heads, self.head_dim, 1.0, num_kv_heads=self.kv_heads,
                              cache_config=vllm_config.cache_config, prefix=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(x)
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        q, k = self.rotary_emb(positions, q, k)
        out, _ = self.o_proj(self.attn(q, k, v))
        return out


class DiaCrossAttention(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.head_dim = config.cross_head_dim
        self.heads, self.kv_heads = config.cross_num_attention_heads // tp, max(1, config.cross_num_key_value_heads // tp)
        kv_size = config.cross_num_key_value_heads * self.head_dim
        self.q_proj = ColumnParallelLinear(config.hidden_size, config.cross_num_attention_heads * self.head_dim, bias=False,
                                           prefix=f"{prefix}.q_proj")
        self.kv_proj = MergedColumnParallelLinear(config.cross_hidden_size, [kv_size, kv_size], bias=False,
                                                  prefix=f"{prefix}.kv_proj")
        self.o_proj = RowParallelLinear(config.cross_num_attention_heads * self.head_dim, config.hidden_size, bias=False,
                                        prefix=f"{prefix}.o_proj")
        self.attn = CrossAttention(self.heads, self.head_dim, 1.0, num_kv_heads=self.kv_heads,
                                   cache_config=vllm_config.cache_config, prefix=f"{prefix}.attn",
                                   attn_type=AttentionType.ENCODER_DECODER)

    def forward(self, x: torch.Tensor, encoder_states: torch.Tensor | None) -> torch.Tensor:
        q, _ = self.q_proj(x)
        k = v = None
        if encoder_states is not None:  # the step that starts a request: its keys and values
            kv, _ = self.kv_proj(encoder_states)
            k, v = kv.chunk(2, dim=-1)
        out, _ = self.o_proj(self.attn(q, k, v))
        return out


class DiaDecoderMLP(nn.Module):
    def __init__(self, config, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2, bias=False,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=False,
                                           prefix=f"{prefix}.down_proj")
        self.act = SiluAndMul()  # silu(gate) * up, gate first: transformers' chunk order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act(up))
        return out


class DiaDecoderLayer(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        self.pre_sa_norm = DiaRMSNorm(config.hidden_size, config.norm_eps)
        self.self_attention = DiaSelfAttention(config, vllm_config, f"{prefix}.self_attention")
        self.pre_ca_norm = DiaRMSNorm(config.hidden_size, config.norm_eps)
        self.cross_attention = DiaCrossAttention(config, vllm_config, f"{prefix}.cross_attention")
        self.pre_mlp_norm = DiaRMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = DiaDecoderMLP(config, f"{prefix}.mlp")

    def forward(self, positions, x, encoder_states):
        x = x + self.self_attention(positions, self.pre_sa_norm(x))
        x = x + self.cross_attention(self.pre_ca_norm(x), encoder_states)
        return x + self.mlp(self.pre_mlp_norm(x))


class DiaDecoder(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        K, V = config.num_channels, config.vocab_size
        self.embeddings = nn.Module()
        self.embeddings.embed = nn.Embedding(K * V, config.hidden_size)
        self.register_buffer("offsets", torch.arange(K) * V, persistent=False)
        self.layers = nn.ModuleList([DiaDecoderLayer(config, vllm_config, f"{prefix}.layers.{i}")
                                     for i in range(config.num_hidden_layers)])
        self.norm = DiaRMSNorm(config.hidden_size, config.norm_eps)

    def forward(self, aux: torch.Tensor, positions: torch.Tensor, encoder_states: torch.Tensor | None) -> torch.Tensor:
        x = self.embeddings.embed(aux + self.offsets).sum(dim=1)  # [n, K] channel tokens -> [n, H]
        for layer in self.layers:
            x = layer(positions, x, encoder_states)
        return self.norm(x)


@MULTIMODAL_REGISTRY.register_processor(
    ConditionProcessor, info=ConditionProcessingInfo, dummy_inputs=ConditionDummyInputsBuilder
)
class DiaForConditionalGeneration(EncoderDecoderModel):
    cfg_filter = True
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        decoder = config.decoder_config
        self.encoder = DiaTextEncoder(config.encoder_config)
        self.decoder = DiaDecoder(decoder, vllm_config, "decoder")
        self.logits_dense = nn.Linear(decoder.hidden_size, decoder.num_channels * decoder.vocab_size, bias=False)
        self.vocab_size = decoder.vocab_size
        self.make_stream_runtime(dia_spec(config.to_dict()), vllm_config, self.decoder.offsets.device,
                                 hidden_size=decoder.hidden_size)

    def _encode(self, conditions: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.encoder(conditions)

    def _decode(self, aux, positions, encoder_states):
        return self.decoder(aux, positions, encoder_states)

    def _heads(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Channel logits; the runtime makes the primary logits (no text head) one-hot on the ruled token."""
        K, V = self.spec.num_codebooks, self.spec.pattern.vocab_size
        aux_logits = self.logits_dense(hidden_states).view(-1, K, V)
        return self.stream_runtime.ruled(self.vocab_size, aux_logits)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            name = name.removeprefix("model.")
            for part, fused, shard in ((".q_proj.", ".qkv_proj.", "q"), (".k_proj.", ".qkv_proj.", "k"),
                                       (".v_proj.", ".qkv_proj.", "v")):
                if name.startswith("decoder.") and ".self_attention" in name and part in name:
                    name = name.replace(part, fused)
                    params[name].weight_loader(params[name], w, shard)
                    break
            else:
                if name.startswith("decoder.") and ".cross_attention." in name and (".k_proj." in name or ".v_proj." in name):
                    shard = 0 if ".k_proj." in name else 1
                    name = name.replace(".k_proj.", ".kv_proj.").replace(".v_proj.", ".kv_proj.")
                    params[name].weight_loader(params[name], w, shard)
                elif name.startswith("decoder.") and ".gate_up_proj." in name:
                    for shard, half in enumerate(w.chunk(2, dim=0)):  # transformers fuses gate, up
                        params[name].weight_loader(params[name], half, shard)
                else:
                    param = params[name]
                    getattr(param, "weight_loader", default_weight_loader)(param, w)
            loaded.add(name)
        return loaded
