"""Which models speechctl knows: built-in names and checkpoint directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import speechctl.models.hub as hub
from speechctl.asr.checkpoint import BUILTIN as WHISPER_BUILTIN, is_whisper_dir
from speechctl.errors import ModelError
from speechctl.models.families import FAMILIES, open_checkpoint
from speechctl.models.family import Checkpoint
from speechctl.models.text_lm import TINY_LM, TINY_LM_DESCRIPTION
import speechctl.voices as voices
from speechctl.voices import VOICE

BUILTIN = {
    VOICE: "speechctl's own voice: a small speech LM and 16 kHz codec trained on espeak-ng speech "
    "(recipes/voice); the default where installed",
    "tiny": "random weights from a fixed seed: a 2-layer Llama, 4 DAC codebooks at 50 frames/s; "
    "exercises the whole pipeline but does not speak",
    **WHISPER_BUILTIN,  # real ASR weights, run by speechctl/asr/ (not a speech LM)
    TINY_LM: TINY_LM_DESCRIPTION,  # a text LM: the response stage of `speechctl chat`
}


def default_model() -> str:
    """The model used when none is named: ``$SPEECHCTL_MODEL`` if set, else speechctl's own
    voice where this install ships it and it can run (``voices.unavailable``), else the random
    ``tiny`` (whose output is noise, and the CLI says so and why)."""
    return os.environ.get("SPEECHCTL_MODEL") or (VOICE if voices.unavailable() is None else "tiny")


def resolve_model(name: str | None) -> Path:
    """A built-in name (created on first use) or a checkpoint directory -> its directory."""
    return resolve_checkpoint(name).path


def resolve_checkpoint(name: str | None) -> Checkpoint:
    """A built-in name (created on first use) or a checkpoint directory -> the checkpoint, its
    family known; ModelError naming what is wrong."""
    name = name or default_model()
    if name in WHISPER_BUILTIN:
        raise ModelError(f"{name} is a Whisper ASR model: it runs `speechctl asr` and ASR batch items, not TTS")
    if name == TINY_LM:
        raise ModelError(f"{name} is a text LM: it answers in `speechctl chat` (--lm-model), it does not speak")
    if name == "tiny":
        from speechctl.models.tiny import ensure_tiny

        return open_checkpoint(ensure_tiny(), name)
    if name == VOICE:
        if not voices.is_shipped():
            raise ModelError(f"{VOICE}: speechctl's own voice is not in this install ({voices.voice_dir()} holds no weights); "
                             "train it with recipes/voice, or use --model tiny or a checkpoint")
        return open_checkpoint(voices.voice_dir(), name)
    path = Path(name).expanduser()
    if path.is_dir():
        return _speech_lm(path)
    if hub.is_hub_id(name):
        return _from_hub(name)
    known = ", ".join(BUILTIN)
    raise ModelError(f"unknown model '{name}': not a built-in name ({known}), a directory or a hub id (ORG/NAME)")


def _speech_lm(path: Path, name: str | None = None) -> Checkpoint:
    """The checkpoint at ``path`` (called ``name``: a hub id); a Whisper checkpoint is named for
    what it is, not refused as an unknown family."""
    if is_whisper_dir(path):
        raise ModelError(f"{name or path} is a Whisper ASR model: it runs `speechctl asr` and ASR batch items, not TTS")
    return open_checkpoint(path, name)


def _from_hub(name: str) -> Checkpoint:
    """A checkpoint named by hub id: its snapshot in the Hugging Face cache, with only what it
    needs fetched where downloads are allowed (``hub.checkpoint_snapshot``)."""
    checkpoint = _speech_lm(hub.checkpoint_snapshot(name), name)
    try:
        checkpoint.weights
    except ModelError as e:
        repo, revision = hub.split_hub_id(name)
        raise ModelError(f"{e}; fetch it with `{hub.download_command(repo, revision)}`") from None
    return checkpoint


def codec_sample_rate(checkpoint: Checkpoint) -> int:
    """The waveform rate the checkpoint's codec takes, read from its config (no model load)."""
    config_file = checkpoint.codec_dir / "config.json"
    try:
        config = checkpoint.family.codec_config(json.loads(config_file.read_text()))
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
    decoder = checkpoint.family.decoder_config(config)  # an encoder-decoder family's decoder
    info = {
        "name": name or default_model(),
        "path": str(checkpoint.path),
        "architecture": checkpoint.architecture,
        "family": checkpoint.family.name,
        "backbone": config.get("model_type"),
        "layers": decoder.get("num_hidden_layers"),
        "hidden_size": decoder.get("hidden_size"),
        "heads": f"{decoder.get('num_attention_heads')}/{decoder.get('num_key_value_heads') or decoder.get('num_attention_heads')}",
        "text_vocab": None if decoder is not config else config.get("text_vocab_size") or config.get("vocab_size"),  # CSM: vocab_size is a codebook's
        "codebooks": pattern.num_streams,
        "codebook_size": pattern.codebook_size,
        "delays": list(pattern.delays),
        "dtype": config.get("dtype") or config.get("torch_dtype"),
    }
    missing = []
    try:
        weights = checkpoint.weights
        info["weights"] = f"{', '.join(weights.chosen)} (by {weights.rule})"
        info["weights_ignored"] = ", ".join(weights.ignored) or "none"
    except ModelError as e:
        missing.append(str(e))
    try:
        codec = checkpoint.family.codec(checkpoint.path, config)
        codec_config = checkpoint.family.codec_config(json.loads((codec.path / "config.json").read_text()))
        info["codec"] = f"{codec_config.get('model_type')}, {codec.found}: {codec.path}"
        info["sample_rate"] = codec_config.get("sampling_rate") or codec_config.get("sample_rate")
    except ModelError as e:
        missing.append(str(e))
    except (OSError, ValueError) as e:
        missing.append(f"codec: {e}")
    info.update(checkpoint.family.describe(config))  # a family's own lines (AR+NAR: its two stages)
    info["context_limit"] = checkpoint.context_limit
    made = voices.provenance(checkpoint.path)  # a recipes/voice export says what made it
    if made.get("lm"):
        loss = (made["lm"].get("heldout") or {}).get("heldout_loss")
        info["made_by"] = (f"{made.get('made_by', 'recipes/voice')}: LM step {made['lm']['step']:,}"
                           + (f", held-out loss {loss:.3f}" if loss is not None else "")
                           + (f"; kept in this repository's history at {made['kept'][:10]}" if made.get("kept") else "")
                           + (f"; speech by {made['speech']}" if made.get("speech") else ""))
    info["generation_defaults"] = describe_defaults(checkpoint.defaults)
    info["missing"] = "; ".join(missing) or "nothing"
    if info["name"] in BUILTIN:
        info["description"] = BUILTIN[info["name"]]
    return info


