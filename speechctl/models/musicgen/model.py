"""MusicGen for vLLM, loading transformers' checkpoint format
(``MusicgenForConditionalGeneration``, as published at facebook/musicgen-small), on vLLM's
encoder-decoder path.

What transformers' model and its ``generate`` do, and so what this file reproduces:

* **Text encoder**: T5 (transformers' own ``T5EncoderModel``, ``text_encoder.*``), run once per
  request in ``embed_multimodal``, then ``enc_to_dec_proj`` where the widths differ; its states
  become the cross-attention keys and values in vLLM's KV cache. The unconditional CFG member's
  condition is null (ids -1): its states are zeros, as transformers' (zeros appended for the
  unconditional half, its attention mask zeros, the projected states multiplied by the mask).
* **Decoder**: the input of a position is the sum of its K codebook embeddings (2049 ids each:
  2048 codes and BOS/PAD) plus a sinusoidal position embedding ([cos, sin]); per layer
  LayerNorm → self-attention → LayerNorm → cross-attention → LayerNorm → fc1, GELU, fc2 (no
  biases); a final LayerNorm; ``lm_heads`` give K × 2048 logits.
* **Streams** (``family.py``): delays 0..K-1 after an all-BOS start frame; the audio ends by
  length; CFG on every codebook, ``l_u + g·(l_c − l_u)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention, CrossAttention
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.v1.attention.backend import AttentionType

from speechctl.models.encoder_decoder import (
    ConditionDummyInputsBuilder,
    ConditionProcessingInfo,
    ConditionProcessor,
    EncoderDecoderModel,
)
from speechctl.models.musicgen.family import musicgen_spec


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """[positions, dim] as transformers' ``MusicgenSinusoidalPositionalEmbedding``: cos, then sin."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
    angles = torch.arange(num_positions, dtype=torch.int64).float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)
    return torch.nn.functional.pad(emb, (0, dim % 2))


class MusicgenAttention(nn.Module):
    """Self-attention (``cross=False``) or cross-attention over the encoder states."""

    def __init__(self, config, vllm_config: VllmConfig, prefix: str, cross: bool):
        super().__init__()
        H, heads = config.hidden_size, config.num_attention_heads
        self.head_dim, self.heads = H // heads, heads // get_tensor_model_parallel_world_size()
        scale, cache = self.head_dim**-0.5, vllm_config.cache_config
        if cross:
            self.q_proj = ColumnParallelLinear(H, H, bias=False, prefix=f"{prefix}.q_proj")
            self.kv_proj = MergedColumnParallelLinear(H, [H, H], bias=False, prefix=f"{prefix}.kv_proj")
            self.attn = CrossAttention(self.heads, self.head_dim, scale, cache_config=cache, prefix=f"{prefix}.attn",
                                       attn_type=AttentionType.ENCODER_DECODER)
        else:
            self.qkv_proj = QKVParallelLinear(H, self.head_dim, heads, heads, bias=False, prefix=f"{prefix}.qkv_proj")
            self.attn = Attention(self.heads, self.head_dim, scale, cache_config=cache, prefix=f"{prefix}.attn")
        self.out_proj = RowParallelLinear(H, H, bias=False, prefix=f"{prefix}.out_proj")
        self.cross = cross

    def forward(self, x: torch.Tensor, encoder_states: torch.Tensor | None = None) -> torch.Tensor:
        if self.cross:
            q, _ = self.q_proj(x)
            k = v = None
            if encoder_states is not None:  # the step that starts a request: its keys and values
                kv, _ = self.kv_proj(encoder_states)
                k, v = kv.chunk(2, dim=-1)
        else:
            qkv, _ = self.qkv_proj(x)
            q, k, v = qkv.chunk(3, dim=-1)
        out, _ = self.out_proj(self.attn(q, k, v))
        return out


