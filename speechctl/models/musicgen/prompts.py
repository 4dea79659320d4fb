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

from speechctl.engine.requests import StreamRequest
from speechctl.errors import InputError
from speechctl.models.encoder_decoder_prompts import EncoderDecoderPrompts
from speechctl.models.prompting import TtsOptions

MAX_TEXT_TOKENS = 512


class MusicgenPrompts(EncoderDecoderPrompts):
    title = "MusicGen"
    min_frames = 0

    def build_tts(self, text: str, o: TtsOptions) -> StreamRequest:
        """Music for the description ``text``, ``max_frames`` frames long; ``voice_codes``
        [K, T] (an audio prompt) to continue."""
        if o.depth_sampling is not None or o.repetition or o.voice_text is not None:
            raise InputError("MusicGen takes a description and an audio prompt only (no depth decoder, "
                             "repetition-aware sampling or transcript)")
        ids = np.asarray(self.tokenizer(text).input_ids, dtype=np.int64)
        if not len(ids) or len(ids) > MAX_TEXT_TOKENS:
            raise InputError(f"MusicGen reads 1 to {MAX_TEXT_TOKENS} tokens of description, got {len(ids)}")
        steps = o.max_frames + self.spec.pattern.max_delay  # the last codebook's last code ends it
        return self.request(ids, np.full_like(ids, -1), o, max_tokens=steps)
