"""The AR stage of the AR+NAR family on vLLM (``SpeechctlValleLM``): codebook 1, frame by frame.

It is speechctl's generic multi-stream model (``generic/model.py``) with one audio stream
(codebook 1, delay 0): input of a position = primary embedding + codebook-1 embedding; output =
primary logits (ruled by the stream runtime: ``<|audio|>`` per frame, ``<|audio_eos|>`` after the
EOS step) and codebook-1 logits, sampled on the device by the runtime with each request's audio
sampling and seed, merged per CFG pair. So continuous batching, chunked prefill, preemption,
prefix caching and CUDA graphs are the generic family's, unchanged.

What differs is the voice prompt: a request carries the voice's codes of all K codebooks (the NAR
stage reads them from the same request), and this model's processor lays out codebook 1 only
(``FirstCodebookParser``); vLLM still hashes the whole item into the prefix-cache keys.
The NAR weights are not here (``nar/model.safetensors``, loaded by the NAR stage).
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.multimodal import MULTIMODAL_REGISTRY

from speechctl.engine.streams import StreamSpec
from speechctl.models.generic.model import MultiStreamForCausalLM
from speechctl.models.stream_model import (
    AudioCodesItems,
    AudioCodesParser,
    CodesDummyInputsBuilder,
    CodesProcessingInfo,
    CodesProcessor,
)


class FirstCodebookParser(AudioCodesParser):
    """Voice prompts given as [K, T] codes of every codebook -> the AR layout of codebook 1."""

    def _parse_audio_data(self, data):
        if data is None:
            return None
        if isinstance(data, (np.ndarray, torch.Tensor)) and np.ndim(data) == 2:
            data = [data]
        steps = [torch.from_numpy(self.pattern.build(np.asarray(item)[:1])) for item in data]
        return AudioCodesItems(steps)


class ArCodesProcessingInfo(CodesProcessingInfo):
    def stream_spec(self) -> StreamSpec:
        from speechctl.models.valle.family import ar_spec

        return ar_spec(self.ctx.model_config.hf_config.to_dict())

    def get_data_parser(self):
        return FirstCodebookParser(self.stream_spec().pattern)


@MULTIMODAL_REGISTRY.register_processor(
    CodesProcessor, info=ArCodesProcessingInfo, dummy_inputs=CodesDummyInputsBuilder
)
class ValleArForCausalLM(MultiStreamForCausalLM):
    """The generic model's layers, heads and weights (``model.*``, ``lm_head``, ``audio_embed``
    and ``audio_head`` of one stream); its stream spec is the config's ``speechctl`` section,
    which for this family is the AR stage's."""
