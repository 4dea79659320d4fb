"""Admission: what one ``StreamRequest`` becomes inside vLLM.

A request is checked against the engine's limits (its prompt, its frames and, for a CFG pair,
both members at once must fit), then split into its members: the request itself and, where
guided, its unconditional partner. Each member gets the keys the step reads (``StreamParams``),
vLLM's ``SamplingParams`` and vLLM's prompt. Importable without vLLM: it is imported where a
member's sampling is built.
"""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple

import numpy as np

from speechctl.engine.params import GREEDY, HISTORY, StreamParams
from speechctl.engine.requests import StreamRequest, encoder_decoder_prompt
from speechctl.engine.streams import StreamSpec, audio_item, item_steps
from speechctl.errors import EngineError


class Member(NamedTuple):
    """One vLLM request of a speechctl request: the request itself or its CFG partner."""

    key: str  # vLLM's request id
    prompt: dict  # vLLM's prompt
    params: StreamParams  # what the model's step reads of it
    max_tokens: int
    stream: bool  # vLLM reports its tokens every step

    @property
    def conditional(self) -> bool:
        return self.params.conditional

    @property
    def partner(self) -> str | None:
        return self.params.partner

    def sampling(self, req: StreamRequest):
        """vLLM's ``SamplingParams``. Paired requests take one-hot primary logits from the model
        (it samples each pair's token once), so vLLM's own text sampling only runs for unpaired
        requests; vLLM's seed only matters where it samples freely (the audio streams draw from
        ``params.seed``)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        text = req.text if self.partner is None else GREEDY
        return SamplingParams(
            temperature=text.temperature,
            top_k=text.top_k if text.top_k > 0 else -1,
            top_p=text.top_p,
            seed=self.params.seed if text.temperature > 0 else None,
            max_tokens=self.max_tokens,
            stop_token_ids=list(req.stop_token_ids),
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
            detokenize=False,  # callers decode the ids they need; vLLM would detokenize every step
            extra_args=self.params.to_extra_args(),
            skip_clone=True,  # made for this request alone: vLLM's copy on admission may be shallow
        )


class Admission:
    """The engine's limits, read from its vLLM config when a request is checked (the KV cache's
    size is known only once the engine has profiled it)."""

    def __init__(self, spec: StreamSpec, max_model_len: int, vllm_config: Any, encoder_positions: int | None):
        self.spec = spec
        self.max_model_len = max_model_len
        self.vllm_config = vllm_config
        self.encoder_positions = encoder_positions  # an encoder-decoder family's encoder length

    def prompt_length(self, req: StreamRequest) -> int:
        """Positions of the prompt once each audio placeholder is expanded to its steps."""
        steps = sum(item_steps(self.spec.pattern, item).shape[1] for item in _items(req))
        return len(req.prompt_ids) - len(req.audio_items) + steps

    def fit(self, req: StreamRequest) -> tuple[int, int]:
        """(max_tokens, max_frames) within max_model_len; a request must still be able to end
        its audio properly, so frames shrink with the token budget. ``EngineError`` says why a
        request cannot run at all."""
        limit = self.max_model_len
        prompt = self.prompt_length(req)
        if prompt >= limit:
            raise EngineError(f"prompt of {prompt} steps does not fit max_model_len {limit}")
        if req.guidance.enabled:
            self._check_pair(req, prompt)
        if req.repetition and not 0 <= req.repetition[0] <= HISTORY:
            raise EngineError(f"repetition window {req.repetition[0]} is past the longest speechctl keeps ({HISTORY})")
        excess = max(0, prompt + req.max_tokens - limit)
        if excess and req.starts_in_audio and req.max_frames - excess < 1:
            raise EngineError(f"prompt of {prompt} steps leaves no room for audio in max_model_len {limit}")
        return req.max_tokens - excess, req.max_frames - excess

    def _check_pair(self, req: StreamRequest, prompt: int) -> None:
        """Both members of a CFG pair are scheduled in the same steps, so both must fit at once."""
        if req.uncond_prompt_ids is None or len(req.uncond_prompt_ids) != prompt:
            raise EngineError("a CFG request needs an unconditional prompt of the same length")
        budget = self.vllm_config.scheduler_config.max_num_batched_tokens
        if 2 * prompt > budget:  # a pair's prefill runs in one step
            raise EngineError(f"CFG prompt of {prompt} steps: both members need {2 * prompt} > max_num_batched_tokens {budget}")
        cache = self.vllm_config.cache_config
        if cache.num_gpu_blocks and 2 * -(-prompt // cache.block_size) > cache.num_gpu_blocks - 1:
            raise EngineError(f"CFG prompt of {prompt} steps: both members' KV exceeds the KV cache")
        if req.encoder_ids is not None:  # both members' encoder inputs run in one step
            encoder_budget = max(budget, self.encoder_positions or 0)
            if 2 * len(req.encoder_ids) > encoder_budget:
                raise EngineError(f"CFG condition of {len(req.encoder_ids)} tokens: both members need "
                                  f"{2 * len(req.encoder_ids)} > the encoder's {encoder_budget} per step")

    def members(self, req: StreamRequest, key: str) -> list[Member]:
        """The request as vLLM requests: ``key`` and, for a CFG request, its unconditional partner
        ``key + "u"`` (the condition dropped, no audio items). Raises ``EngineError`` where the
        request cannot run."""
        max_tokens, max_frames = self.fit(req)
        guided = req.guidance.enabled
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        history = self._audio_history(req) if req.repetition else ()
        shared = dict(seed=seed, audio=req.audio, starts_in_audio=req.starts_in_audio, allow_audio=req.allow_audio,
                      max_frames=max_frames, min_frames=min(req.min_frames, max_frames), guidance=req.guidance,
                      text=req.text, depth=req.depth, repetition=req.repetition, **_decoder_streams(req))
        members = [Member(key, _prompt(key, req.prompt_ids, _items(req), req.encoder_ids),
                          StreamParams(key=key, partner=key + "u" if guided else None, conditional=True,
                                       history=history, **shared),
                          max_tokens, req.stream)]
        if guided:
            partner = key + "u"
            members.append(Member(partner, _prompt(partner, req.uncond_prompt_ids, [], req.uncond_encoder_ids),
                                  StreamParams(key=partner, partner=key, conditional=False, history=(), **shared),
                                  max_tokens, False))
        return members

    def _audio_history(self, req: StreamRequest) -> tuple[tuple[int, ...], ...]:
        """The last steps of the prompt's audio, delay-interleaved as the model saw them: where a
        repetition window starts."""
        if not req.audio_items:
            return ()
        steps = np.concatenate([item_steps(self.spec.pattern, item) for item in _items(req)], axis=1).T
        return tuple(tuple(int(x) for x in row) for row in steps[-HISTORY:])


def _items(req: StreamRequest) -> list:
    """The request's audio items as the model's processor takes them (``streams.audio_item``)."""
    last = len(req.audio_items) - 1
    return [audio_item(codes, req.continues and i == last) for i, codes in enumerate(req.audio_items)]


def _decoder_streams(req: StreamRequest) -> dict:
    """An encoder-decoder request's decoder-prompt tokens, and any request's lead-in (forced
    first generated steps), as ``StreamParams`` fields (tuples: the params are frozen)."""
    fields = {}
    if req.lead_in is not None:
        fields["lead_in"] = tuple(map(tuple, np.asarray(req.lead_in).tolist()))
    if req.prompt_steps is not None:
        fields["prompt_steps"] = tuple(map(tuple, np.asarray(req.prompt_steps).tolist()))
    return fields


def _prompt(key: str, prompt_ids: list[int], audio_items: list, encoder_ids=None) -> dict:
    if encoder_ids is not None:
        return encoder_decoder_prompt(key, encoder_ids, prompt_ids)
    prompt = {"prompt_token_ids": list(prompt_ids)}
    if audio_items:
        prompt["multi_modal_data"] = {"audio": list(audio_items)}
    return prompt
