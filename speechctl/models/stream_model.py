"""What every multi-stream model shares with vLLM, whatever its family.

* audio in prompts as codec codes through vLLM's multimodal path (``CodesProcessor``): one
  ``<|audio|>`` placeholder per item, expanded to the item's delay-interleaved steps; the items
  are hashed into the prefix-cache keys;
* ``StreamModel``: the vLLM model surface. ``embed_input_ids`` embeds the scheduled tokens
  through the stream runtime (``_embed_streams(ids, aux)``; CUDA-graphed on decode steps), the
  backbone's forward, ``compute_logits`` runs the heads and the sampling (``_heads(hidden)``;
  CUDA-graphed too). A family's model supplies those two functions, its layers and its weights;
* ``AudioCodebookEmbedding``: K codebook tables in one, summed per position; ``summed_embeddings``
  sums a prefill's rows a bounded number at a time.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import ModalityDataItems, MultiModalDataParser
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
)

from speechctl.engine import vllm_compat
from speechctl.engine.runtime import StreamRuntime
from speechctl.engine.runtime.warmup import record_step_graphs
from speechctl.engine.streams import DelayPattern, StreamSpec, item_steps
from speechctl.engine.vllm_compat import CodesDummyHooks, CodesProcessorHooks

AUDIO_PLACEHOLDER = "<|audio|>"


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
    """Accepts ``{"audio": codes}`` or ``{"audio": [item, ...]}``, an item codes [K, T] in
    [0, codebook_size) or speech to continue (``streams.audio_item``), and lays each item out
    with the model's delay pattern (``streams.item_steps``)."""

    def __init__(self, pattern: DelayPattern):
        super().__init__()
        self.pattern = pattern

    def _parse_audio_data(self, data):
        if data is None:
            return None
        if isinstance(data, (np.ndarray, torch.Tensor)) and np.ndim(data) == 2:
            data = [data]
        steps = [torch.from_numpy(item_steps(self.pattern, item)) for item in data]
        return AudioCodesItems(steps)


class CodesProcessingInfo(BaseProcessingInfo):
    def stream_spec(self) -> StreamSpec:
        from speechctl.models.families import stream_spec

        return stream_spec(self.ctx.model_config.hf_config.to_dict())  # by the checkpoint's family

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
    """The vLLM model surface of a multi-stream model (module doc). A family's ``__init__`` builds
    its layers and calls ``make_stream_runtime``; it supplies ``_embed_streams``, ``_heads``,
    ``embed_multimodal`` and ``load_weights``."""

    backbone_name = "model"
    supports_guidance = False  # CFG pairs can reach this model (its family's prompts build them)
    supports_repetition = False  # repetition-aware sampling can (Higgs)
    has_depth_decoder = False  # its codebooks after the first are sampled one by one (CSM)
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return AUDIO_PLACEHOLDER if modality.startswith("audio") else None

    def make_stream_runtime(self, spec: StreamSpec, vllm_config: VllmConfig, device: torch.device) -> None:
        """The model's per-step runtime, sized by the engine's batch and context limits."""
        self.spec = spec
        self.stream_runtime = StreamRuntime(
            spec,
            max_rows=vllm_config.scheduler_config.max_num_seqs,
            max_len=vllm_config.model_config.max_model_len,
            device=device,
            depth_decoder=self.has_depth_decoder,
            graph_rows=vllm_compat.cudagraph_capture_rows(vllm_config),
        )

    def record_step_graphs(self) -> int:
        """Record the runtime's per-step CUDA graphs of every batch size now (start-up), for the
        variants this model can meet; the number recorded (0 without graphs)."""
        dtype = next(self.parameters()).dtype
        return record_step_graphs(self.stream_runtime, self._heads, self._embed_streams, self.config.hidden_size, dtype,
                                  guidance=self.supports_guidance, repetition=self.supports_repetition)

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


class AudioCodebookEmbedding(nn.Module):
    """K codebook tables in one: [n, K] stream tokens -> [n, H], the sum over the K streams
    (stream k's rows at k*V .. k*V+V-1). Named like transformers' ``HiggsAudioV2Embeddings``,
    whose layout Higgs and CSM checkpoints share, so their names map one to one."""

    def __init__(self, num_codebooks: int, vocab: int, hidden_size: int):
        super().__init__()
        self.embed_audio_tokens = nn.Embedding(num_codebooks * vocab, hidden_size)
        offsets = torch.arange(num_codebooks, device=self.embed_audio_tokens.weight.device) * vocab
        self.register_buffer("offsets", offsets, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return summed_embeddings(self.embed_audio_tokens, tokens + self.offsets)


# Rows embedded at once by ``summed_embeddings``: the lookup makes [rows, K, H] before the sum,
# K times its output. A prefill of 16,384 tokens made Higgs 3B's 768 MiB at once (K = 8,
# H = 3,072) and ran an H100 out of memory beside its codec (forty-third session); 1,024 rows
# take 48 MiB. vLLM's start-up profile never sees this: its dummy run of a multimodal model
# passes its own inputs_embeds buffer and does not call embed_input_ids.
SUMMED_ROWS = 1024


def summed_embeddings(table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """``table(ids).sum(dim=1)``, [n, K] ids -> [n, H], at most ``SUMMED_ROWS`` rows at a time
    (the same numbers). For ``embed_input_ids``, which runs eagerly (a decode step's is replayed
    from a CUDA graph of its bucket's size): the loop over a prefill's rows costs no capture."""
    if ids.shape[0] <= SUMMED_ROWS:
        return table(ids).sum(dim=1)
    out = table.weight.new_empty(ids.shape[0], table.embedding_dim)
    for start in range(0, ids.shape[0], SUMMED_ROWS):
        rows = ids[start : start + SUMMED_ROWS]
        out[start : start + rows.shape[0]] = table(rows).sum(dim=1)
    return out
