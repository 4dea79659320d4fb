"""Prompts of Higgs Audio v2 (its Llama-3 chat layout), and reading its audio back.

The layout of the published chat template (system message, optional scene description, one
user/assistant exchange per voice prompt, then the text to speak), as one string tokenized
once::

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n{system}
    \\n\\n<|scene_desc_start|>\\n{scene}\\n<|scene_desc_end|><|eot_id|>
    <|start_header_id|>user<|end_header_id|>\\n\\n{voice transcript}<|eot_id|>                  } voice
    <|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|><|eot_id|>  } prompt
    <|start_header_id|>user<|end_header_id|>\\n\\n{text}<|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>

(without the line breaks drawn here). ``<|AUDIO_OUT|>`` is one placeholder that vLLM expands to
the voice's T + K + 1 delay-interleaved frames. Generation then runs in audio from its first
step and ends with ``<|eot_id|>``.
"""

from __future__ import annotations

import numpy as np

from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.streams import StreamSpec, complete_frames
from speechctl.errors import EngineError, InputError
from speechctl.models.prompting import PromptBuilder, TtsOptions

DEFAULT_SYSTEM = "Generate audio following instruction."
DEFAULT_SCENE = "Audio is recorded from a quiet room."
_TOKENS = {
    "audio_out_bos": "<|audio_out_bos|>",
    "audio": "<|AUDIO_OUT|>",
    "audio_eos": "<|audio_eos|>",
}


def _turn(role: str, content: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"


class HiggsAudioV2Prompts(PromptBuilder):
    title = "Higgs Audio v2"
    min_frames = 0  # any stream may end the audio from its first free step, as transformers' generate allows

    def __init__(self, spec: StreamSpec, tokenizer, *, system: str = DEFAULT_SYSTEM, scene: str | None = DEFAULT_SCENE):
        super().__init__(spec, tokenizer)
        self.system = system
        self.scene = scene
        ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in _TOKENS.items()}
        if ids["audio"] != spec.audio_id or ids["audio_out_bos"] != spec.audio_bos_id:
            raise ValueError(
                f"tokenizer and config disagree on the audio tokens: {ids} vs "
                f"audio_token_id {spec.audio_id}, audio_bos_token_id {spec.audio_bos_id}"
            )

    def prompt_text(self, text: str, voice_text: str | None = None, with_voice: bool = False) -> str:
        system = self.system.strip()
        if self.scene:
            system += f"\n\n<|scene_desc_start|>\n{self.scene.strip()}\n<|scene_desc_end|>"
        parts = [self.tokenizer.bos_token or "", f"<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"]
        if with_voice:
            parts.append(_turn("user", (voice_text or "").strip()))
            parts.append(_turn("assistant", "".join(_TOKENS.values())))
        parts.append(_turn("user", text.strip()))
        parts.append(f"<|start_header_id|>assistant<|end_header_id|>\n\n{_TOKENS['audio_out_bos']}")
        return "".join(parts)

    def build_tts(self, text: str, o: TtsOptions) -> StreamRequest:
        """A TTS request; ``voice_codes`` [K, T] (codec codes of reference audio) with its
        transcript ``voice_text`` clone a voice."""
        if o.depth_sampling is not None:
            raise InputError("Higgs Audio v2 has no depth decoder (depth_sampling)")
        if o.guidance.enabled:
            raise InputError("Higgs Audio v2 has no classifier-free guidance (its reference generates without it)")
        if o.voice_text is not None and o.voice_codes is None:
            raise InputError("a voice transcript needs the voice's audio")
        prompt = self.prompt_text(text, o.voice_text, with_voice=o.voice_codes is not None)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        K = self.spec.num_codebooks
        return StreamRequest(
            repetition=o.repetition,
            prompt_ids=ids,
            audio_items=[] if o.voice_codes is None else [o.voice_codes],
            max_tokens=o.max_frames + K + 2,  # BOS frame, frames, at most K + 1 ending steps
            text=o.text_sampling,
            audio=o.audio_sampling,
            seed=o.seed,
            stop_token_ids=[self.spec.audio_eos_id],
            starts_in_audio=True,
            max_frames=o.max_frames,
            min_frames=o.min_frames,
            tag=o.tag,
        )

    def audio_segments(self, out: StreamOutput, starts_in_audio: bool = True) -> list[np.ndarray]:
        """The generated audio as [K, T] codes, read the way transformers'
        ``HiggsAudioV2Processor.batch_decode`` reads it: after the last all-BOS frame, up to the
        first all-EOS frame, delay pattern reverted, stray BOS/EOS clipped into the code range."""
        steps = np.asarray(out.aux)  # [S, K]
        starts = np.flatnonzero((steps == self.spec.pattern.bos).all(axis=1))
        if not len(starts):
            raise EngineError("audio streams came out malformed: no all-BOS frame")
        codes = self._frames(steps[starts[-1] + 1 :])
        if not codes.shape[1]:
            raise EngineError("the model ended the audio before its first frame")
        return [codes]

    def final_frames(self, steps: np.ndarray) -> np.ndarray:
        """The frames of an audio segment still being generated that are already final, from its
        steps so far ([S, K]): read from the first all-BOS frame (``audio_segments`` reads from
        the last; they differ only if the model restarts its audio, which the streaming reader
        reports as an error)."""
        starts = np.flatnonzero((steps == self.spec.pattern.bos).all(axis=1))
        if not len(starts):
            return np.zeros((self.spec.num_codebooks, 0), np.int64)
        return self._frames(steps[starts[0] + 1 :])

    def _frames(self, steps: np.ndarray) -> np.ndarray:
        """Rows after the all-BOS frame -> [K, T] codes: up to the first all-EOS row; frame t is
        complete once row t + K - 1 exists."""
        pat = self.spec.pattern
        ends = np.flatnonzero((steps == pat.eos).all(axis=1))
        steps = steps[: ends[0]] if len(ends) else steps
        codes = complete_frames(steps, range(pat.num_streams))  # delays 1..K counted from that frame
        return np.clip(codes, 0, pat.codebook_size - 1)
