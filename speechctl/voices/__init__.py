"""speechctl's own voice: the speech LM and codec that ``recipes/voice`` trains from espeak-ng
speech (issue 20), shipped inside the package as ``speechctl/voices/default/`` (the directory
``python -m recipes.voice export`` writes) and used when no ``--model`` is given.

An install whose ``default/`` holds no weights (a checkout from before they were trained) falls
back to the random ``tiny``, and says so: see ``speechctl.models.catalog.default_model``."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

VOICE = "voice"


def voice_dir() -> Path:
    """Where the shipped voice lives inside the installed package."""
    return Path(str(files(__name__) / "default"))


def is_shipped(path: Path | None = None) -> bool:
    """Whether ``path`` (default: the package's voice) holds a complete voice: the LM's config and
    weights and its codec."""
    path = voice_dir() if path is None else path
    return all((path / name).is_file() for name in ("config.json", "model.safetensors", "codec/config.json",
                                                    "codec/model.safetensors"))


def provenance(path: Path | None = None) -> dict:
    """What made the voice (``speechctl.json``, written by the recipe's export): recipe, data
    hashes, training runs, licences; {} when absent."""
    record = (voice_dir() if path is None else path) / "speechctl.json"
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
