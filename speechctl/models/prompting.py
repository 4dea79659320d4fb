"""The one protocol every family's prompt builder speaks: requests in, readings out.

    builder = checkpoint.prompt_builder(tokenizer)      # models/family.py
    request = builder.tts("Hello", voice_codes=..., audio_sampling=..., max_frames=250)
    request = builder.asr(codes)                        # families that transcribe
    codes = builder.audio_segments(output)              # [[K, T], ...] the audio it generated
    codes = builder.final_frames(steps_so_far)          # [K, T] the frames already final (streaming)
    text = builder.text(output)

A builder subclasses ``PromptBuilder`` and implements what its format has (``build_tts`` takes
the request's ``TtsOptions``; ``tts`` here spells them out once for every family); what it lacks
answers with a one-line ``InputError``. Builders import neither torch nor vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from speechctl.engine.params import GREEDY, NO_GUIDANCE, Guidance, Sampling
from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.streams import StreamSpec
from speechctl.errors import InputError


@dataclass(frozen=True)
class VoicePrompt:
    """Speech that a request's new speech follows on from (a checkpoint's own voice prompt): what
    it says and its codes [K, T]. The model reads ``text`` and then the request's text, and
    continues the audio; its waveform is decoded with the prompt's before it (the codec's
    context) and starts ``lead_frames`` before the prompt's end (the pause it ends with)."""

    text: str
    codes: np.ndarray
    lead_frames: int = 0

    def decodable(self, segment: np.ndarray, hop_length: int) -> tuple[np.ndarray, int]:
        """(the codes to decode for speech ``segment`` [K, T] that followed on from this prompt,
        the samples to drop from their waveform): the prompt's codes go first (the codec's
        context at the seam), and the waveform starts ``lead_frames`` before their end."""
        return np.concatenate([self.codes, segment], axis=1), self.samples_before(hop_length)

    def samples_before(self, hop_length: int) -> int:
        """The samples of the prompt's waveform before the new speech's (its lead-in kept)."""
        return (self.codes.shape[1] - self.lead_frames) * hop_length


@dataclass(frozen=True)
class TtsOptions:
    """What a TTS request asks besides its text, as every family's ``build_tts`` receives it."""

    voice_codes: np.ndarray | None = None  # [K, T] codec codes of a reference voice
    voice_text: str | None = None  # its transcript, where the format takes one
    text_sampling: Sampling = GREEDY
    audio_sampling: Sampling = GREEDY
    depth_sampling: Sampling | None = None  # a depth decoder's codebooks; None: the family's choice
    seed: int | None = None
    max_frames: int = 1000
    min_frames: int = 1  # the family's own minimum where the caller named none
    guidance: Guidance = NO_GUIDANCE
    repetition: tuple[int, int] | None = None  # repetition-aware sampling (window, max_repeat)
    continues: VoicePrompt | None = None  # speech to follow on from, where the family can
    tag: object = None


_TTS_FIELDS = frozenset(f.name for f in fields(TtsOptions))


class PromptBuilder:
    title = "this model"  # for messages
    voice_prompt: VoicePrompt | None = None  # the checkpoint's own, where its family has one (``Speech.continuation``)
    min_frames = 1  # the audio may not end before this many frames (unless the caller says)
    cuts_text = True  # a long text may be spoken in pieces (speechctl.text); False: in one request

    def __init__(self, spec: StreamSpec, tokenizer):
        self.spec = spec
        self.tokenizer = tokenizer

    def tts(self, text: str, *, min_frames: int | None = None, **options) -> StreamRequest:
        """A TTS request for ``text``: ``options`` are ``TtsOptions``' fields (``min_frames``
        None: the family's), and a family's own keywords besides (CSM: ``speaker``,
        ``context``); any other keyword is a TypeError naming it."""
        family = {k: options.pop(k) for k in list(options) if k not in _TTS_FIELDS}
        o = TtsOptions(min_frames=self.min_frames if min_frames is None else min_frames, **options)
        return self.build_tts(text, o, **family)

    def build_tts(self, text: str, o: TtsOptions) -> StreamRequest:
        raise NotImplementedError

    def asr(self, codes: np.ndarray, *, text_sampling: Sampling = GREEDY, seed: int | None = None,
            max_tokens: int = 256, tag: object = None) -> StreamRequest:
        raise InputError(f"{self.title} generates speech; it does not transcribe (use a Whisper model)")

    def audio_segments(self, out: StreamOutput, starts_in_audio: bool = True) -> list[np.ndarray]:
        """Every audio segment of a finished output as [K, T] codes."""
        raise NotImplementedError

    def final_frames(self, steps: np.ndarray) -> np.ndarray:
        """[S, K] steps of an audio segment still being generated -> the [K, T] frames that are
        already final."""
        raise NotImplementedError

    def text(self, out: StreamOutput) -> str:
        return ""
