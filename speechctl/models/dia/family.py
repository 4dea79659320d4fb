"""Dia (transformers' ``DiaForConditionalGeneration``, as published at nari-labs/Dia-1.6B-0626):
its stream layout and rules read from the published config, its CFG convention, and where its
codec (DAC 44.1 kHz, not in the repository) lives."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speechctl.engine.params import Guidance, Sampling
from speechctl.engine.end_rules import EndRules
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.models.family import TRANSFORMERS_DEFAULTS, CfgConvention, CodecLocation, Family, GenerationDefaults, processor_codec, sampling_from

DIA_CODEC = "descript/dac_44khz"  # what DiaProcessor's audio tokenizer is loaded from
FRAME_ID = 0  # the primary stream's token of a frame (Dia has no text stream)


def dia_spec(config: Mapping[str, Any]) -> StreamSpec:
    """Dia (transformers' ``DiaConfig``): 9 channels of 1028 tokens (1024 codes, EOS 1024, PAD
    1025, BOS 1026) with delays ``delay_pattern`` after the decoder's all-BOS start frame.
    transformers' logits processors as rules: only channel 0 may end, and only where EOS is its
    top choice (then it must: the EOS channel filter); channel c takes EOS ``delay[c]`` steps
    after channel 0's, then PAD; the request stops at the last channel's EOS
    (``EndRules(eos_if_top=True, stop_offset=0)``). Primary stream: ``FRAME_ID`` per frame, the
    decoder's EOS id at the last step (which stops the request), BOS as the start frame's."""
    try:
        decoder = config["decoder_config"]
        bos, eos, pad = int(decoder["bos_token_id"]), int(decoder["eos_token_id"]), int(decoder["pad_token_id"])
        delays = tuple(int(d) for d in config["delay_pattern"])
        if len(delays) != int(decoder["num_channels"]):
            raise ValueError(f"delay_pattern has {len(delays)} channels, num_channels {decoder['num_channels']}")
        pattern = DelayPattern(delays, eos, bos_id=bos, eos_id=eos, pad_id=pad, vocab=int(decoder["vocab_size"]))
        return StreamSpec(pattern=pattern, bos_id=bos, eos_id=eos, pad_id=pad, audio_bos_id=bos, audio_id=FRAME_ID,
                          audio_eos_id=eos, rules=EndRules(eos_if_top=True, stop_offset=0), prompt_streams=True)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"invalid Dia config: {e}") from None


class Dia(Family):
    name = "dia"
    title = "Dia"
    description = ("Dia (nari-labs/Dia-1.6B-0626): byte-text encoder, audio decoder with cross-attention, 9 DAC "
                   "channels with delays, CFG by default; DAC 44.1 kHz codec (descript/dac_44khz)")
    architecture = "DiaForConditionalGeneration"
    model_class = "speechctl.models.dia.model:DiaForConditionalGeneration"
    prompts = "speechctl.models.dia.prompts:DiaPrompts"
    cfg = CfgConvention(scale_offset=1.0, above_one=True, filter_top_k=True)  # l_c + g·(l_c − l_u), top-k filter

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        return dia_spec(config)

    def context_limit(self, config: Mapping[str, Any]) -> int:
        return int(config["decoder_config"].get("max_position_embeddings") or 3072)

    def decoder_config(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        return config["decoder_config"]

    def encoder_positions(self, config: Mapping[str, Any]) -> int:
        return int(config["encoder_config"].get("max_position_embeddings") or 1024)

    def hf_overrides(self, config: Mapping[str, Any]) -> dict:
        # vLLM asks for a decoder start token even where the prompt brings its own (the BOS frame)
        return {"decoder_start_token_id": int(config["decoder_config"]["bos_token_id"])}

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        """``codec/`` or ``audio_tokenizer/`` in the checkpoint, else what
        ``audio_tokenizer_config.json`` (nari-labs/Dia-1.6B-0626's) or ``processor_config.json``
        names, else DAC 44.1 kHz by its hub id, from the Hugging Face cache."""
        return processor_codec(path, ("codec", "audio_tokenizer"), DIA_CODEC)

    def defaults(self, generation: dict | None, config: Mapping[str, Any] | None = None) -> GenerationDefaults:
        """Its sampling (a temperature below 1 raised to 1, as Dia's generate does), its CFG
        (``guidance_scale`` with the CFG filter at its ``top_k``) and its length as Dia's
        ``generate`` counts it (measured on transformers 5.19): ``max_new_tokens`` N steps after
        the start frame hold N − max(delays) − 1 frames; ``max_length`` L, which its generate
        extends by max(delays) and by the start frame, L − 1."""
        if generation is None:
            return GenerationDefaults()
        audio = sampling_from(generation)
        if 0 < audio.temperature < 1:
            audio = Sampling(1.0, audio.top_k, audio.top_p)
        scale = generation.get("guidance_scale")
        top_k = int(generation.get("top_k") or TRANSFORMERS_DEFAULTS["top_k"])
        guidance = Guidance(scale=float(scale), streams="audio", top_k=top_k) if scale and scale > 1 else None
        delay = max(config["delay_pattern"]) if config else 15
        frames = None
        if generation.get("max_new_tokens"):
            frames = int(generation["max_new_tokens"]) - delay - 1
        elif generation.get("max_length"):
            frames = int(generation["max_length"]) - 1
        return GenerationDefaults(audio=audio, guidance=guidance, source="generation_config.json",
                                  max_frames=frames if frames and frames > 0 else None)


FAMILY = Dia()
