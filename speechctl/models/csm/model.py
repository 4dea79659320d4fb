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
  codebook sampled on the device by the stream runtime (``codebook_sampler``, its depth settings);
  see ``csm/depth.py``.
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
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.models.llama import LlamaModel
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix
from vllm.multimodal import MULTIMODAL_REGISTRY

from speechctl.models.csm.depth import CsmDepthDecoder
from speechctl.models.csm.family import csm_spec
from speechctl.models.stream_model import (
    AudioCodebookEmbedding,
    CodesDummyInputsBuilder,
    CodesProcessingInfo,
    CodesProcessor,
    StreamModel,
)


@MULTIMODAL_REGISTRY.register_processor(
    CodesProcessor, info=CodesProcessingInfo, dummy_inputs=CodesDummyInputsBuilder
)
class CsmForConditionalGeneration(StreamModel):
    backbone_name = "backbone_model"
    has_depth_decoder = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config  # vocab_size: the text vocabulary (hf_overrides)
        self.config = config
        spec = csm_spec(config.to_dict())
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
        self.make_stream_runtime(spec, vllm_config, self.lm_head.weight.device)
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
        no text head: the runtime makes the primary logits one-hot on the ruled token.
        On CUDA the whole frame (backbone head, depth decoder, sampling) is one graph replay."""
        runtime = self.stream_runtime
        first = runtime.sample_codebook(self.lm_head(hidden_states), 0)
        depth_sampler = runtime.codebook_sampler(depth=True, streams=range(1, self.spec.num_codebooks))
        frame = self.depth_decoder.decode_frame(hidden_states, first, depth_sampler)
        return runtime.ruled(self.config.vocab_size, tokens=frame)

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
