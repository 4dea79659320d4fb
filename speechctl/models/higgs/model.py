"""Higgs Audio v2 for vLLM, loading transformers' checkpoint format
(``HiggsAudioV2ForConditionalGeneration``, as published at bosonai/higgs-audio-v2-generation-3B-base).

What transformers' model and its ``generate`` do, and so what this file reproduces:

* Backbone: a Llama-3 decoder (llama3 RoPE) whose layers are **DualFFN**: attention is shared,
  but an *audio* position goes through ``audio_input_layernorm`` / ``audio_post_attention_layernorm``
  / ``audio_mlp`` instead of ``input_layernorm`` / ``post_attention_layernorm`` / ``mlp``. A
  position is audio when its text id is ``audio_token_id`` (``<|AUDIO_OUT|>``) or
  ``audio_delay_token_id``; every generated position is audio (transformers' decode passes no
  text ids at all, and the only non-audio generated id, ``eos_token_id``, ends the request).
* Inputs: a text position is its text embedding only; an audio position is the **sum of its K
  codebook embeddings only** (``model.embed_audio_tokens``, stream k's rows at k*V..k*V+V-1)
  - no text embedding is added.
* Output: ``audio_lm_head`` [K*V, H] gives K codebook logits per position. There is no text
  head in generation (a checkpoint's ``text_lm_head`` is ignored): the primary stream is fixed
  by rule - ``<|AUDIO_OUT|>`` per frame, the delay token from the first step where any stream
  emits EOS, ``eos_token_id`` at the step where all K streams are EOS (it stops the request).
* Streams (``HiggsAudioV2DelayPatternLogitsProcessor``, prompt ending in ``<|audio_out_bos|>``):
  stream k is forced to BOS at generated steps 0..k (delays 1..K; the first frame is all BOS);
  elsewhere it is free over its whole vocabulary (codes, BOS and EOS alike; nothing is masked).
  Once some stream emits EOS at step s, stream k is forced to EOS from step s+k+1 on.
  In speechctl terms: ``DelayPattern(delays=1..K, bos, eos, pad=eos)`` with
  ``EndRules(eos_lag=1, open_vocab=True)`` (``speechctl.models.higgs.family``).
* Voice prompts: reference codes [K, T] get a BOS and an EOS frame and the delay pattern
  (``HiggsAudioV2Processor.build_delay_pattern``): T + K + 1 audio positions - exactly
  ``DelayPattern.build`` of this layout; they arrive as multimodal items (``CodesProcessor``).
* Not reproduced: RAS (``ras_win_len``/``ras_win_max_num_repeat`` in the published
  generation_config.json: resampling a token repeated within a window), see docs/families.md.

The DualFFN choice must reach the layers inside a forward that vLLM may capture in a CUDA graph:
``embed_input_ids`` (eager, before the forward) writes the per-token audio mask into the
persistent buffer ``audio_mask`` [max_num_batched_tokens, 1], and every layer reads its first
``num_tokens`` rows. On CUDA the two MLPs are one top-1 mixture routed by that mask, so each
token runs only its own MLP, and uniform decode steps run the audio MLP alone as dense GEMMs
(``dual_mlp.py``); on the CPU both run and ``where`` picks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import partial

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaMLP, LlamaModel
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix
from vllm.multimodal import MULTIMODAL_REGISTRY

from speechctl.engine import vllm_compat
from speechctl.models.higgs.dual_mlp import DualMLP, load_dual_weights, warm_grouped_kernels
from speechctl.models.higgs.family import higgs_audio_v2_spec
from speechctl.models.stream_model import (
    AudioCodebookEmbedding,
    CodesDummyInputsBuilder,
    CodesProcessingInfo,
    CodesProcessor,
    StreamModel,
)


def one_mlp_per_token(mlp_bias: bool) -> bool:
    """Whether the DualFFN runs each token through its own MLP only (vLLM's fused MoE kernel,
    ``dual_mlp.py``) or computes both MLPs and selects (no MoE kernels here, or biased MLPs)."""
    return vllm_compat.grouped_mlp_available() and not mlp_bias


class HiggsAudioV2DecoderLayer(LlamaDecoderLayer):
    """vLLM's Llama layer plus the audio branch: its own norms and MLP for audio positions.

    ``audio_mask`` [max_tokens, 1] bool is shared by all layers and filled before the forward.
    RMSNorm's fused residual add runs once (text norm); the audio norm re-normalises the same
    residual sum, so both branches see identical inputs.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", audio_mask: torch.Tensor):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        self.grouped = one_mlp_per_token(getattr(config, "mlp_bias", False))
        if self.grouped:  # one MLP's work per token (dual_mlp.py); vLLM's text MLP goes
            del self.mlp
            rank, size = vllm_compat.tensor_parallel_rank_and_size()
            self.dual_mlp = DualMLP(config.hidden_size, config.intermediate_size, rank, size)
        else:
            self.audio_mlp = LlamaMLP(
                hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                hidden_act=config.hidden_act,
                quant_config=self.get_quant_config(vllm_config),
                bias=getattr(config, "mlp_bias", False),
                prefix=f"{prefix}.audio_mlp",
            )
        self.audio_input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.audio_post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.register_buffer("audio_mask", audio_mask, persistent=False)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        is_audio = self.audio_mask[: hidden_states.shape[0]]  # [n, 1]
        if residual is None:
            residual = hidden_states
            text = self.input_layernorm(hidden_states)
        else:
            text, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = torch.where(is_audio, self.audio_input_layernorm(residual), text)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)

        text, residual = self.post_attention_layernorm(hidden_states, residual)
        audio = self.audio_post_attention_layernorm(residual)
        if self.grouped:
            return self.dual_mlp(text, audio, is_audio), residual
        hidden_states = torch.where(is_audio, self.audio_mlp(audio), self.mlp(text))
        return hidden_states, residual