def describe_defaults(defaults) -> str:
    def sampling(s):
        if s.temperature == 0:
            return "greedy"
        return f"temperature {s.temperature:g}" + (f", top-k {s.top_k}" if s.top_k else "") + (f", top-p {s.top_p:g}" if s.top_p < 1 else "")

    parts = [f"audio {sampling(defaults.audio)}"]
    if defaults.depth is not None:
        parts.append(f"depth decoder {sampling(defaults.depth)}")
    if defaults.repetition is not None:
        parts.append(f"repetition-aware (window {defaults.repetition.window}, max {defaults.repetition.max_repeat})")
    if defaults.guidance is not None:
        g = defaults.guidance
        parts.append(f"CFG scale {g.scale:g}" + (f" (filter top-k {g.top_k})" if g.top_k else ""))
    if defaults.max_frames is not None:
        parts.append(f"at most {defaults.max_frames} frames")
    source = f" (from {defaults.source})"
    if defaults.max_piece_chars is not None:
        source += f"; text spoken in pieces of at most {defaults.max_piece_chars} characters (config.json)"
    return "; ".join(parts) + source


def list_models() -> list[dict]:
    """Built-in names, then the architectures a checkpoint directory may have (--model DIR)."""
    builtin = [{"name": name, "description": text + ("" if name != VOICE or voices.is_shipped() else " (not in this install)")}
               for name, text in BUILTIN.items()]
    return builtin + [{"name": f"DIR: {arch}", "description": f.description} for arch, f in FAMILIES.items()]
