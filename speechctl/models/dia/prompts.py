"""Prompts of Dia, and reading its audio back.

The encoder reads the text as UTF-8 bytes, with the speaker tags ``[S1]``/``[S2]`` as the bytes
1 and 2 (transformers' ``DiaTokenizer``); non-verbal tags like ``(laughs)`` are plain text. A
voice prompt is DAC codes of reference audio whose transcript comes first in the text, and Dia
continues it. The decoder starts from an all-BOS frame; a voice prompt's T frames follow under
the delay pattern (channel c's frame f at position 1 + d_c + f)::

    position      0   1   2  ...  T   | generated: T+1 ...
    channel 0     B   c0  c1 ... cT-1 | free
    channel c     B   B  ... (d_c+1 BOS, then codes) | the prompt's last codes for d_c steps

so the decoder prompt is T + 1 positions and the first generated steps of the delayed channels
are the prompt's own codes (the request's lead-in), as transformers' delay mask forces them.
"""

from __future__ import annotations

import numpy as np

from speechctl.engine.params import GREEDY, NO_GUIDANCE, Guidance, Sampling
from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.streams import StreamSpec, complete_frames
from speechctl.errors import EngineError, InputError
from speechctl.models.prompting import PromptBuilder

SPEAKER_BYTES = {"[S1]": b"\x01", "[S2]": b"\x02"}


def dia_text_ids(text: str) -> np.ndarray:
    """The encoder's input ids of ``text``: its UTF-8 bytes, [S1]/[S2] as bytes 1/2."""
    data = text.encode("utf-8")
    for tag, byte in SPEAKER_BYTES.items():
        data = data.replace(tag.encode(), byte)
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


class DiaPrompts(PromptBuilder):
    title = "Dia"
    min_frames = 0  # channel 0 may end at its first step, as transformers' generate allows
    cuts_text = False  # a dialogue is spoken in one pass: its speaker tags must stay together

    def __init__(self, spec: StreamSpec, tokenizer, *, max_text_bytes: int = 1024):
        super().__init__(spec, tokenizer)
        self.max_text_bytes = max_text_bytes

    def tts(self, text: str, *, voice_codes: np.ndarray | None = None, voice_text: str | None = None,
            text_sampling: Sampling = GREEDY, audio_sampling: Sampling = GREEDY, depth_sampling: Sampling | None = None,
            seed: int | None = None, max_frames: int = 1000, min_frames: int | None = None,
            guidance: Guidance = NO_GUIDANCE, repetition: tuple[int, int] | None = None, tag: object = None) -> StreamRequest:
        """A TTS request; ``voice_codes`` [9, T] with its transcript ``voice_text`` continue a
        voice. ``guidance`` in the runtime's terms (``Checkpoint.guidance`` converts Dia's)."""
        if depth_sampling is not None or repetition:
            raise InputError("Dia has neither a depth decoder nor repetition-aware sampling")
        if voice_text is not None and voice_codes is None:
            raise InputError("a voice transcript needs the voice's audio")
        full_text = f"{voice_text.strip()} {text.strip()}" if voice_text else text
        ids = dia_text_ids(full_text)
        if not len(ids) or len(ids) > self.max_text_bytes:
            raise InputError(f"Dia reads 1 to {self.max_text_bytes} bytes of text, got {len(ids)}")
        pattern = self.spec.pattern
        codes = np.zeros((pattern.num_streams, 0), np.int64) if voice_codes is None else np.asarray(voice_codes)
        if codes.ndim != 2 or codes.shape[0] != pattern.num_streams:
            raise InputError(f"Dia's voice codes are [{pattern.num_streams}, T], got {list(codes.shape)}")
        steps, lead_in = self.decoder_prompt(codes)
        if 0 < audio_sampling.temperature < 1:  # Dia's generate raises it to 1
            audio_sampling = Sampling(1.0, audio_sampling.top_k, audio_sampling.top_p)
        prompt_ids = [self.spec.audio_bos_id] + [self.spec.audio_id] * codes.shape[1]
        return StreamRequest(
            prompt_ids=prompt_ids, max_tokens=max_frames + pattern.max_delay + 1, text=text_sampling,
            audio=audio_sampling, seed=seed, stop_token_ids=[self.spec.audio_eos_id], starts_in_audio=True,
            max_frames=max_frames, min_frames=self.min_frames if min_frames is None else min_frames,
            guidance=guidance, uncond_prompt_ids=list(prompt_ids) if guidance.enabled else None,
            encoder_ids=ids, uncond_encoder_ids=np.zeros_like(ids) if guidance.enabled else None,
            prompt_steps=steps, lead_in=lead_in, tag=tag)

    def decoder_prompt(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """[K, T] voice codes -> ([T + 1, K] tokens of the decoder prompt's positions, [D, K]
        forced tokens of the first generated steps (-1 free), None without a voice)."""
        pattern = self.spec.pattern
        K, T = codes.shape
        D = pattern.max_delay
        d = np.asarray(pattern.delays)[None, :]
        frame = np.arange(T + 1 + D)[:, None] - 1 - d  # [positions, K] the frame each position holds
        valid = (frame >= 0) & (frame < T)
        steps = np.where(valid, codes.T[np.clip(frame, 0, max(T - 1, 0)), np.arange(K)] if T else 0, pattern.bos)
        steps = np.where(frame >= T, -1, steps)
        if not T:
            return steps[:1], None
        return steps[: T + 1], steps[T + 1 :]

    def audio_segments(self, out: StreamOutput, starts_in_audio: bool = True) -> list[np.ndarray]:
        """The generated frames as [9, T] codes (a voice prompt's own frames not included): up to
        channel 0's EOS, the delay reverted, as transformers' ``DiaProcessor.batch_decode``."""
        codes = self.final_frames(np.asarray(out.aux))
        if not codes.shape[1]:
            raise EngineError("the model ended the audio before its first frame")
        return [codes]

    def final_frames(self, steps: np.ndarray) -> np.ndarray:
        """[S, K] generated steps so far -> the [K, T] frames present on every channel, up to
        channel 0's EOS."""
        pattern = self.spec.pattern
        ends = np.flatnonzero(steps[:, pattern.lead] == pattern.eos)
        frames = complete_frames(steps, pattern.delays)
        if len(ends):
            frames = frames[:, : ends[0]]
        return np.clip(frames, 0, pattern.codebook_size - 1)
