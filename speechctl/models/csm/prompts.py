"""Prompts of CSM (its chat template's layout: speaker ids and context turns), and reading its
audio back.

Each context turn is ``<|begin_of_text|>[speaker]text<|end_of_text|>`` followed by its audio;
the turn to speak is the same text line without audio, and generation continues with frames::

    <|begin_of_text|>[0]context text<|end_of_text|><|AUDIO|>   <- one context turn (any number)
    <|begin_of_text|>[1]text to speak<|end_of_text|>           -> frames ..., end frame

The published template writes a turn's audio as ``<|AUDIO|><|audio_eos|>`` (its frames, then an
end frame of zeros); here ``<|AUDIO|>`` is one placeholder that vLLM expands to the turn's T
frames plus that end frame (``DelayPattern.build`` of a no-delay layout appends one step, which
CSM's model embeds as the zero frame): the same T + 1 positions and embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.streams import StreamSpec
from speechctl.errors import EngineError, InputError
from speechctl.models.prompting import PromptBuilder, TtsOptions


@dataclass
class Turn:
    """An earlier utterance of the conversation: who said what, and its codec codes [K, T]."""

    speaker: int
    text: str
    codes: np.ndarray


class CsmPrompts(PromptBuilder):
    title = "CSM"

    def __init__(self, spec: StreamSpec, tokenizer):
        super().__init__(spec, tokenizer)
        if tokenizer.convert_tokens_to_ids("<|AUDIO|>") != spec.audio_id:
            raise ValueError(f"tokenizer's <|AUDIO|> is not the config's audio_token_id {spec.audio_id}")

    def _line(self, speaker: int, text: str) -> str:
        tok = self.tokenizer
        return f"{tok.bos_token}[{int(speaker)}]{text}{tok.eos_token}"

    def build_tts(self, text: str, o: TtsOptions, *, speaker: int = 0, context: Sequence[Turn] = ()) -> StreamRequest:
        """Speak ``text`` as ``speaker`` after the ``context`` turns (CSM's own options). A
        voice prompt (``voice_codes`` with its transcript ``voice_text``) is one more context turn
        by the same speaker. ``audio_sampling`` picks codebook 0, ``depth_sampling`` (default: the
        same) the depth decoder's codebooks."""
        if o.guidance.enabled:
            raise InputError("CSM has no classifier-free guidance (its reference generates without it)")
        if o.repetition:
            raise InputError("CSM samples its codebooks in its depth decoder: repetition-aware sampling does not apply")
        turns = list(context)
        if o.voice_codes is not None:
            turns.append(Turn(speaker, o.voice_text or "", o.voice_codes))
        elif o.voice_text is not None:
            raise InputError("a voice transcript needs the voice's audio")
        prompt = "".join(self._line(t.speaker, t.text) + "<|AUDIO|>" for t in turns) + self._line(speaker, text)
        frames = o.max_frames + 1  # the end frame is part of the output
        return StreamRequest(
            prompt_ids=self.tokenizer.encode(prompt, add_special_tokens=False),
            audio_items=[t.codes for t in turns],
            max_tokens=frames,
            text=o.text_sampling,
            audio=o.audio_sampling,
            depth=o.depth_sampling,
            seed=o.seed,
            stop_token_ids=[self.spec.audio_eos_id],
            starts_in_audio=True,
            max_frames=frames,  # never forced: CSM ends by its end frame or by max_tokens
            min_frames=o.min_frames,
            tag=o.tag,
        )

    def audio_segments(self, out: StreamOutput, starts_in_audio: bool = True) -> list[np.ndarray]:
        """The generated frames as [K, T] codes, cut like transformers' ``generate(output_audio=
        True)``: before the first frame whose K codes are all the end code, else all of them.
        The 3 non-code tokens a head may emit (2048-2050) are clipped into the codec's range
        (transformers' Mimi would index past its codebook)."""
        codes = self.final_frames(np.asarray(out.aux))
        if not codes.shape[1]:
            raise EngineError("the model ended the audio before its first frame")
        return [codes]

    def final_frames(self, steps: np.ndarray) -> np.ndarray:
        """[S, K] frames so far -> the [K, T] codes that are final: every codebook of a frame is
        sampled in its step (no delays), up to the end frame."""
        ends = np.flatnonzero((steps == self.spec.rules.eos_frame).all(axis=1))
        frames = steps[: ends[0]] if len(ends) else steps
        return np.clip(frames.T, 0, self.spec.pattern.codebook_size - 1).reshape(steps.shape[1], -1)
