"""Which models speechctl knows: built-in names and checkpoint directories."""

from __future__ import annotations

import json
from pathlib import Path

from speechctl.asr.checkpoint import BUILTIN as WHISPER_BUILTIN
from speechctl.errors import ModelError
from speechctl.models import ARCHITECTURES

DEFAULT_MODEL = "tiny"
BUILTIN = {
    "tiny": "random weights from a fixed seed: a 2-layer Llama, 4 DAC codebooks at 50 frames/s; "
    "exercises the whole pipeline but does not speak",
    **WHISPER_BUILTIN,  # real ASR weights, run by speechctl/asr/ (not a speech LM)
}


def resolve_model(name: str | None) -> Path:
    """A built-in name (created on first use) or a checkpoint directory -> its directory."""
    name = name or DEFAULT_MODEL
    if name in WHISPER_BUILTIN:
        raise ModelError(f"{name} is a Whisper ASR model: it runs `speechctl asr` and ASR batch items, not TTS")
    if name == "tiny":
        from speechctl.models.tiny import ensure_tiny

        return ensure_tiny()
    path = Path(name).expanduser()
    if not path.is_dir():
        known = ", ".join(BUILTIN)
        raise ModelError(f"unknown model '{name}': not a built-in name ({known}) and not a directory")
    read_config(path)  # validates
    return path


def read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{config_file}: unreadable config ({e})") from None
    archs = config.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        supported = ", ".join(ARCHITECTURES)
        raise ModelError(f"{path}: architecture {archs or 'missing'} is not supported ({supported})")
    return config


def codec_dir(path: Path) -> Path:
    return path / read_config(path).get("speechctl", {}).get("codec", "codec")


def codec_sample_rate(path: Path) -> int:
    """The waveform rate the model's codec takes, read from its config (no model load)."""
    config_file = codec_dir(path) / "config.json"
    try:
        return int(json.loads(config_file.read_text())["sampling_rate"])
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{config_file}: no usable codec config ({e})") from None


def describe_model(name: str | None) -> dict:
    """A summary of a model: architecture, backbone shape, streams and codec."""
    from speechctl.asr.checkpoint import describe as describe_whisper, is_whisper

    if name is not None and is_whisper(name):
        return describe_whisper(name)
    path = resolve_model(name)
    config = read_config(path)
    streams = config.get("speechctl", {})
    info = {
        "name": name or DEFAULT_MODEL,
        "path": str(path),
        "architecture": config["architectures"][0],
        "backbone": config.get("model_type"),
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "heads": f"{config.get('num_attention_heads')}/{config.get('num_key_value_heads')}",
        "text_vocab": config.get("vocab_size"),
        "codebooks": len(streams.get("delays", [])),
        "codebook_size": streams.get("codebook_size"),
        "delays": streams.get("delays"),
        "dtype": config.get("dtype") or config.get("torch_dtype"),
    }
    codec_config = codec_dir(path) / "config.json"
    if codec_config.is_file():
        codec = json.loads(codec_config.read_text())
        info["codec"] = codec.get("model_type")
        info["sample_rate"] = codec.get("sampling_rate")
    if info["name"] in BUILTIN:
        info["description"] = BUILTIN[info["name"]]
    return info


def list_models() -> list[dict]:
    return [{"name": name, "description": text} for name, text in BUILTIN.items()]
