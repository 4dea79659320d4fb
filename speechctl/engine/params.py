"""Per-request settings that travel to the model inside ``SamplingParams.extra_args``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

EXTRA_ARGS_KEY = "speechctl"


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of one stream group (text or audio). temperature 0 = greedy."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def filters(self) -> bool:
        return self.top_k > 0 or self.top_p < 1


GREEDY = Sampling(temperature=0.0)
DEFAULT_TEXT = GREEDY  # speechctl's defaults (speechctl.api, the CLI)
DEFAULT_AUDIO = Sampling(temperature=0.9, top_k=50)


@dataclass(frozen=True)
class Guidance:
    """Classifier-free guidance: l = l_u + scale * (l_c - l_u) on the guided streams.

    ``top_k`` > 0 adds Dia's "CFG filter": keep the top-k tokens of the guided logits and
    sample the conditional logits restricted to them.
    """

    scale: float = 1.0  # 1.0 = off
    streams: str = "both"  # text | audio | both
    top_k: int = 0

    def __post_init__(self):
        if self.scale < 0:
            raise ValueError(f"cfg scale must be >= 0, got {self.scale}")
        if self.streams not in ("text", "audio", "both"):
            raise ValueError(f"cfg streams must be text, audio or both, got {self.streams!r}")
        if self.top_k < 0:
            raise ValueError(f"cfg top_k must be >= 0, got {self.top_k}")

    @property
    def enabled(self) -> bool:
        return self.scale != 1.0


NO_GUIDANCE = Guidance()


HISTORY = 32  # prompt audio steps kept per slot: the longest repetition window


@dataclass(frozen=True)
class StreamParams:
    """What the model needs to decode one request's auxiliary streams."""

    key: str  # unique per request, chosen by the driver
    seed: int
    audio: Sampling = field(default_factory=Sampling)
    starts_in_audio: bool = False  # the prompt ends with <|audio_bos|> (TTS)
    allow_audio: bool = True  # the primary stream may open audio (<|audio_bos|>) by itself
    max_frames: int = 1 << 30  # force the end of audio after this many frames
    min_frames: int = 1  # the audio may not end before this many frames (= max: fixed length)
    # A CFG pair: both members name each other; the model samples once per pair.
    partner: str | None = None
    conditional: bool = True  # False for the unconditional member of a pair
    guidance: Guidance = field(default_factory=Guidance)
    text: Sampling = field(default_factory=Sampling)  # paired requests sample text in the model
    depth: Sampling | None = None  # codebooks 1.. of a depth-decoder family (CSM); None: as audio
    # Repetition-aware sampling (Higgs): (window, max_repeat); a code sampled that often within a
    # codebook's last ``window`` steps is drawn again from the raw distribution. ``history``: the
    # last steps of the prompt's audio ([steps][K]), the start of the window.
    repetition: tuple[int, int] | None = None
    history: tuple[tuple[int, ...], ...] = ()
    # Encoder-decoder families: the stream tokens of the decoder prompt's positions ([P][K]),
    # and the tokens the first generated steps must take ([D][K], -1: as the rules say), where
    # an audio prompt continues past the prompt under the delay pattern (Dia).
    prompt_steps: tuple[tuple[int, ...], ...] = ()
    lead_in: tuple[tuple[int, ...], ...] = ()

    def to_extra_args(self) -> dict[str, Any]:
        """The object itself, not a dict of its fields: vLLM deep-copies and walks every
        request's ``extra_args`` (a nested dict cost ~70 µs per request to make, copy, check and
        parse back). The engine core runs in this process; workers in others get it pickled."""
        return {EXTRA_ARGS_KEY: self}

    def __deepcopy__(self, memo) -> StreamParams:
        return self  # frozen all the way down: a copy would equal it

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any] | None) -> "StreamParams":
        params = (extra_args or {}).get(EXTRA_ARGS_KEY)
        if not isinstance(params, cls):
            raise ValueError("request lacks speechctl stream parameters (extra_args['speechctl'])")
        return params
