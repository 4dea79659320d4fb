"""Load a codec checkpoint directory by the ``model_type`` in its ``config.json``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch

from .base import Codec, codec_compile_mode, compile_decoder, decode_graphs_enabled, fuse_snakes

# model_type -> "module:class", imported only when used (each family pulls in its own model code).
CODEC_CLASSES: dict[str, str] = {
    "dac": "speechctl.codecs.dac:DacCodec",
    "higgs_audio_v2_tokenizer": "speechctl.codecs.higgs:HiggsAudioV2Codec",
    "mimi": "speechctl.codecs.mimi:MimiCodec",
    "csm": "speechctl.codecs.mimi:MimiCodec",  # a CSM checkpoint holds its Mimi (codec_model.*)
    "encodec": "speechctl.codecs.encodec:EncodecCodec",
    "musicgen": "speechctl.codecs.encodec:EncodecCodec",  # a MusicGen checkpoint holds its EnCodec (audio_encoder.*)
}


def codec_model_type(path: str | Path) -> str:
    """The ``model_type`` of the codec checkpoint directory ``path`` (from ``path/config.json``)."""
    config_path = Path(path) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: not a codec checkpoint (no config.json)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path}: not valid JSON ({error})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str):
        raise ValueError(f"{config_path}: no model_type")
    return model_type


def load_codec(path: str | Path, device: str | torch.device = "cpu", leave_free_bytes: int = 0, **options) -> Codec:
    """Load the codec in checkpoint directory ``path`` onto ``device``, in eval mode.

    ``options`` go to the codec class (for example ``max_batch_frames``). On CUDA part of its
    decode is compiled (``codec_compile_mode``: its Snakes, or its decoder where asked and named),
    its batches are then fitted to the codec's memory budget (``Codec.fit_to_memory``), and it
    decodes in CUDA graphs where it can (``decode_graphs_enabled``), both within the device's
    free memory less ``leave_free_bytes`` (an engine's room for its steps: ``SpeechEngine.step_room_bytes``).
    Raises ``ValueError`` for a directory without a readable config or an unknown ``model_type``.
    """
    model_type = codec_model_type(path)
    if model_type not in CODEC_CLASSES:
        known = ", ".join(sorted(CODEC_CLASSES))
        raise ValueError(f"{path}: unsupported codec model_type {model_type!r} (supported: {known})")
    module_name, class_name = CODEC_CLASSES[model_type].split(":")
    codec_class = getattr(importlib.import_module(module_name), class_name)
    codec = codec_class(path, device, **options)
    codec.leave_free_bytes = leave_free_bytes
    # (before fit_to_memory: it measures the compiled decode)
    mode = codec_compile_mode(codec)
    if mode == "decoder" and compile_decoder(codec):
        codec.compiled = f"{codec.decoder_module}, whole"
    elif mode != "none" and hasattr(codec, "model") and fuse_snakes(codec.model):
        codec.compiled = "Snake activations"
    codec.fit_to_memory()
    if decode_graphs_enabled(codec):
        codec.use_decode_graphs()
    return codec
