"""CSM (Sesame's Conversational Speech Model, transformers' ``CsmForConditionalGeneration``, as
published at sesame/csm-1b): its stream layout read from the published config; the Mimi codec
lives inside the checkpoint (``codec_model.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speechctl.engine.end_rules import EndRules
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.errors import ModelError
from speechctl.models.family import CodecLocation, Family, GenerationDefaults, sampling_from
from speechctl.models.weights import WeightFiles, tensor_names


def csm_spec(config: Mapping[str, Any]) -> StreamSpec:
    """CSM (transformers' ``CsmConfig``): K codebooks (32) with no delay, each sampled over its
    whole vocabulary (``depth_decoder_config.vocab_size``: 2051 = Mimi's 2048 codes + 3; vLLM sees
    the text vocabulary as ``vocab_size``, see ``csm_hf_overrides``). No stream ends by a token:
    generation ends with the first frame whose codebooks but the last are all
    ``codebook_eos_token_id`` (``EndRules(eos_frame=0)``), so the layout's BOS/EOS/PAD (2048-2050)
    carry no rule; the end step ``DelayPattern.build`` appends to a context turn's codes is
    embedded as CSM's end frame (all codes 0, its ``<|audio_eos|>``). Primary stream:
    ``<|AUDIO|>`` per frame, ``<|audio_eos|>`` at the last. See csm/model.py."""
    try:
        K = int(config["num_codebooks"])
        vocab = int(config["depth_decoder_config"]["vocab_size"])
        codes = int(config["codec_config"]["codebook_size"])
        audio, audio_eos = int(config["audio_token_id"]), int(config["audio_eos_token_id"])
        bos = int(config["bos_token_id"])
        return StreamSpec(
            pattern=DelayPattern((0,) * K, codes, vocab=vocab),
            bos_id=bos,
            eos_id=audio_eos,
            pad_id=int(config["pad_token_id"]),
            audio_bos_id=bos,  # never generated: CSM's prompt ends in text and audio follows
            audio_id=audio,
            audio_eos_id=audio_eos,
            rules=EndRules(eos_frame=int(config["codebook_eos_token_id"])),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"invalid CSM config: {e}") from None


def csm_hf_overrides(config: Mapping[str, Any]) -> dict:
    """CSM's ``vocab_size`` is the codebook vocabulary; vLLM takes the primary stream's width
    from it, and CSM's primary stream is text (``text_vocab_size``)."""
    return {"vocab_size": int(config["text_vocab_size"])}


class Csm(Family):
    name = "csm"
    title = "CSM"
    description = ("CSM (sesame/csm-1b): Llama backbone for codebook 0, depth decoder for the other 31, "
                   "Mimi codec (inside the checkpoint)")
    architecture = "CsmForConditionalGeneration"
    model_class = "speechctl.models.csm.model:CsmForConditionalGeneration"
    prompts = "speechctl.models.csm.prompts:CsmPrompts"

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        return csm_spec(config)

    def weights(self, path: Path, config: Mapping[str, Any]) -> WeightFiles:
        """transformers' copy; a directory that holds only Sesame's original file (names like
        ``backbone.layers.0.attn.q_proj.weight``) is refused with what to fetch."""
        weights = super().weights(path, config)
        first = weights.chosen[0]
        if first.endswith(".safetensors") and any(n.startswith("backbone.layers.") for n in tensor_names(path / first)):
            raise ModelError(f"{path / first}: Sesame's original weight names; speechctl reads transformers' copy "
                             "(config.json's transformers_weights), e.g. `huggingface-cli download sesame/csm-1b "
                             "--include 'transformers*' '*.json'`")
        return weights

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        return CodecLocation(path, "inside the checkpoint (codec_model.*, Mimi)")

    def defaults(self, generation: dict | None, config: Mapping[str, Any] | None = None) -> GenerationDefaults:
        """Codebook 0's sampling; the depth decoder's from the ``depth_decoder_*`` fields (which
        transformers moves onto the depth decoder's own generation config, greedy where unset);
        ``max_new_tokens`` frames."""
        if generation is None:
            return GenerationDefaults()
        prefix = "depth_decoder_"
        depth = {k[len(prefix):]: v for k, v in generation.items() if k.startswith(prefix)}
        frames = generation.get("max_new_tokens")
        return GenerationDefaults(audio=sampling_from(generation), depth=sampling_from(depth),
                                  max_frames=int(frames) if frames else None, source="generation_config.json")

    def hf_overrides(self, config: Mapping[str, Any]) -> dict:
        return csm_hf_overrides(config)


FAMILY = Csm()
