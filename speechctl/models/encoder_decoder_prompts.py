"""What the encoder-decoder families' prompt builders share (Dia, MusicGen): a request is a
condition for the encoder (and, with CFG, the unconditional member's), a decoder prompt of one
control token per position whose stream tokens are an all-BOS start frame and optional audio
under the delay pattern (``DelayPattern.decoder_prompt``), and the audio is read back from the
generated steps, delay reverted, up to the lead stream's end (its EOS, or its PAD where the
family ends by length). Imports neither torch nor vLLM."""

from __future__ import annotations

import numpy as np

from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.streams import complete_frames
from speechctl.errors import EngineError, InputError
from speechctl.models.prompting import PromptBuilder, TtsOptions


class EncoderDecoderPrompts(PromptBuilder):
    cuts_text = False  # the condition is read whole (a dialogue's speaker tags, a music description)

    def request(self, encoder_ids: np.ndarray, uncond_encoder_ids: np.ndarray, o: TtsOptions, *,
                max_tokens: int) -> StreamRequest:
        pattern = self.spec.pattern
        codes = o.voice_codes
        if codes is None:
            codes = np.zeros((pattern.num_streams, 0), np.int64)
        try:
            steps, lead_in = pattern.decoder_prompt(codes)
        except ValueError as e:
            raise InputError(f"{self.title}'s audio prompt: {e}") from None
        prompt_ids = [self.spec.audio_bos_id] + [self.spec.audio_id] * np.shape(codes)[1]
        guided = o.guidance.enabled
        return StreamRequest(
            prompt_ids=prompt_ids, max_tokens=max_tokens, text=o.text_sampling, audio=o.audio_sampling, seed=o.seed,
            stop_token_ids=[self.spec.audio_eos_id], starts_in_audio=True, max_frames=o.max_frames,
            min_frames=o.min_frames, guidance=o.guidance,
            uncond_prompt_ids=list(prompt_ids) if guided else None, encoder_ids=np.asarray(encoder_ids, np.int64),
            uncond_encoder_ids=np.asarray(uncond_encoder_ids, np.int64) if guided else None,
            prompt_steps=steps, lead_in=lead_in, tag=o.tag)

    def audio_segments(self, out: StreamOutput, starts_in_audio: bool = True) -> list[np.ndarray]:
        """The generated frames as [K, T] codes (an audio prompt's own frames not included)."""
        codes = self.final_frames(np.asarray(out.aux))
        if not codes.shape[1]:
            raise EngineError("the model ended the audio before its first frame")
        return [codes]

    def final_frames(self, steps: np.ndarray) -> np.ndarray:
        """[S, K] generated steps so far -> the [K, T] frames present on every stream, up to the
        lead stream's end."""
        pattern = self.spec.pattern
        end = pattern.eos if self.spec.rules.end_token else pattern.pad
        lead = np.asarray(steps)[:, pattern.lead]
        ends = np.flatnonzero(lead[pattern.delays[pattern.lead]:] == end)
        frames = complete_frames(steps, pattern.delays)
        if len(ends):
            frames = frames[:, : ends[0]]
        return np.clip(frames, 0, pattern.codebook_size - 1)
