"""Prompts of Dia, and reading its audio back.

The encoder reads the text as UTF-8 bytes, with the speaker tags ``[S1]``/``[S2]`` as the bytes
1 and 2 (transformers' ``DiaTokenizer``); non-verbal tags like ``(laughs)`` are plain text. A
voice prompt is DAC codes of reference audio whose transcript comes first in the text, and Dia
continues it: its frames follow the decoder's all-BOS start frame under the delay pattern
(``DelayPattern.decoder_prompt``), and the delayed channels' last prompt frames are their first
generated steps, as transformers' delay mask forces them. The audio read back is what Dia
generated, without the voice prompt's frames.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from speechctl.engine.params import Sampling
from speechctl.engine.requests import StreamRequest
from speechctl.engine.streams import StreamSpec
from speechctl.errors import InputError
from speechctl.models.encoder_decoder_prompts import EncoderDecoderPrompts
from speechctl.models.prompting import TtsOptions

SPEAKER_BYTES = {"[S1]": b"\x01", "[S2]": b"\x02"}


def dia_text_ids(text: str) -> np.ndarray:
    """The encoder's input ids of ``text``: its UTF-8 bytes, [S1]/[S2] as bytes 1/2."""
    data = text.encode("utf-8")
    for tag, byte in SPEAKER_BYTES.items():
        data = data.replace(tag.encode(), byte)
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


class DiaPrompts(EncoderDecoderPrompts):
    title = "Dia"
    min_frames = 0  # channel 0 may end at its first step, as transformers' generate allows

    def __init__(self, spec: StreamSpec, tokenizer, *, max_text_bytes: int = 1024):
        super().__init__(spec, tokenizer)
        self.max_text_bytes = max_text_bytes

    def build_tts(self, text: str, o: TtsOptions) -> StreamRequest:
        """A TTS request; ``voice_codes`` [9, T] with its transcript ``voice_text`` continue a
        voice. ``guidance`` in the runtime's terms (``Checkpoint.guidance`` converts Dia's)."""
        if o.depth_sampling is not None or o.repetition:
            raise InputError("Dia has neither a depth decoder nor repetition-aware sampling")
        if o.voice_text is not None and o.voice_codes is None:
            raise InputError("a voice transcript needs the voice's audio")
        ids = dia_text_ids(f"{o.voice_text.strip()} {text.strip()}" if o.voice_text else text)
        if not len(ids) or len(ids) > self.max_text_bytes:
            raise InputError(f"Dia reads 1 to {self.max_text_bytes} bytes of text, got {len(ids)}")
        audio = o.audio_sampling
        if 0 < audio.temperature < 1:  # Dia's generate raises it to 1
            o = replace(o, audio_sampling=Sampling(1.0, audio.top_k, audio.top_p))
        # channel 0's frames, its EOS, then the other channels' flush to their own EOS
        steps = o.max_frames + self.spec.pattern.max_delay + 1
        return self.request(ids, np.zeros_like(ids), o, max_tokens=steps)
