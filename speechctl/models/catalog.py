"""Which models speechctl knows: built-in names and checkpoint directories."""

from __future__ import annotations

import json
from pathlib import Path

from speechctl.asr.checkpoint import BUILTIN as WHISPER_BUILTIN
from speechctl.errors import ModelError
from speechctl.models import ARCHITECTURES
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
    name = name or DEFAULT_MODEL
    if name in WHISPER_BUILTIN:
        raise ModelError(f"{name} is a Whisper ASR model: it runs `speechctl asr` and ASR batch items, not TTS")
    if name == TINY_LM:
        raise ModelError(f"{name} is a text LM: it answers in `speechctl chat` (--lm-model), it does not speak")
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
    """Where the model's codec checkpoint lives: the generic family names it in config.json;
    a published family's first subdirectory that exists (Higgs: audio_tokenizer/, codec/), or
    the local directory its processor_config.json points to."""
    from speechctl.models.families import family_of

    config = read_config(path)
    if "speechctl" in config:
        return path / config["speechctl"].get("codec", "codec")
    candidates = [path / d for d in family_of(config).codec_dirs]
    processor = path / "processor_config.json"
    if processor.is_file():
        tokenizer = json.loads(processor.read_text()).get("audio_tokenizer") or {}
        candidates.append(Path(tokenizer.get("audio_tokenizer_name_or_path") or path / "none").expanduser())
    return next((c for c in candidates if (c / "config.json").is_file()), candidates[0])


def codec_sample_rate(path: Path) -> int:
    """The waveform rate the model's codec takes, read from its config (no model load)."""
    config_file = codec_dir(path) / "config.json"
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
    from speechctl.models.families import family_of

    path = resolve_model(name)
    config = read_config(path)
    family = family_of(config)
    pattern = family.spec(config).pattern
    info = {
        "name": name or DEFAULT_MODEL,
        "path": str(path),
        "architecture": config["architectures"][0],
        "family": family.name,
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
    codec_config = codec_dir(path) / "config.json"
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
    from speechctl.models.families import FAMILIES

    builtin = [{"name": name, "description": text} for name, text in BUILTIN.items()]
    return builtin + [{"name": f"DIR: {arch}", "description": f.description} for arch, f in FAMILIES.items()]
