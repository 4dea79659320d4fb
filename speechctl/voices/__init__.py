"""speechctl's own voice: the speech LM and codec that ``recipes/voice`` trains from espeak-ng
speech (issue 20), shipped inside the package as ``speechctl/voices/default/`` (the directory
``python -m recipes.voice export`` writes) and used when no ``--model`` is given.

``make install`` puts it there (``python -m recipes.voice ship-kept``: the newest LM and codec kept
in the repository's history, exported); the weights stay out of the repository's tree. An install
without them (no git history), or where the voice cannot run (it reads espeak-ng's phonemes and
espeak-ng is missing), falls back to the random ``tiny``, and says why: see
``speechctl.models.catalog.default_model`` and ``unavailable``."""

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


def unavailable(path: Path | None = None) -> str | None:
    """Why the voice at ``path`` (default: the package's) cannot speak here, in a few words for a
    notice; None when it can."""
    path = voice_dir() if path is None else path
    if not is_shipped(path):
        return f"speechctl's own voice is not in this install ({path} holds no weights: make install puts it there)"
    try:
        reads = json.loads((path / "config.json").read_text()).get("speechctl", {}).get("text_input", "text")
    except (OSError, ValueError):
        return f"speechctl's own voice has an unreadable config.json ({path})"
    if reads == "phonemes":
        from speechctl import phonemes

        return phonemes.missing()
    return None


def provenance(path: Path | None = None) -> dict:
    """What made the voice (``speechctl.json``, written by the recipe's export): recipe, data
    hashes, training runs, licences; {} when absent."""
    record = (voice_dir() if path is None else path) / "speechctl.json"
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
