"""What goes into the engine and what comes out of it: plain data, importable without vLLM or
torch (prompt builders make requests; the API and the pipelines read outputs)."""

from __future__ import annotations

import hashlib
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
    # The last audio item is speech the model continues (``DelayPattern.continuation``): laid out
    # open-ended, its delayed streams' last frames forced on the first generated steps (``lead_in``).
    continues: bool = False
    # Encoder-decoder families (Dia, MusicGen): the encoder's input ids, the unconditional CFG
    # member's (same length; the condition dropped, as the family's reference drops it), the
    # decoder prompt's stream tokens [P, K] and the first generated steps' forced tokens [D, K]
    # (-1: by rule; also a continued audio's, ``continues``). The decoder prompt (``prompt_ids``)
    # is then control tokens, one per position.
    encoder_ids: np.ndarray | None = None
    uncond_encoder_ids: np.ndarray | None = None
    prompt_steps: np.ndarray | None = None
    lead_in: np.ndarray | None = None
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
    request_id: str | None = None  # a streamed piece's vLLM request (``SpeechEngine.report_after``)


def condition_tag(key: str) -> int:
    """A request key as a 56-bit integer, carried in its encoder input: vLLM hands an
    encoder-decoder model the step's encoder outputs in scheduling order, which need not be the
    batch's row order its cross-attention writes them in (``models/encoder_decoder.py``)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=7).digest(), "little")


def encoder_decoder_prompt(key: str, encoder_ids, decoder_ids: list[int]) -> dict:
    """vLLM's prompt of an encoder-decoder request: the encoder's input ids as its encoder
    prompt's one multimodal item (with the request's tag), the decoder prompt as token ids."""
    item = (np.asarray(encoder_ids, dtype=np.int64), condition_tag(key))
    return {"encoder_prompt": {"prompt_token_ids": [0], "multi_modal_data": {"audio": item}},
            "decoder_prompt": {"prompt_token_ids": list(decoder_ids)}}