class MusicgenDecoderLayer(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        H = config.hidden_size
        self.self_attn = MusicgenAttention(config, vllm_config, f"{prefix}.self_attn", cross=False)
        self.self_attn_layer_norm = nn.LayerNorm(H)
        self.encoder_attn = MusicgenAttention(config, vllm_config, f"{prefix}.encoder_attn", cross=True)
        self.encoder_attn_layer_norm = nn.LayerNorm(H)
        self.fc1 = ColumnParallelLinear(H, config.ffn_dim, bias=False, prefix=f"{prefix}.fc1")
        self.fc2 = RowParallelLinear(config.ffn_dim, H, bias=False, prefix=f"{prefix}.fc2")
        self.final_layer_norm = nn.LayerNorm(H)
        if config.activation_function != "gelu":
            raise ValueError(f"MusicGen decoder activation {config.activation_function!r}: speechctl has gelu")

    def forward(self, x: torch.Tensor, encoder_states: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        x = x + self.encoder_attn(self.encoder_attn_layer_norm(x), encoder_states)
        h, _ = self.fc1(self.final_layer_norm(x))
        h, _ = self.fc2(nn.functional.gelu(h))
        return x + h


class MusicgenDecoder(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        K, V = config.num_codebooks, config.vocab_size + 1  # codes and BOS/PAD
        self.embed_tokens = nn.Embedding(K * V, config.hidden_size)  # transformers' K tables, stacked
        self.register_buffer("offsets", torch.arange(K) * V, persistent=False)
        self.register_buffer("positions", sinusoidal_positions(config.max_position_embeddings, config.hidden_size),
                             persistent=False)
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        self.layers = nn.ModuleList([MusicgenDecoderLayer(config, vllm_config, f"{prefix}.layers.{i}")
                                     for i in range(config.num_hidden_layers)])
        self.layer_norm = nn.LayerNorm(config.hidden_size)

    def forward(self, aux: torch.Tensor, positions: torch.Tensor, encoder_states: torch.Tensor | None) -> torch.Tensor:
        x = self.embed_tokens(aux + self.offsets).sum(dim=1) * self.embed_scale  # [n, K] -> [n, H]
        x = x + self.positions[positions].to(x.dtype)
        for layer in self.layers:
            x = layer(x, encoder_states)
        return self.layer_norm(x)


@MULTIMODAL_REGISTRY.register_processor(
    ConditionProcessor, info=ConditionProcessingInfo, dummy_inputs=ConditionDummyInputsBuilder
)
class MusicgenForConditionalGeneration(EncoderDecoderModel):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        from transformers import T5EncoderModel

        config = vllm_config.model_config.hf_config
        decoder = config.decoder
        self.config = config
        self.text_encoder = T5EncoderModel(config.text_encoder).eval()
        projects = config.text_encoder.hidden_size != decoder.hidden_size and decoder.cross_attention_hidden_size is None
        self.enc_to_dec_proj = nn.Linear(config.text_encoder.hidden_size, decoder.hidden_size) if projects else None
        self.decoder = MusicgenDecoder(decoder, vllm_config, "decoder")
        K, V = decoder.num_codebooks, decoder.vocab_size
        self.lm_heads = nn.Linear(decoder.hidden_size, K * V, bias=False)  # transformers' K heads, stacked
        self.vocab_size, self.hidden_size = V, decoder.hidden_size
        self.make_stream_runtime(musicgen_spec(config.to_dict()), vllm_config, self.decoder.offsets.device,
                                 hidden_size=decoder.hidden_size)

    def _encode(self, conditions: list[torch.Tensor]) -> list[torch.Tensor]:
        """T5 (and the projection) on each real condition; zeros for a null one (ids -1)."""
        device = self.decoder.offsets.device
        real = [i for i, c in enumerate(conditions) if len(c) and int(c[0]) >= 0]
        dtype = self.lm_heads.weight.dtype
        outputs = [torch.zeros(len(c), self.hidden_size, device=device, dtype=dtype) for c in conditions]
        if real:
            L = max(len(conditions[i]) for i in real)
            ids = torch.zeros(len(real), L, dtype=torch.int64, device=device)
            mask = torch.zeros(len(real), L, dtype=torch.int64, device=device)
            for row, i in enumerate(real):
                ids[row, : len(conditions[i])] = conditions[i].to(device)
                mask[row, : len(conditions[i])] = 1
            states = self.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            if self.enc_to_dec_proj is not None:
                states = self.enc_to_dec_proj(states)
            for row, i in enumerate(real):
                outputs[i] = states[row, : len(conditions[i])].to(dtype)
        return outputs

    def _decode(self, aux, positions, encoder_states):
        return self.decoder(aux, positions, encoder_states)

    def _heads(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Codebook logits, padded for BOS/PAD and the nominal EOS (which the rules mask; finite
        here, so that CFG's difference of two padded rows is 0, not NaN); the runtime makes the
        primary logits (no text head) one-hot on the ruled token."""
        K, Va = self.spec.num_codebooks, self.spec.pattern.vocab_size
        logits = self.lm_heads(hidden_states).view(-1, K, self.vocab_size).float()
        aux_logits = nn.functional.pad(logits, (0, Va - self.vocab_size), value=-1e30)
        return self.stream_runtime.ruled(self.vocab_size, aux_logits)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        V = self.vocab_size
        loaded = set()
        for name, w in weights:
            if name.startswith("audio_encoder.") or name == "text_encoder.encoder.embed_tokens.weight":
                continue  # the codec (speechctl.codecs.encodec); T5's tied copy of text_encoder.shared
            name = name.replace("decoder.model.decoder.", "decoder.")
            if name.startswith("decoder.lm_heads."):  # K heads [V, H] -> rows k*V.. of the stacked head
                k = int(name.split(".")[2])
                self.lm_heads.weight.data[k * V : (k + 1) * V].copy_(w)
                loaded.add("lm_heads.weight")
                continue
            if name.startswith("decoder.embed_tokens."):
                k = int(name.split(".")[2])
                self.decoder.embed_tokens.weight.data[k * (V + 1) : (k + 1) * (V + 1)].copy_(w)
                loaded.add("decoder.embed_tokens.weight")
                continue
            for part, fused, shard in ((".self_attn.q_proj.", ".self_attn.qkv_proj.", "q"),
                                       (".self_attn.k_proj.", ".self_attn.qkv_proj.", "k"),
                                       (".self_attn.v_proj.", ".self_attn.qkv_proj.", "v"),
                                       (".encoder_attn.k_proj.", ".encoder_attn.kv_proj.", 0),
                                       (".encoder_attn.v_proj.", ".encoder_attn.kv_proj.", 1)):
                if part in name:
                    name = name.replace(part, fused)
                    params[name].weight_loader(params[name], w, shard)
                    break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, w)
            loaded.add(name)
        return loaded
