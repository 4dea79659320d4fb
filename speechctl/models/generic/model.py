"""speechctl's own multi-stream speech LM for vLLM (``SpeechctlMultiStreamLM``): a decoder-only
backbone (vLLM's own Llama / Qwen2 / Qwen3 layers, chosen by ``model_type``), one primary stream
and K audio codebooks.

Input of a position: primary embedding + the sum of its K codebook embeddings.
Output: primary logits (sampled by vLLM) and K codebook logits (sampled on the device by the
stream runtime). Audio in prompts arrives as codec codes (``stream_model.CodesProcessor``).

Checkpoint layout (safetensors): the backbone under ``model.``, ``lm_head.weight`` [V, H],
``audio_embed.weight`` [K*Va, H] and ``audio_head.weight`` [K*Va, H], where Va is the
codebook size + 3 (BOS, EOS, PAD) and stream k owns rows k*Va .. (k+1)*Va-1.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix
from vllm.multimodal import MULTIMODAL_REGISTRY

from speechctl.engine.streams import StreamSpec
from speechctl.models.stream_model import (
    CodesDummyInputsBuilder,
    CodesProcessingInfo,
    CodesProcessor,
    StreamModel,
    summed_embeddings,
)


def _backbone_class(model_type: str):
    if model_type == "llama":
        from vllm.model_executor.models.llama import LlamaModel

        return LlamaModel
    if model_type == "qwen3":
        from vllm.model_executor.models.qwen3 import Qwen3Model

        return Qwen3Model
    if model_type == "qwen2":
        from vllm.model_executor.models.qwen2 import Qwen2Model

        return Qwen2Model
    raise ValueError(f"unsupported backbone model_type {model_type!r} (llama, qwen2, qwen3)")


@MULTIMODAL_REGISTRY.register_processor(
    CodesProcessor, info=CodesProcessingInfo, dummy_inputs=CodesDummyInputsBuilder
)
class MultiStreamForCausalLM(StreamModel):
    supports_guidance = True
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        spec = StreamSpec.from_hf_config(config)
        pattern = spec.pattern
        self.model = _backbone_class(config.model_type)(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model")
        )
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=vllm_config.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

        K, Va = pattern.num_streams, pattern.vocab_size
        self.audio_embed = nn.Embedding(K * Va, config.hidden_size)
        self.audio_head = nn.Linear(config.hidden_size, K * Va, bias=False)
        device = self.audio_embed.weight.device
        self.register_buffer("stream_offsets", torch.arange(K, device=device) * Va, persistent=False)
        self.make_stream_runtime(spec, vllm_config, device)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def _embed_streams(self, primary: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """primary [n], aux [n, K] -> [n, H]: sum of the K+1 stream embeddings."""
        emb = self.model.embed_input_ids(primary)
        return emb + summed_embeddings(self.audio_embed, aux + self.stream_offsets)

    def embed_multimodal(self, **kwargs: object) -> list[torch.Tensor]:
        out = []
        for item in self._audio_items(kwargs):  # [K, S]
            item = item.to(self.stream_offsets.device, torch.int64).T
            primary = torch.full_like(item[:, 0], self.spec.audio_id)
            out.append(self._embed_streams(primary, item))
        return out

    def _heads(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        # Tensor parallelism: vLLM all-gathers the primary logits to every rank, and the audio
        # head is replicated over the (all-reduced, identical) hidden states, so every rank
        # samples the same auxiliary tokens from the same logits with the same counter-based
        # noise: the stream state stays identical on all ranks by construction. Where a
        # platform gathers to rank 0 only, the other ranks still sample and record the streams.
        logits = self.logits_processor(self.lm_head, hidden_states)
        driver = logits is not None
        if not driver:
            logits = hidden_states.new_zeros(hidden_states.shape[0], self.config.vocab_size)
        K, Va = self.spec.num_codebooks, self.spec.pattern.vocab_size
        aux_logits = self.audio_head(hidden_states).view(-1, K, Va)
        logits = self.stream_runtime.sample(logits, aux_logits)
        return logits if driver else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if self.config.tie_word_embeddings:
            weights = ((name, w) for name, w in weights if not name.startswith("lm_head."))
        return AutoWeightsLoader(self).load_weights(weights)
