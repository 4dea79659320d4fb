"""The families speechctl knows, by architecture, and the way in from a checkpoint directory.

    checkpoint = open_checkpoint(path)   # a Family bound to the directory (models/family.py)

Each family lives in its own folder (``generic/``, ``higgs/``, ``csm/``, ``dia/``, ``musicgen/``, ``valle/``: family.py,
model.py, prompts.py, checkpoint.py); this registry imports only their family.py, which import neither
torch nor vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speechctl.engine.streams import StreamSpec
from speechctl.errors import ModelError
from speechctl.models.csm.family import FAMILY as CSM
from speechctl.models.dia.family import FAMILY as DIA
from speechctl.models.musicgen.family import FAMILY as MUSICGEN
from speechctl.models.family import Checkpoint, Family
from speechctl.models.weights import read_config
from speechctl.models.generic.family import FAMILY as MULTISTREAM
from speechctl.models.higgs.family import FAMILY as HIGGS_AUDIO_V2
from speechctl.models.valle.family import FAMILY as VALLE

FAMILIES: dict[str, Family] = {f.architecture: f for f in (MULTISTREAM, HIGGS_AUDIO_V2, CSM, DIA, MUSICGEN, VALLE)}


def as_dict(config) -> dict[str, Any]:
    """config.json as a dict, from a dict or a transformers config object."""
    return dict(config) if isinstance(config, Mapping) else config.to_dict()


def family_of(config) -> Family:
    """The family of a checkpoint's config (dict or transformers config); ValueError if none."""
    config = as_dict(config)
    for arch in config.get("architectures") or []:
        if arch in FAMILIES:
            return FAMILIES[arch]
    raise ValueError(f"architecture {config.get('architectures') or 'missing'} is not supported ({', '.join(FAMILIES)})")


def stream_spec(config) -> StreamSpec:
    """The stream layout of a checkpoint's config (dict or transformers config)."""
    return family_of(config).spec(as_dict(config))


def open_checkpoint(path: str | Path, name: str | None = None) -> Checkpoint:
    """The checkpoint directory ``path`` (called ``name`` by the user: a hub id, a built-in name)
    with its family; ModelError naming what is wrong."""
    path = Path(path)
    config = read_config(path)
    try:
        family = family_of(config)
    except ValueError as e:
        raise ModelError(f"{name or path}: {e}") from None
    return Checkpoint(path, config, family, name)
