"""Model families: what the engine, the API and the catalog need to know about an architecture.

A checkpoint's family is chosen by the architecture in its config.json. The vLLM model class is
registered from ``speechctl.models.ARCHITECTURES``; this module adds, per architecture, how to
read the stream layout from the published config, which prompt builder speaks its prompt format,
and where its codec lives. It imports neither torch nor vLLM (``speechctl models`` stays light);
prompt builders are named by string and imported on use.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speechctl.engine.streams import DelayPattern, EndRules, StreamSpec


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    spec: Callable[[Mapping[str, Any]], StreamSpec]  # config.json as a dict -> streams
    prompts: str  # "module:Class" of the prompt builder: Class(spec, tokenizer)
    codec_dirs: tuple[str, ...]  # subdirectories of the checkpoint that may hold the codec
    # config.json fields vLLM must see differently (EngineArgs.hf_overrides), from config.json
    hf_overrides: Callable[[Mapping[str, Any]], dict] | None = None

    def prompt_builder(self, spec: StreamSpec, tokenizer):
        module, name = self.prompts.split(":")
        return getattr(importlib.import_module(module), name)(spec, tokenizer)


def multistream_spec(config: Mapping[str, Any]) -> StreamSpec:
    """The generic family keeps its layout in a ``speechctl`` section of config.json."""
    return StreamSpec.from_dict(config.get("speechctl") or {})


def higgs_audio_v2_spec(config: Mapping[str, Any]) -> StreamSpec:
    """Higgs Audio v2 (transformers' ``HiggsAudioV2Config``): K codebooks with delays 1..K (the
    first generated frame is all BOS), a stream vocabulary of ``codebook_size`` tokens whose
    last two are the stream BOS/EOS (1024/1025 of 1026), EOS repeated after a stream's end.
    Primary stream: ``<|AUDIO_OUT|>`` per frame, the delay token once a stream has ended, and
    ``eos_token_id`` (which stops the request) when all have. See models/higgs_audio_v2.py."""
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


def csm_spec(config: Mapping[str, Any]) -> StreamSpec:
    """CSM (transformers' ``CsmConfig``): K codebooks (32) with no delay, each sampled over its
    whole vocabulary (``depth_decoder_config.vocab_size``: 2051 = Mimi's 2048 codes + 3; vLLM sees
    the text vocabulary as ``vocab_size``, see ``csm_hf_overrides``). No stream ends by a token:
    generation ends with the first frame whose codebooks but the last are all
    ``codebook_eos_token_id`` (``EndRules(eos_frame=0)``), so the layout's BOS/EOS/PAD (2048-2050)
    carry no rule; the end step ``DelayPattern.build`` appends to a context turn's codes is
    embedded as CSM's end frame (all codes 0, its ``<|audio_eos|>``). Primary stream:
    ``<|AUDIO|>`` per frame, ``<|audio_eos|>`` at the last. See models/csm.py."""
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


FAMILIES: dict[str, Family] = {
    "SpeechctlMultiStreamLM": Family(
        name="multistream",
        description="generic multi-stream LM (speechctl's own layout; `tiny`)",
        spec=multistream_spec,
        prompts="speechctl.models.prompts:MultiStreamPrompts",
        codec_dirs=("codec",),
    ),
    "HiggsAudioV2ForConditionalGeneration": Family(
        name="higgs_audio_v2",
        description="Higgs Audio v2 (bosonai/higgs-audio-v2-generation-3B-base): Llama-3 + DualFFN, "
        "8 codebooks, delay pattern, higgs_audio_v2_tokenizer codec",
        spec=higgs_audio_v2_spec,
        prompts="speechctl.models.higgs_prompts:HiggsAudioV2Prompts",
        codec_dirs=("audio_tokenizer", "codec"),
    ),
    "CsmForConditionalGeneration": Family(
        name="csm",
        description="CSM (sesame/csm-1b): Llama backbone for codebook 0, depth decoder for the other 31, "
        "Mimi codec (inside the checkpoint)",
        spec=csm_spec,
        prompts="speechctl.models.csm_prompts:CsmPrompts",
        codec_dirs=(".",),  # the checkpoint itself holds the codec (codec_model.*)
        hf_overrides=csm_hf_overrides,
    ),
}


def as_dict(config) -> dict[str, Any]:
    """config.json as a dict, from a dict or a transformers config object."""
    return dict(config) if isinstance(config, Mapping) else config.to_dict()


def family_of(config) -> Family:
    """The family of a checkpoint's config (dict or transformers config); ValueError if none."""
    config = as_dict(config)
    for arch in config.get("architectures") or []:
        if arch in FAMILIES:
            return FAMILIES[arch]
    known = ", ".join(FAMILIES)
    raise ValueError(f"architecture {config.get('architectures') or 'missing'} is not supported ({known})")


def stream_spec(config) -> StreamSpec:
    """The stream layout of a checkpoint's config (dict or transformers config)."""
    return family_of(config).spec(as_dict(config))


def read_model_config(model_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())
