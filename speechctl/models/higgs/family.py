"""Higgs Audio v2 (transformers' ``HiggsAudioV2ForConditionalGeneration``, as published at
bosonai/higgs-audio-v2-generation-3B-base): its stream layout read from the published config, and
where its codec (the Higgs audio tokenizer) lives."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speechctl.engine.end_rules import EndRules
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.models.family import CodecLocation, Family, processor_codec


def higgs_audio_v2_spec(config: Mapping[str, Any]) -> StreamSpec:
    """Higgs Audio v2 (transformers' ``HiggsAudioV2Config``): K codebooks with delays 1..K (the
    first generated frame is all BOS), a stream vocabulary of ``codebook_size`` tokens whose
    last two are the stream BOS/EOS (1024/1025 of 1026), EOS repeated after a stream's end.
    Primary stream: ``<|AUDIO_OUT|>`` per frame, the delay token once a stream has ended, and
    ``eos_token_id`` (which stops the request) when all have. See higgs/model.py."""
    try:
        K, vocab = int(config["num_codebooks"]), int(config["codebook_size"])
        bos, eos = int(config["audio_stream_bos_id"]), int(config["audio_stream_eos_id"])
        eos_token = config["eos_token_id"]
        eos_token = int(eos_token[0] if isinstance(eos_token, (list, tuple)) else eos_token)
        pattern = DelayPattern(tuple(range(1, K + 1)), min(bos, eos), bos_id=bos, eos_id=eos, pad_id=eos, vocab=vocab)
        return StreamSpec(
            pattern=pattern,
            bos_id=int(config["bos_token_id"]),
            eos_id=eos_token,
            pad_id=int(config["pad_token_id"]),
            audio_bos_id=int(config["audio_bos_token_id"]),
            audio_id=int(config["audio_token_id"]),
            audio_eos_id=eos_token,
            rules=EndRules(eos_lag=1, open_vocab=True),
            audio_flush_id=int(config["audio_delay_token_id"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"invalid Higgs Audio v2 config: {e}") from None


class HiggsAudioV2(Family):
    name = "higgs_audio_v2"
    title = "Higgs Audio v2"
    description = ("Higgs Audio v2 (bosonai/higgs-audio-v2-generation-3B-base): Llama-3 + DualFFN, "
                   "8 codebooks, delay pattern, higgs_audio_v2_tokenizer codec")
    architecture = "HiggsAudioV2ForConditionalGeneration"
    model_class = "speechctl.models.higgs.model:HiggsAudioV2ForConditionalGeneration"
    prompts = "speechctl.models.higgs.prompts:HiggsAudioV2Prompts"

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        return higgs_audio_v2_spec(config)

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        """``audio_tokenizer/`` or ``codec/`` inside the checkpoint, else what
        ``audio_tokenizer_config.json`` or ``processor_config.json`` names (transformers' processor
        reads those): a local directory, or a hub id resolved through the Hugging Face cache."""
        return processor_codec(path, ("audio_tokenizer", "codec"))


FAMILY = HiggsAudioV2()
