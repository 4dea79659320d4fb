"""The Family interface: everything the engine, the API, the catalog and the CLI need to know about
a model architecture, and ``Checkpoint``, a family bound to one checkpoint directory.

    checkpoint = open_checkpoint("path/to/ckpt")      # speechctl.models.families
    checkpoint.spec                 # the stream layout (StreamSpec)
    checkpoint.prompt_builder(tok)  # its prompt format: tts / asr / reading audio back
    checkpoint.model_class          # the vLLM model, "module:Class"
    checkpoint.weights              # the weight files that count (transformers' rule), and those ignored
    checkpoint.engine_dir           # the directory vLLM reads (a view without ignored weights)
    checkpoint.codec                # where its codec lives, and how it was found
    checkpoint.context_limit        # positions the model takes
    checkpoint.defaults             # its generation defaults (generation_config.json)
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
from typing import Any, NamedTuple

from speechctl.engine.params import DEFAULT_AUDIO, DEFAULT_TEXT, NO_GUIDANCE, Guidance, Sampling
from speechctl.engine.streams import StreamSpec
from speechctl.errors import InputError, ModelError
from speechctl.models.weights import WeightFiles, engine_view, is_weight_file, select_weights

DEFAULT_MAX_SECONDS = 20.0

# transformers' values where generation_config.json leaves a field out
# (``GenerationConfig._get_default_generation_params``; tests/test_checkpoints.py checks them)
TRANSFORMERS_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}


class Repetition(NamedTuple):
    """Higgs' repetition-aware sampling: a sampled code that already appears ``max_repeat``
    times among the codebook's last ``window`` steps is drawn again from the raw distribution."""

    window: int
    max_repeat: int


@dataclass(frozen=True)
class GenerationDefaults:
    """What a request of this checkpoint uses where the caller sets nothing."""

    text: Sampling = DEFAULT_TEXT
    audio: Sampling = DEFAULT_AUDIO
    depth: Sampling | None = None  # a depth decoder's codebooks; None: as ``audio``
    max_frames: int | None = None  # None: DEFAULT_MAX_SECONDS of audio
    repetition: Repetition | None = None
    guidance: Guidance | None = None  # classifier-free guidance in the family's convention; None: off
    # The longest piece of text one request speaks (longer text is cut at sentences, then clauses:
    # speechctl.text); None: speechctl's MAX_PIECE_CHARS. A small model that drifts in long
    # sentences reads better in short pieces (docs/voice/lm-progress.md).
    max_piece_chars: int | None = None
    source: str = "speechctl's defaults"


@dataclass(frozen=True)
class CodecLocation:
    path: Path
    found: str  # how: "codec/ in the checkpoint", "hub id ... in processor_config.json", ...


@dataclass(frozen=True)
class CfgConvention:
    """How a family's reference defines classifier-free guidance, in speechctl's terms: the
    runtime merges ``l_u + s·(l_c − l_u)``; a reference that writes ``l_c + g·(l_c − l_u)`` (Dia)
    has ``scale_offset`` 1 (s = g + 1). ``above_one``: the reference guides only with a scale
    above 1 (transformers' ``guidance_scale``; 1 is off, below 1 refused). ``filter_top_k``: it
    keeps the conditional logits on the top-k of the guided ones, k its sampling top-k, in
    greedy decoding too (Dia)."""

    scale_offset: float = 0.0
    above_one: bool = False
    filter_top_k: bool = False


def processor_codec(path: Path, subdirs: tuple[str, ...], default: str | None = None) -> CodecLocation:
    """Where a checkpoint's codec lives as transformers' processor finds it: a ``subdirs`` entry
    inside the checkpoint, else what ``audio_tokenizer_config.json`` or ``processor_config.json``
    names (a local directory, or a hub id resolved through the Hugging Face cache), else the
    family's ``default`` (a hub id)."""
    from speechctl.models.hub import is_hub_id, snapshot

    for sub in subdirs:
        if (path / sub / "config.json").is_file():
            return CodecLocation(path / sub, f"{sub}/ in the checkpoint")
    named, where = default, "the family's codec"
    for file, section in (("audio_tokenizer_config.json", None), ("processor_config.json", "audio_tokenizer")):
        if not (path / file).is_file():
            continue
        try:
            entry = json.loads((path / file).read_text())
        except (OSError, ValueError) as e:
            raise ModelError(f"{path / file}: unreadable ({e})") from None
        entry = entry.get(section) or {} if section else entry
        if entry.get("audio_tokenizer_name_or_path"):
            named, where = entry["audio_tokenizer_name_or_path"], f"named in {file}"
            break
    if named is None:
        raise ModelError(f"{path}: no codec ({'/, '.join(subdirs)}/, or processor_config.json naming it)")
    local = Path(named).expanduser()
    if (local / "config.json").is_file():
        return CodecLocation(local, f"{named} (local, {where})")
    if is_hub_id(named):
        return CodecLocation(snapshot(named), f"hub id {named} ({where}), from the Hugging Face cache")
    raise ModelError(f"{path}: the codec {named!r} ({where}) is neither a directory nor a hub id")


