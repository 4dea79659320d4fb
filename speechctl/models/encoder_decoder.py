"""What the encoder-decoder families (Dia, MusicGen) share with vLLM: its encoder-decoder path,
the one speechctl's Whisper runs on.

* The condition (Dia's text bytes, MusicGen's T5 ids) is the encoder prompt's one multimodal
  item (``ConditionProcessor``): its ids and a tag naming the request, expanded to one encoder
  position per id; vLLM runs the encoder in ``embed_multimodal`` when it schedules the item and
  keeps the cross-attention keys and values in its KV cache (a cross-attention group).
* The decoder prompt is control tokens, one per position; the stream tokens of its positions
  (the BOS frame, an audio prompt) travel with the request's ``StreamParams`` into the slot
  table (``SpecStreams.prompt_streams``).
* ``EncoderDecoderModel``: vLLM hands an encoder-decoder model's forward token ids (it never
  calls ``embed_input_ids``) and captures that forward whole on pure decode steps, so the
  forward gathers the auxiliary tokens from persistent buffers only
  (``StreamRuntime.decoder_inputs``) and ``compute_logits`` locates the rows anew.
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
    BaseProcessingInfo,
    EncDecMultiModalProcessor,
    PromptReplacement,
)

from speechctl.engine import vllm_compat
from speechctl.engine.requests import condition_tag
from speechctl.engine.runtime import StreamRuntime
from speechctl.engine.runtime.warmup import record_step_graphs
from speechctl.engine.streams import StreamSpec
from speechctl.engine.vllm_compat import CodesDummyHooks, CodesProcessorHooks

ENCODER_PLACEHOLDER = 0  # the encoder prompt's token ids (requests.encoder_decoder_prompt); never embedded


class ConditionItems(ModalityDataItems[list, dict]):
    """Condition items: each {"ids": int64 [L], "tag": int64 [1]}."""

    def __init__(self, data: list[dict]):
        super().__init__(data, "audio")

    def get_count(self) -> int:
        return len(self.data)

    def get(self, index: int) -> dict:
        return self.data[index]

    def get_processor_data(self) -> Mapping[str, object]:
        return {}

    def get_passthrough_data(self) -> Mapping[str, object]:
        return {"condition_ids": [d["ids"] for d in self.data], "condition_tag": [d["tag"] for d in self.data]}


class ConditionParser(MultiModalDataParser):
    """Accepts ``{"audio": (ids, tag)}``: the encoder's input ids and the request's tag."""

    def _parse_audio_data(self, data):
        if data is None:
            return None
        items = [data] if isinstance(data, tuple) else list(data)
        return ConditionItems([{"ids": torch.as_tensor(np.asarray(ids), dtype=torch.int64),
                                "tag": torch.tensor([int(tag)], dtype=torch.int64)} for ids, tag in items])


class ConditionProcessingInfo(BaseProcessingInfo):
    def family_config(self) -> dict:
        return self.ctx.model_config.hf_config.to_dict()

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"audio": 1}

    def get_data_parser(self) -> MultiModalDataParser:
        return ConditionParser()

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]):
        from speechctl.models.families import family_of

        config = self.family_config()
        return {"audio": family_of(config).encoder_positions(config)}


class ConditionDummyInputsBuilder(CodesDummyHooks, BaseDummyInputsBuilder[ConditionProcessingInfo]):
    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return ""

    def get_dummy_prompt_ids(self, mm_counts: Mapping[str, int]) -> list[int]:
        return [ENCODER_PLACEHOLDER]

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int], mm_options=None):
        if not mm_counts.get("audio", 0):
            return {}
        length = self.info.get_mm_max_tokens_per_item(seq_len, mm_counts)["audio"]
        return {"audio": (np.zeros(length, dtype=np.int64), 0)}


class ConditionProcessor(CodesProcessorHooks, EncDecMultiModalProcessor[ConditionProcessingInfo]):
    skip_decoder_start_token = True  # speechctl's decoder prompts begin with their start frame

    def create_encoder_prompt(self, prompt, mm_items) -> list[int]:
        return [ENCODER_PLACEHOLDER]

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        return {"condition_ids": MultiModalFieldConfig.batched("audio"),
                "condition_tag": MultiModalFieldConfig.batched("audio")}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        items = mm_items.get_items("audio", ConditionItems)
        return [PromptReplacement(modality="audio", target=[ENCODER_PLACEHOLDER],
                                  replacement=lambda i: [ENCODER_PLACEHOLDER] * len(items.get(i)["ids"]))]


class EncoderDecoderModel(nn.Module, SupportsMultiModal):
    """The vLLM surface of an encoder-decoder stream model (module doc). A family's model builds
    its layers, calls ``make_stream_runtime``, and supplies ``_encode(ids) -> [L, H]`` (one
    condition), ``_decode(aux, positions, encoder_states) -> hidden`` and ``_heads(hidden)``."""

    decoder_name = "decoder"
    cfg_filter = False  # Dia's CFG filter can reach this model (its family's convention)

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return None

    def make_stream_runtime(self, spec: StreamSpec, vllm_config: VllmConfig, device: torch.device, *,
                            hidden_size: int) -> None:
        """The per-step runtime; ``hidden_size``: the decoder's output width (the heads' input)."""
        self.spec = spec
        self.stream_runtime = StreamRuntime(spec, max_rows=vllm_config.scheduler_config.max_num_seqs,
                                            max_len=vllm_config.model_config.max_model_len, device=device,
                                            graph_rows=vllm_compat.cudagraph_capture_rows(vllm_config))
        self._hidden = (hidden_size, vllm_config.model_config.dtype)
        self._encoded_tags: list[int] = []

    def record_step_graphs(self) -> int:
        """Record the sampling phase's per-step CUDA graphs of every batch size now (start-up),
        for the variants a CFG family meets: pairs live or not, with its filter or not. The input
        phase has none of its own: it runs inside vLLM's graph of the forward."""
        hidden_size, dtype = self._hidden
        return record_step_graphs(self.stream_runtime, self._heads, None, hidden_size, dtype, guidance=True,
                                  repetition=False, cfg_filter=self.cfg_filter)

    def get_language_model(self) -> nn.Module:
        return getattr(self, self.decoder_name)

    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings=None, **kwargs) -> torch.Tensor:
        raise NotImplementedError("an encoder-decoder stream model embeds its inputs in its forward")

    def embed_multimodal(self, **kwargs) -> list[torch.Tensor]:
        """The encoder on this step's conditions: one [L, H] output per item, in the order
        given; their tags are kept to put the outputs in row order in the forward."""
        ids, tags = kwargs.get("condition_ids"), kwargs.get("condition_tag")
        if ids is None:
            return []
        ids = list(ids.unbind(0)) if isinstance(ids, torch.Tensor) else list(ids)
        tags = tags.reshape(-1).tolist() if isinstance(tags, torch.Tensor) else [int(t.reshape(-1)[0]) for t in tags]
        self._encoded_tags = tags  # one host copy per step that runs the encoder
        return self._encode(ids)

    def _in_row_order(self, encoder_outputs: list[torch.Tensor]) -> torch.Tensor | None:
        """The step's encoder outputs concatenated in the batch's row order: vLLM's
        cross-attention writes the keys and values of the rows that start in this step in row
        order, while it hands the outputs over in the order it scheduled them."""
        if not encoder_outputs:
            return None
        tags = self._encoded_tags
        if len(tags) == len(encoder_outputs) and len(tags) > 1:
            rows = self.stream_runtime.table.rows_of_tags(tags, condition_tag)
            encoder_outputs = [out for _, out in sorted(zip(rows, encoder_outputs), key=lambda pair: pair[0])]
        return torch.cat(encoder_outputs, dim=0)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, encoder_outputs=None,
                **kwargs) -> torch.Tensor:
        aux = self.stream_runtime.decoder_inputs(input_ids, positions, vllm_compat.forward_is_one_token_per_row())
        return self._decode(aux, positions, self._in_row_order(encoder_outputs or []))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        self.stream_runtime.locate_rows()
        return self.stream_runtime.graphed_logits(self._heads, hidden_states)
