"""The Family interface: everything the engine, the API, the catalog and the CLI need to know about
a model architecture, and ``Checkpoint``, a family bound to one checkpoint directory.

    checkpoint = open_checkpoint("path/to/ckpt")      # speechctl.models.families
    checkpoint.spec                 # the stream layout (StreamSpec)
    checkpoint.prompt_builder(tok)  # its prompt format: tts / asr / reading audio back
    checkpoint.model_class          # the vLLM model, "module:Class"
    checkpoint.codec_dir            # where its codec lives
    checkpoint.defaults             # its generation defaults
    checkpoint.guidance(g)          # a user's CFG request in the family's convention

A family is one subclass instance per architecture (``models/<family>/family.py``); this module
and those import neither torch nor vLLM, so ``speechctl models`` and the CLI stay light.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from speechctl.engine.params import DEFAULT_AUDIO, DEFAULT_TEXT, Guidance, Sampling
from speechctl.engine.streams import StreamSpec
from speechctl.errors import InputError, ModelError


@dataclass(frozen=True)
class GenerationDefaults:
    """What a request of this checkpoint uses where the caller sets nothing."""

    text: Sampling = DEFAULT_TEXT
    audio: Sampling = DEFAULT_AUDIO
    depth: Sampling | None = None  # a depth decoder's codebooks; None: as ``audio``
    max_seconds: float = 20.0


@dataclass(frozen=True)
class CfgConvention:
    """How a family's reference defines classifier-free guidance, in speechctl's terms: the
    runtime merges ``l_u + s·(l_c − l_u)``; a reference that writes ``l_c + g·(l_c − l_u)`` (Dia)
    has ``scale_offset`` 1 (s = g + 1)."""

    scale_offset: float = 0.0


class Family:
    """One architecture. Subclasses set the class attributes and override what differs."""

    name: str  # short id ("multistream", "higgs_audio_v2", "csm")
    title: str  # for messages ("Higgs Audio v2")
    description: str
    architecture: str  # config.json's "architectures" entry
    model_class: str  # the vLLM model, "module:Class" (registered lazily by string)
    prompts: str  # the prompt builder, "module:Class": Class(spec, tokenizer)
    cfg: CfgConvention | None = None  # None: the reference generates without guidance

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        raise NotImplementedError

    def codec_dir(self, path: Path, config: Mapping[str, Any]) -> Path:
        """The directory of the checkpoint's codec (it may not exist: the caller reports that)."""
        return path / "codec"

    def hf_overrides(self, config: Mapping[str, Any]) -> dict:
        """config.json fields vLLM must see differently (``EngineArgs.hf_overrides``)."""
        return {}

    def defaults(self, path: Path, config: Mapping[str, Any]) -> GenerationDefaults:
        return GenerationDefaults()

    def prompt_builder(self, spec: StreamSpec, tokenizer):
        module, name = self.prompts.split(":")
        return getattr(importlib.import_module(module), name)(spec, tokenizer)


@dataclass(frozen=True)
class Checkpoint:
    """A family bound to a checkpoint directory: what speechctl reads from it."""

    path: Path
    config: Mapping[str, Any] = field(repr=False)
    family: Family

    @cached_property
    def spec(self) -> StreamSpec:
        try:
            return self.family.spec(self.config)
        except ValueError as e:
            raise ModelError(f"{self.path}: {e}") from None

    @property
    def architecture(self) -> str:
        return self.family.architecture

    @property
    def model_class(self) -> str:
        return self.family.model_class

    @cached_property
    def codec_dir(self) -> Path:
        return self.family.codec_dir(self.path, self.config)

    @property
    def hf_overrides(self) -> dict:
        return self.family.hf_overrides(self.config)

    @cached_property
    def defaults(self) -> GenerationDefaults:
        return self.family.defaults(self.path, self.config)

    def prompt_builder(self, tokenizer):
        return self.family.prompt_builder(self.spec, tokenizer)

    def guidance(self, requested: Guidance) -> Guidance:
        """A caller's guidance (its ``scale`` in the family's own convention, e.g. ``--cfg 3``)
        as the runtime merges it; off stays off."""
        if not requested.enabled:
            return requested
        if self.family.cfg is None:
            raise InputError(f"{self.family.title} has no classifier-free guidance (its reference generates without it)")
        return replace(requested, scale=requested.scale + self.family.cfg.scale_offset)


def read_config(path: Path) -> dict[str, Any]:
    """config.json of a checkpoint directory; ModelError naming the file if it is not one."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    try:
        return json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{config_file}: unreadable config ({e})") from None
