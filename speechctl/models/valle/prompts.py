"""Prompts of the AR+NAR family, and what its NAR stage reads from a request.

    AR:   <bos> <|tts|> text <|audio_bos|> [<|audio|> <|audio_eos|> <|audio_bos|>]   -> codebook 1 ..., EOS, <|audio_eos|>
    NAR:  text bytes, the voice's K codebooks, codebooks 1..j-1 of the utterance       -> codebook j  (j = 2..K)

``text`` is the voice's transcript and the text to speak, joined by a space, where the caller gives
a transcript (VALL-E reads both before the prompt's codes). ``<|audio|>`` is the voice's
placeholder: vLLM expands it to codebook 1 of the voice (T codes and EOS, ``model.py``); the
request carries all K codebooks of it for the NAR stage. The final ``<|audio_bos|>`` opens the
generated audio (ESPnet's VALL-E has a start token in that place). Order as in ESPnet's speech-LM
layout: the conditions (text, speaker prompt), then the target.

Outputs of the two-stage engine carry all K codebooks frame-aligned (``family.full_spec``), so
reading them back (``audio_segments``, ``final_frames``) is the generic family's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from speechctl.engine.params import GREEDY, Sampling
from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.errors import InputError
from speechctl.models.generic.prompts import MultiStreamPrompts
from speechctl.models.prompting import PromptBuilder, TtsOptions


class NarInputs(NamedTuple):
    """What the NAR stage needs of a request besides its codebook 1."""

    text_ids: np.ndarray  # [L] the text the AR stage read
    prompt_codes: np.ndarray  # [K, Tp] the voice's codes (Tp = 0 without a voice)
    sampling: Sampling  # of codebooks 2..K


class VallePrompts(MultiStreamPrompts):
    title = "the AR+NAR model"

    def __init__(self, spec: StreamSpec, tokenizer):
        super().__init__(spec, tokenizer)
        ar = replace(spec, pattern=DelayPattern((0,), spec.pattern.codebook_size))
        self.ar = MultiStreamPrompts(ar, tokenizer)  # reads the AR stage's outputs (codebook 1)

    def build_tts(self, text: str, o: TtsOptions) -> StreamRequest:
        """``audio_sampling``: codebook 1 (the AR stage); ``depth_sampling``: codebooks 2..K (the
        NAR stage; greedy by default, as VALL-E decodes them)."""
        if o.repetition is not None:
            raise InputError(f"{self.title} has no repetition-aware sampling")
        s = self.spec
        words = text if o.voice_text is None else f"{o.voice_text} {text}"
        ids = [s.bos_id, s.task_ids["tts"], *self._text_ids(words), s.audio_bos_id]
        items = []
        if o.voice_codes is not None:
            items.append(self._voice(o.voice_codes))
            ids += [s.audio_id, s.audio_eos_id, s.audio_bos_id]
        elif o.voice_text is not None:
            raise InputError("voice_text: a transcript needs its voice (voice_codes)")
        return StreamRequest(
            prompt_ids=ids,
            audio_items=items,
            max_tokens=o.max_frames + 2,  # T codes, the EOS step, <|audio_eos|>
            text=o.text_sampling,
            audio=o.audio_sampling,
            depth=o.depth_sampling if o.depth_sampling is not None else GREEDY,  # the NAR stage takes it
            seed=o.seed,
            stop_token_ids=[s.audio_eos_id],
            starts_in_audio=True,
            max_frames=o.max_frames,
            min_frames=o.min_frames,
            guidance=o.guidance,
            uncond_prompt_ids=self.unconditional(ids, items) if o.guidance.enabled else None,
            tag=o.tag,
        )

    def _voice(self, codes) -> np.ndarray:
        codes = np.asarray(codes)
        K, C = self.spec.num_codebooks, self.spec.pattern.codebook_size
        if codes.ndim != 2 or codes.shape[0] != K or codes.shape[1] == 0:
            raise InputError(f"voice codes: expected [{K}, T>0] codes of the checkpoint's codec, got shape {list(codes.shape)}")
        if codes.min() < 0 or codes.max() >= C:
            raise InputError(f"voice codes: codes must lie in [0, {C})")
        return codes.astype(np.int64)

    def asr(self, codes, **options):
        return PromptBuilder.asr(self, codes, **options)

    def chat(self, codes, **options):
        raise InputError(f"{self.title} speaks text; it has no speech chat")

    # -- what the NAR stage reads --------------------------------------------------------------

    def nar_inputs(self, request: StreamRequest) -> NarInputs:
        """The text, voice codes and NAR sampling of a request made by ``tts``."""
        s = self.spec
        ids = request.prompt_ids
        end = ids.index(s.audio_bos_id)  # the text runs from after <|tts|> to the first <|audio_bos|>
        prompt = request.audio_items[0] if request.audio_items else np.zeros((s.num_codebooks, 0), np.int64)
        return NarInputs(np.asarray(ids[2:end], np.int64), np.asarray(prompt, np.int64), request.depth or GREEDY)

    def first_codebook(self, out: StreamOutput) -> np.ndarray:
        """The AR stage's output -> its codebook 1, [T] codes (EngineError if malformed)."""
        (codes,) = self.ar.audio_segments(out, starts_in_audio=True)
        return codes[0]

    def full_output(self, ar_out: StreamOutput, codes: np.ndarray) -> StreamOutput:
        """The AR stage's output with all K codebooks [K, T] in its auxiliary streams, laid out
        frame-aligned like the AR's codebook 1: T code steps, the EOS step, the <|audio_eos|> step."""
        pat = self.spec.pattern
        steps = pat.build(codes).T  # [T + 1, K]
        aux = np.concatenate([steps, np.full((1, pat.num_streams), pat.pad, np.int64)])
        return replace(ar_out, aux=aux)
