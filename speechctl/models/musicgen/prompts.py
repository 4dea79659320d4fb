"""Prompts of MusicGen, and reading its audio back.

The condition is a text description, T5-tokenized by the checkpoint's tokenizer (its end token
appended, as MusicGen's processor does); the unconditional CFG member's condition is null
(ids -1, the same length: the model gives it zero states). Generation starts from an all-BOS
start frame; an audio prompt's EnCodec codes follow it under the delay pattern and MusicGen
continues them (``DelayPattern.decoder_prompt``). The audio is ``max_frames`` frames long (no
codebook ends it); the audio read back is what MusicGen generated, without the prompt's frames.
"""

from __future__ import annotations

import numpy as np

from speechctl.engine.params import GREEDY, NO_GUIDANCE, Guidance, Sampling
from speechctl.engine.requests import StreamRequest
from speechctl.errors import InputError
from speechctl.models.encoder_decoder_prompts import EncoderDecoderPrompts

MAX_TEXT_TOKENS = 512


class MusicgenPrompts(EncoderDecoderPrompts):
    title = "MusicGen"
    min_frames = 0

    def tts(self, text: str, *, voice_codes: np.ndarray | None = None, voice_text: str | None = None,
            text_sampling: Sampling = GREEDY, audio_sampling: Sampling = GREEDY, depth_sampling: Sampling | None = None,
            seed: int | None = None, max_frames: int = 1000, min_frames: int | None = None,
            guidance: Guidance = NO_GUIDANCE, repetition: tuple[int, int] | None = None, tag: object = None) -> StreamRequest:
        """Music for the description ``text``, ``max_frames`` frames long; ``voice_codes``
        [K, T] (an audio prompt) to continue."""
        if depth_sampling is not None or repetition or voice_text is not None:
            raise InputError("MusicGen takes a description and an audio prompt only (no depth decoder, "
                             "repetition-aware sampling or transcript)")
        ids = np.asarray(self.tokenizer(text).input_ids, dtype=np.int64)
        if not len(ids) or len(ids) > MAX_TEXT_TOKENS:
            raise InputError(f"MusicGen reads 1 to {MAX_TEXT_TOKENS} tokens of description, got {len(ids)}")
        steps = max_frames + self.spec.pattern.max_delay  # the last codebook's last code ends it
        return self.request(ids, np.full_like(ids, -1), codes=voice_codes, max_frames=max_frames, max_tokens=steps,
                            audio=audio_sampling, guidance=guidance, seed=seed, min_frames=min_frames,
                            text=text_sampling, tag=tag)
