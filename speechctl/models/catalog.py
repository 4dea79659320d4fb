"""Which models speechctl knows: built-in names and checkpoint directories."""

from __future__ import annotations

import json
from pathlib import Path

from speechctl.asr.checkpoint import BUILTIN as WHISPER_BUILTIN
from speechctl.errors import ModelError
from speechctl.models.families import FAMILIES, open_checkpoint
from speechctl.models.family import Checkpoint
from speechctl.models.text_lm import TINY_LM, TINY_LM_DESCRIPTION

DEFAULT_MODEL = "tiny"
BUILTIN = {
    "tiny": "random weights from a fixed seed: a 2-layer Llama, 4 DAC codebooks at 50 frames/s; "
    "exercises the whole pipeline but does not speak",
    **WHISPER_BUILTIN,  # real ASR weights, run by speechctl/asr/ (not a speech LM)
    TINY_LM: TINY_LM_DESCRIPTION,  # a text LM: the response stage of `speechctl chat`
}


def resolve_model(name: str | None) -> Path:
    """A built-in name (created on first use) or a checkpoint directory -> its directory."""
    return resolve_checkpoint(name).path


def resolve_checkpoint(name: str | None) -> Checkpoint:
    """A built-in name (created on first use) or a checkpoint directory -> the checkpoint, its
    family known; ModelError naming what is wrong."""
    name = name or DEFAULT_MODEL
    if name in WHISPER_BUILTIN:
        raise ModelError(f"{name} is a Whisper ASR model: it runs `speechctl asr` and ASR batch items, not TTS")
    if name == TINY_LM:
        raise ModelError(f"{name} is a text LM: it answers in `speechctl chat` (--lm-model), it does not speak")
    if name == "tiny":
        from speechctl.models.tiny import ensure_tiny

        return open_checkpoint(ensure_tiny())
    path = Path(name).expanduser()
    if not path.is_dir():
        known = ", ".join(BUILTIN)
        raise ModelError(f"unknown model '{name}': not a built-in name ({known}) and not a directory")
    return open_checkpoint(path)


def codec_sample_rate(checkpoint: Checkpoint) -> int:
    """The waveform rate the checkpoint's codec takes, read from its config (no model load)."""
    config_file = checkpoint.codec_dir / "config.json"
    try:
        config = json.loads(config_file.read_text())
        config = config.get("codec_config") or config  # CSM: the codec's config inside the model's
        return int(config.get("sampling_rate") or config["sample_rate"])  # DAC, Mimi / Higgs tokenizer
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{config_file}: no usable codec config ({e})") from None


def describe_model(name: str | None) -> dict:
    """A summary of a model: architecture, backbone shape, streams and codec."""
    from speechctl.asr.checkpoint import describe as describe_whisper, is_whisper

    if name is not None and is_whisper(name):
        return describe_whisper(name)
    if name == TINY_LM:
        from speechctl.models.text_lm import describe_text_lm

        return describe_text_lm(name)
    checkpoint = resolve_checkpoint(name)
    config, pattern = checkpoint.config, checkpoint.spec.pattern
    info = {
        "name": name or DEFAULT_MODEL,
        "path": str(checkpoint.path),
        "architecture": checkpoint.architecture,
        "family": checkpoint.family.name,
        "backbone": config.get("model_type"),
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "heads": f"{config.get('num_attention_heads')}/{config.get('num_key_value_heads')}",
        "text_vocab": config.get("text_vocab_size") or config.get("vocab_size"),  # CSM: vocab_size is a codebook's
        "codebooks": pattern.num_streams,
        "codebook_size": pattern.codebook_size,
        "delays": list(pattern.delays),
        "dtype": config.get("dtype") or config.get("torch_dtype"),
    }
    codec_config = checkpoint.codec_dir / "config.json"
    if codec_config.is_file():
        codec = json.loads(codec_config.read_text())
        codec = codec.get("codec_config") or codec  # CSM: the codec's config inside the model's
        info["codec"] = codec.get("model_type")
        info["sample_rate"] = codec.get("sampling_rate") or codec.get("sample_rate")
    if info["name"] in BUILTIN:
        info["description"] = BUILTIN[info["name"]]
    return info


def list_models() -> list[dict]:
    """Built-in names, then the architectures a checkpoint directory may have (--model DIR)."""
    builtin = [{"name": name, "description": text} for name, text in BUILTIN.items()]
    return builtin + [{"name": f"DIR: {arch}", "description": f.description} for arch, f in FAMILIES.items()]