@MULTIMODAL_REGISTRY.register_processor(
    CodesProcessor, info=CodesProcessingInfo, dummy_inputs=CodesDummyInputsBuilder
)
class HiggsAudioV2ForConditionalGeneration(StreamModel):
    supports_repetition = True  # on by default: the published generation_config.json sets it

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        spec = higgs_audio_v2_spec(config.to_dict())
        pattern = spec.pattern
        self.audio_ids = (spec.audio_id, spec.flush_id)  # text ids of audio positions

        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.register_buffer("audio_mask", torch.zeros(max_tokens, 1, dtype=torch.bool), persistent=False)
        self.model = LlamaModel(
            vllm_config=vllm_config,
            prefix=maybe_prefix(prefix, "model"),
            layer_type=partial(HiggsAudioV2DecoderLayer, audio_mask=self.audio_mask),
        )
        K, V = pattern.num_streams, pattern.vocab_size
        self.model.embed_audio_tokens = AudioCodebookEmbedding(K, V, config.hidden_size)
        self.audio_lm_head = nn.Linear(config.hidden_size, K * V, bias=False)
        self.make_stream_runtime(spec, vllm_config, self.audio_mask.device)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        # the DualFFN's uniform decode graphs run the audio MLP alone (dual_mlp.py): vLLM's uniform
        # decode batches must then hold generated (audio) tokens only (attach_runtime's shim)
        self.uniform_decode_is_generated = self.model.layers[self.model.start_layer].grouped

    def embed_multimodal(self, **kwargs: object) -> list[torch.Tensor]:
        """Voice prompts: [K, S] delay-interleaved steps per item -> [S, H] audio embeddings."""
        embed = self.model.embed_audio_tokens
        return [embed(item.to(self.audio_mask.device, torch.int64).T) for item in self._audio_items(kwargs)]

    def _embed_streams(self, input_ids: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """[n] scheduled text ids -> [n, H]: text embedding at text positions, the sum of the
        codebook embeddings (generated tokens from the stream runtime, prompt audio from the
        multimodal items) at audio positions. Also fills ``audio_mask`` for the layers."""
        is_audio = (input_ids == self.audio_ids[0]) | (input_ids == self.audio_ids[1])
        text = self.model.embed_input_ids(input_ids)
        self.audio_mask[: input_ids.shape[0], 0].copy_(is_audio)
        return torch.where(is_audio[:, None], self.model.embed_audio_tokens(aux).to(text.dtype), text)

    def _heads(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Codebook logits from ``audio_lm_head``; there is no text head: the stream runtime
        makes the primary logits one-hot on the ruled token."""
        K, V = self.spec.num_codebooks, self.spec.pattern.vocab_size
        aux_logits = self.audio_lm_head(hidden_states).view(-1, K, V)
        return self.stream_runtime.ruled(self.config.vocab_size, aux_logits)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # A checkpoint converted with use_text_head=True carries text_lm_head; generation never uses it.
        weights = ((name, w) for name, w in weights if not name.startswith("text_lm_head."))
        dual = set()
        first = self.model.layers[self.model.start_layer]
        if first.grouped:
            weights = load_dual_weights(weights, self.model.layers, dual)
        return AutoWeightsLoader(self).load_weights(weights) | dual

    def warm_kernels(self) -> None:
        """The DualFFN's fused MoE kernel at every kind of step size up to the step's largest
        (``dual_mlp.warm_grouped_kernels``): after vLLM's captures, so only the kinds its graphs
        did not meet compile (those a mixed step past the largest graph, or any eager step, can
        meet). Here, not in ``load_weights``, which random weights skip (vLLM's dummy loader)."""
        first = self.model.layers[self.model.start_layer]
        if first.grouped and os.environ.get("SPEECHCTL_WARM_MOE", "1") != "0":  # (0: for an A/B only)
            warm_grouped_kernels(first.dual_mlp, 1, self.audio_mask.shape[0])  # (a row per token of a step)
