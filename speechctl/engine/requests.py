"""What goes into the engine and what comes out of it: plain data, importable without vLLM or
torch (prompt builders make requests; the API and the pipelines read outputs)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from speechctl.engine.params import GREEDY, NO_GUIDANCE, Guidance, Sampling


@dataclass
class StreamRequest:
    """One generation: a token-id prompt (one ``<|audio|>`` placeholder per audio item) and the
    settings of every stream."""

    prompt_ids: list[int]
    max_tokens: int
    audio_items: list[np.ndarray] = field(default_factory=list)  # each [K, T] codec codes
    text: Sampling = GREEDY
    audio: Sampling = GREEDY
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    starts_in_audio: bool = False
    allow_audio: bool = True
    max_frames: int = 1 << 30
    min_frames: int = 1  # = max_frames for a fixed length (benchmarks)
    guidance: Guidance = NO_GUIDANCE
    uncond_prompt_ids: list[int] | None = None  # the CFG partner's prompt (same length)
    stream: bool = False  # report new tokens every step, not only at the end
    depth: Sampling | None = None  # a depth decoder's codebooks (CSM); None: as ``audio``
    repetition: tuple[int, int] | None = None  # repetition-aware sampling: (window, max_repeat)
    tag: object = None  # the caller's handle, returned with the output


@dataclass
class StreamOutput:
    """A finished request's streams; for a ``stream`` request, also the tokens each step added
    (``finished`` False until the last piece)."""

    tag: object
    token_ids: list[int]  # primary stream (for a streamed piece: the new tokens only)
    aux: np.ndarray  # [len(token_ids), K] auxiliary streams, step by step
    finish_reason: str | None
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from vLLM's prefix cache
    partner_cached_tokens: int = 0  # the same for a CFG pair's unconditional member
    finished: bool = True
