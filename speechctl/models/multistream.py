"""Generic multi-stream speech LM for vLLM: a decoder-only backbone (vLLM's own Llama / Qwen2 /
Qwen3 layers, chosen by ``model_type``), one primary stream and K audio codebooks.

Input of a position: primary embedding + the sum of its K codebook embeddings.
Output: primary logits (sampled by vLLM) and K codebook logits (sampled on the device by
``StreamRuntime``). Audio in prompts (a voice prompt, audio to transcribe) arrives as codec codes
through vLLM's multimodal path: one ``<|audio|>`` placeholder per item, expanded to the item's
delay-interleaved steps.

Checkpoint layout (safetensors): the backbone under ``model.``, ``lm_head.weight`` [V, H],
``audio_embed.weight`` [K*Va, H] and ``audio_head.weight`` [K*Va, H], where Va is the
codebook size + 3 (BOS, EOS, PAD) and stream k owns rows k*Va .. (k+1)*Va-1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import ModalityDataItems, MultiModalDataParser
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
)

from speechctl.engine.state import StreamRuntime
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.engine.vllm_compat import CodesDummyHooks, CodesProcessorHooks

AUDIO_PLACEHOLDER = "<|audio|>"


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


# -- audio codes as multimodal items ----------------------------------------------------------


class AudioCodesItems(ModalityDataItems[list, torch.Tensor]):
    """Audio items given as codec codes, already delay-interleaved: each item is [K, S] int64."""

    def __init__(self, data: list[torch.Tensor]):
        super().__init__(data, "audio")

    def get_count(self) -> int:
        return len(self.data)

    def get(self, index: int) -> torch.Tensor:
        return self.data[index]

    def get_processor_data(self) -> Mapping[str, object]:
        return {}

    def get_passthrough_data(self) -> Mapping[str, object]:
        return {"audio_steps": self.data}


class AudioCodesParser(MultiModalDataParser):
    """Accepts ``{"audio": codes}`` or ``{"audio": [codes, ...]}`` with codes [K, T] in
    [0, codebook_size) and lays each item out with the model's delay pattern."""

    def __init__(self, pattern: DelayPattern):
        super().__init__()
        self.pattern = pattern

    def _parse_audio_data(self, data):
        if data is None:
            return None
        if isinstance(data, (np.ndarray, torch.Tensor)) and np.ndim(data) == 2:
            data = [data]
        steps = [torch.from_numpy(self.pattern.build(np.asarray(item))) for item in data]
        return AudioCodesItems(steps)


class CodesProcessingInfo(BaseProcessingInfo):
    def stream_spec(self) -> StreamSpec:
        from speechctl.models.families import stream_spec

        return stream_spec(self.ctx.model_config.hf_config)  # by the checkpoint's family

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"audio": None}

    def get_data_parser(self) -> MultiModalDataParser:
        return AudioCodesParser(self.stream_spec().pattern)

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]):
        return {"audio": seq_len}


class CodesDummyInputsBuilder(CodesDummyHooks, BaseDummyInputsBuilder[CodesProcessingInfo]):
    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return AUDIO_PLACEHOLDER * mm_counts.get("audio", 0)

    def get_dummy_prompt_ids(self, mm_counts: Mapping[str, int]) -> list[int]:
        return [self.info.stream_spec().audio_id] * mm_counts.get("audio", 0)

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int], mm_options=None):
        count = mm_counts.get("audio", 0)
        if not count:
            return {}
        pattern = self.info.stream_spec().pattern
        frames = max(1, seq_len // count - pattern.max_delay - 1)
        return {"audio": [np.zeros((pattern.num_streams, frames), dtype=np.int64)] * count}


class CodesProcessor(CodesProcessorHooks, BaseMultiModalProcessor[CodesProcessingInfo]):
    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        return {"audio_steps": MultiModalFieldConfig.batched("audio")}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        audio_id = self.info.stream_spec().audio_id
        items = mm_items.get_items("audio", AudioCodesItems)
        return [
            PromptReplacement(
                modality="audio",
                target=[audio_id],
                replacement=lambda i: [audio_id] * items.get(i).shape[1],
            )
        ]


# -- the shared model surface --------------------------------------------------------------------


class StreamModel(nn.Module, SupportsMultiModal):
    """What every multi-stream model shares with vLLM: the multimodal audio hooks, embedding of
    the scheduled tokens through the stream runtime (``_embed_streams(ids, aux)``; CUDA-graphed on
    decode steps), the backbone's forward (``backbone_name``) and the heads + sampling
    (``_heads(hidden)``; CUDA-graphed too). A family supplies those two functions, its
    ``__init__`` (setting ``stream_runtime``) and its weight loading."""

    backbone_name = "model"
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return AUDIO_PLACEHOLDER if modality.startswith("audio") else None

    def get_language_model(self) -> nn.Module:
        return getattr(self, self.backbone_name)

    @staticmethod
    def _audio_items(kwargs) -> list[torch.Tensor]:
        """The [K, S] delay-interleaved steps of each prompt audio item."""
        steps = kwargs.get("audio_steps")
        if steps is None:
            return []
        return list(steps.unbind(0)) if isinstance(steps, torch.Tensor) else list(steps)

    def embed_input_ids(
        self,
        input_ids: torch.Tensor,
        multimodal_embeddings=None,
        *,
        is_multimodal: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        has_mm = multimodal_embeddings is not None and len(multimodal_embeddings) > 0 and is_multimodal is not None
        emb = self.stream_runtime.embed_inputs(self._embed_streams, input_ids, graphable=not has_mm)
        if has_mm:
            mm = torch.cat(list(multimodal_embeddings), dim=0).to(emb.dtype)
            mask = is_multimodal.to(emb.device, non_blocking=True)  # vLLM builds it on the CPU
            emb = emb.masked_scatter(mask.unsqueeze(-1), mm)
        return emb

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        return self.get_language_model()(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.stream_runtime.graphed_logits(self._heads, hidden_states)


# -- the model ---------------------------------------------------------------------------------


@MULTIMODAL_REGISTRY.register_processor(
    CodesProcessor, info=CodesProcessingInfo, dummy_inputs=CodesDummyInputsBuilder
)
class MultiStreamForCausalLM(StreamModel):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.spec = StreamSpec.from_hf_config(config)
        pattern = self.spec.pattern
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
        self.stream_runtime = StreamRuntime(
            self.spec,
            max_rows=vllm_config.scheduler_config.max_num_seqs,
            max_len=vllm_config.model_config.max_model_len,
            device=device,
        )
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def _embed_streams(self, primary: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """primary [n], aux [n, K] -> [n, H]: sum of the K+1 stream embeddings."""
        emb = self.model.embed_input_ids(primary)
        return emb + self.audio_embed(aux + self.stream_offsets).sum(dim=1)

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