def read_generation_config(path: Path) -> dict | None:
    """generation_config.json as a dict; None if there is none."""
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{file}: unreadable ({e})") from None


def sampling_from(values: Mapping[str, Any]) -> Sampling:
    """The ``Sampling`` that generation_config fields (``do_sample``, ``temperature``, ``top_k``,
    ``top_p``; transformers' defaults where absent) describe: greedy unless it samples."""
    values = {**TRANSFORMERS_DEFAULTS, **{k: v for k, v in values.items() if v is not None}}
    if not values["do_sample"]:
        return Sampling(temperature=0.0)
    return Sampling(temperature=float(values["temperature"]), top_k=int(values["top_k"] or 0), top_p=float(values["top_p"]))


def repetition_from(values: Mapping[str, Any]) -> Repetition | None:
    """Repetition-aware sampling as generation_config fields set it (Higgs' ``ras_win_len`` and
    ``ras_win_max_num_repeat``; transformers' Higgs ``generate`` applies it where both are set)."""
    window, repeat = values.get("ras_win_len"), values.get("ras_win_max_num_repeat")
    return Repetition(int(window), int(repeat)) if window and repeat else None


class Family:
    """One architecture. Subclasses set the class attributes and override what differs."""

    name: str  # short id ("multistream", "higgs_audio_v2", "csm")
    title: str  # for messages ("Higgs Audio v2")
    description: str
    architecture: str  # config.json's "architectures" entry
    model_class: str  # the vLLM model, "module:Class" (registered lazily by string)
    prompts: str  # the prompt builder, "module:Class": Class(spec, tokenizer)
    cfg: CfgConvention | None = None  # None: the reference generates without guidance
    # what runs its requests, "module:Class"(checkpoint, config): one vLLM engine, or a family's
    # stages around one (AR+NAR: models/valle/two_stage.py)
    engine_class = "speechctl.engine.engine:SpeechEngine"

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        raise NotImplementedError

    def weights(self, path: Path, config: Mapping[str, Any]) -> WeightFiles:
        return select_weights(path, dict(config))

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        """Where the checkpoint's codec lives (``path``: the directory the engine reads)."""
        return CodecLocation(path / "codec", "codec/ in the checkpoint")

    def hf_overrides(self, config: Mapping[str, Any]) -> dict:
        """config.json fields vLLM must see differently (``EngineArgs.hf_overrides``)."""
        return {}

    def context_limit(self, config: Mapping[str, Any]) -> int:
        """Positions the model takes (config.json's ``max_position_embeddings``)."""
        return int(config.get("max_position_embeddings") or 1 << 20)

    def encoder_positions(self, config: Mapping[str, Any]) -> int | None:
        """An encoder-decoder family's longest encoder input; None for a decoder-only one."""
        return None

    def decoder_config(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """The part of config.json that shapes the generating transformer (``speechctl models``):
        the config itself, an encoder-decoder family's decoder config."""
        return config

    def codec_config(self, codec_config: Mapping[str, Any]) -> Mapping[str, Any]:
        """The codec's own config within its directory's config.json (a model that carries its
        codec inside keeps it under a key: CSM ``codec_config``, MusicGen ``audio_encoder``)."""
        return codec_config.get("codec_config") or codec_config

    def defaults(self, generation: dict | None, config: Mapping[str, Any] | None = None) -> GenerationDefaults:
        """The generation defaults of a checkpoint whose generation_config.json is ``generation``
        (None: it has none, and speechctl's defaults apply) and whose config.json is ``config``:
        its sampling, and repetition-aware sampling where it sets Higgs' fields."""
        if generation is None:
            return GenerationDefaults()
        return GenerationDefaults(audio=sampling_from(generation), repetition=repetition_from(generation),
                                  source="generation_config.json")

    def prompt_builder(self, spec: StreamSpec, tokenizer, config: Mapping[str, Any] | None = None):
        module, name = self.prompts.split(":")
        return getattr(importlib.import_module(module), name)(spec, tokenizer, **self.prompt_options(config or {}))

    def prompt_options(self, config: Mapping[str, Any]) -> dict:
        """The keywords of this family's prompt builder that a checkpoint's config sets."""
        return {}

    def engine(self, checkpoint: Checkpoint, config=None):
        """The engine that runs this family's requests (``speechctl.api.Speech`` asks): one vLLM
        engine, or a family's own stages around it (``engine_class``)."""
        module, name = self.engine_class.split(":")
        return getattr(importlib.import_module(module), name)(checkpoint, config)

    def describe(self, config: Mapping[str, Any]) -> dict[str, str]:
        """What ``speechctl models DIR`` adds for this family (its stages, where they run)."""
        return {}


@dataclass(frozen=True)
class Checkpoint:
    """A family bound to a checkpoint directory: what speechctl reads from it."""

    path: Path
    config: Mapping[str, Any] = field(repr=False)
    family: Family
    name: str | None = None  # what the user called it (a hub id, a built-in name), if not the path

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
    def weights(self) -> WeightFiles:
        return self.family.weights(self.path, self.config)

    @cached_property
    def engine_dir(self) -> Path:
        """The directory vLLM reads: the checkpoint itself, or a view of it without the weight
        files that do not count (``models/weights.py``). A directory with no weight file at all
        (a benchmark's shape, which vLLM fills with random weights: ``load_format="dummy"``) is
        read as it is; an engine that loads weights asks for ``weights`` and names what is missing."""
        from speechctl.models.cache import cache_dir

        if not any(is_weight_file(p.name) for p in self.path.iterdir() if p.is_file()):
            return self.path.resolve()  # as engine_view gives a directory with nothing to hide
        return engine_view(self.path, self.weights, cache_dir() / "views")

    @cached_property
    def codec(self) -> CodecLocation:
        return self.family.codec(self.engine_dir, self.config)

    @property
    def codec_dir(self) -> Path:
        return self.codec.path

    @property
    def hf_overrides(self) -> dict:
        return self.family.hf_overrides(self.config)

    @property
    def dtype(self) -> str | None:
        """The weights' dtype as config.json records it."""
        return self.config.get("dtype") or self.config.get("torch_dtype")

    @cached_property
    def context_limit(self) -> int:
        return self.family.context_limit(self.config)

    @cached_property
    def defaults(self) -> GenerationDefaults:
        return self.family.defaults(read_generation_config(self.path), self.config)

    def prompt_builder(self, tokenizer):
        return self.family.prompt_builder(self.spec, tokenizer, self.config)

    def guidance(self, requested: Guidance | None = None, audio: Sampling | None = None) -> Guidance:
        """A caller's guidance (its ``scale`` in the family's own convention, e.g. ``--cfg 3``;
        None: the checkpoint's default) as the runtime merges it; off stays off. ``audio``: the
        caller's audio sampling, whose top-k a filtering family's CFG filter takes."""
        if requested is None:
            requested = self.defaults.guidance or NO_GUIDANCE
        if not requested.enabled:
            return NO_GUIDANCE
        cfg = self.family.cfg
        if cfg is None:
            raise InputError(f"{self.family.title} has no classifier-free guidance (its reference generates without it)")
        if cfg.above_one and requested.scale < 1:
            raise InputError(f"{self.family.title} guides with a CFG scale above 1 (1 = off), got {requested.scale:g}")
        top_k = requested.top_k
        if cfg.filter_top_k and not top_k:
            default = self.defaults.guidance.top_k if self.defaults.guidance else TRANSFORMERS_DEFAULTS["top_k"]
            top_k = audio.top_k if audio is not None and audio.top_k else default
        return replace(requested, scale=requested.scale + cfg.scale_offset, top_k=top_k)
