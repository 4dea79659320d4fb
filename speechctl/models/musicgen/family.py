"""MusicGen (transformers' ``MusicgenForConditionalGeneration``, as published at
facebook/musicgen-small): its stream layout read from the published config, its CFG convention,
and its EnCodec codec, which lives inside the checkpoint (``audio_encoder.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speechctl.engine.params import Guidance
from speechctl.engine.end_rules import EndRules
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.models.family import CfgConvention, CodecLocation, Family, GenerationDefaults, sampling_from

# The primary stream is control tokens (MusicGen has no text stream): small ids, inside any
# tokenizer's and the decoder's vocabulary, none of them an end-of-text id vLLM stops at.
FRAME_ID, START_ID, STOP_ID = 0, 2, 3


def musicgen_spec(config: Mapping[str, Any]) -> StreamSpec:
    """MusicGen (transformers' ``MusicgenConfig``): K codebooks of 2048 codes with delays
    0..K-1 after the decoder's start frame, BOS = PAD = 2048 (the decoder embeds 2049 ids); no
    codebook samples an end: the audio is ``max_frames`` frames long, each codebook takes PAD
    after its last code, and the request stops with the last codebook's last code
    (``EndRules(end_token=False, stop_offset=-1)``). Its EOS (2049) is nominal: a layout needs
    one, MusicGen never takes it."""
    try:
        decoder = config["decoder"]
        K, codes = int(decoder["num_codebooks"]), int(decoder["vocab_size"])
        if int(decoder.get("audio_channels", 1)) != 1:
            raise ValueError("stereo MusicGen (audio_channels 2) is not supported")
        pad = int(decoder["pad_token_id"])
        pattern = DelayPattern(tuple(range(K)), codes, bos_id=pad, eos_id=codes + 1, pad_id=pad, vocab=codes + 2)
        return StreamSpec(pattern=pattern, bos_id=START_ID, eos_id=STOP_ID, pad_id=FRAME_ID, audio_bos_id=START_ID,
                          audio_id=FRAME_ID, audio_eos_id=STOP_ID, rules=EndRules(end_token=False, stop_offset=-1),
                          prompt_streams=True)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"invalid MusicGen config: {e}") from None


def musicgen_hf_config(config):
    """vLLM's view of a MusicGen config (``hf_overrides``): its decoder is the text config vLLM
    sizes the engine by (transformers' ``get_text_config()`` finds both the T5 and the decoder
    config and refuses to choose), and a decoder start token vLLM asks for."""
    from speechctl.models.musicgen.hf_config import MusicgenStreamConfig

    config.__class__ = MusicgenStreamConfig
    config.decoder_start_token_id = START_ID
    return config


class Musicgen(Family):
    name = "musicgen"
    title = "MusicGen"
    description = ("MusicGen (facebook/musicgen-small): T5 text encoder, audio decoder with cross-attention, "
                   "4 EnCodec codebooks with delays, CFG by default; EnCodec 32 kHz (inside the checkpoint)")
    architecture = "MusicgenForConditionalGeneration"
    model_class = "speechctl.models.musicgen.model:MusicgenForConditionalGeneration"
    prompts = "speechctl.models.musicgen.prompts:MusicgenPrompts"
    cfg = CfgConvention(above_one=True)  # l_u + g·(l_c − l_u), guided only above 1

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        return musicgen_spec(config)

    def context_limit(self, config: Mapping[str, Any]) -> int:
        return int(config["decoder"].get("max_position_embeddings") or 2048)

    def encoder_positions(self, config: Mapping[str, Any]) -> int:
        return int(config["text_encoder"].get("n_positions") or 512)  # T5's (its relative positions have no limit)

    def hf_overrides(self, config: Mapping[str, Any]):
        return musicgen_hf_config

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        return CodecLocation(path, "inside the checkpoint (audio_encoder.*, EnCodec)")

    def decoder_config(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        return config["decoder"]

    def codec_config(self, codec_config: Mapping[str, Any]) -> Mapping[str, Any]:
        return codec_config.get("audio_encoder") or codec_config

    def defaults(self, generation: dict | None, config: Mapping[str, Any] | None = None) -> GenerationDefaults:
        """Its sampling, its CFG (``guidance_scale``) and its length as MusicGen's ``generate``
        counts it (measured on transformers 5.19): ``max_new_tokens`` N steps after the start
        frame make N + 1 − K frames, and so does ``max_length`` N (its generate adds the start
        frame): facebook/musicgen-small's 1500 are 1497 frames, 29.9 s."""
        if generation is None:
            return GenerationDefaults()
        scale = generation.get("guidance_scale")
        guidance = Guidance(scale=float(scale), streams="audio") if scale and scale > 1 else None
        K = int(config["decoder"]["num_codebooks"]) if config else 4
        frames = None
        if generation.get("max_new_tokens"):
            frames = int(generation["max_new_tokens"]) + 1 - K
        elif generation.get("max_length"):
            frames = int(generation["max_length"]) + 1 - K
        return GenerationDefaults(audio=sampling_from(generation), guidance=guidance, source="generation_config.json",
                                  max_frames=frames if frames and frames > 0 else None)


FAMILY = Musicgen()
