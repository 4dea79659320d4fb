"""Prompt layout of the generic multi-stream family, and reading its outputs back.

    TTS:  <bos> <|tts|> [<|audio_bos|> voice <|audio_eos|>] text <|audio_bos|>   -> audio steps, <|audio_eos|>
    TTS, continuing a voice prompt:
          <bos> <|tts|> prompt_text text <|audio_bos|> prompt_audio              -> audio steps, <|audio_eos|>
    ASR:  <bos> <|asr|> <|audio_bos|> audio <|audio_eos|>                         -> text, <eos>

``voice`` and ``audio`` are one ``<|audio|>`` placeholder each; vLLM expands it to the item's
delay-interleaved steps (``prompt_audio`` to its first steps only, open-ended: the model goes on
with its speech, ``DelayPattern.continuation``). An audio segment in an output is the run of ``<|audio|>`` steps between
``<|audio_bos|>`` (or the start, for TTS) and ``<|audio_eos|>``.
"""

from __future__ import annotations

import numpy as np

from speechctl.engine.params import GREEDY, Sampling
from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.streams import complete_frames
from speechctl.errors import EngineError, InputError, ModelError
from speechctl.models.prompting import PromptBuilder, TtsOptions, VoicePrompt


class MultiStreamPrompts(PromptBuilder):
    """``reads``: what the model reads of a text, its bytes ("text") or espeak-ng's phonemes of
    it ("phonemes", in the espeak-ng voice ``phoneme_voice``: a voice trained so, config.json's
    ``speechctl.text_input``)."""

    def __init__(self, spec, tokenizer, reads: str = "text", phoneme_voice: str = "en-us",
                 voice_prompt: VoicePrompt | None = None):
        super().__init__(spec, tokenizer)
        from speechctl.phonemes import READS

        if reads not in READS:
            raise ModelError(f"config.json: speechctl.text_input={reads!r}: one of {', '.join(READS)}")
        self.reads, self.phoneme_voice = reads, phoneme_voice
        # the checkpoint's own voice prompt (config.json's speechctl.voice_prompt): the speech a
        # request without a voice of its own follows on from (``Speech.continuation``)
        self.voice_prompt = voice_prompt

    def _text_ids(self, text: str) -> list[int]:
        if self.reads == "phonemes":
            from speechctl.phonemes import phonemize

            text = phonemize(text, self.phoneme_voice)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _audio_ids(self) -> list[int]:
        s = self.spec
        return [s.audio_bos_id, s.audio_id, s.audio_eos_id]

    def build_tts(self, text: str, o: TtsOptions) -> StreamRequest:
        if o.voice_text is not None:
            raise InputError("this model's prompts take no voice transcript (voice_text)")
        if o.depth_sampling is not None:
            raise InputError("this model has no depth decoder (depth_sampling)")
        s = self.spec
        ids = [s.bos_id, s.task_ids["tts"]]
        items, lead_in = [], None
        if o.continues is not None:
            # VALL-E's way: the prompt's text and then this one, the prompt's speech continued
            if o.voice_codes is not None or o.guidance.enabled:
                raise InputError("speech that continues a voice prompt takes no other voice and no guidance")
            lead_in = s.pattern.continuation(o.continues.codes)[1]
            ids += self._text_ids(f"{o.continues.text} {text}") + [s.audio_bos_id, s.audio_id]
            items.append(o.continues.codes)
        else:
            if o.voice_codes is not None:
                ids += self._audio_ids()
                items.append(o.voice_codes)
            ids += self._text_ids(text) + [s.audio_bos_id]
        return StreamRequest(
            continues=o.continues is not None,
            lead_in=lead_in,
            repetition=o.repetition,
            guidance=o.guidance,
            uncond_prompt_ids=self.unconditional(ids, items) if o.guidance.enabled else None,
            prompt_ids=ids,
            audio_items=items,
            max_tokens=o.max_frames + s.pattern.max_delay + 2,
            text=o.text_sampling,
            audio=o.audio_sampling,
            seed=o.seed,
            stop_token_ids=[s.audio_eos_id],
            starts_in_audio=True,
            max_frames=o.max_frames,
            min_frames=o.min_frames,
            tag=o.tag,
        )

    def unconditional(self, prompt_ids: list[int], audio_items: list[np.ndarray]) -> list[int]:
        """The CFG partner of a prompt: the condition (text, voice) dropped to PAD, same length
        once audio items are expanded, ending like the prompt (so both continue in the same
        mode). Equal-length unconditional prompts are identical, so they share cached KV."""
        steps = sum(self.spec.pattern.num_steps(np.shape(c)[1]) for c in audio_items)
        length = len(prompt_ids) - len(audio_items) + steps
        return [self.spec.pad_id] * (length - 1) + [prompt_ids[-1]]

    def asr(
        self,
        codes: np.ndarray,
        *,
        text_sampling: Sampling = GREEDY,
        seed: int | None = None,
        max_tokens: int = 256,
        tag: object = None,
    ) -> StreamRequest:
        s = self.spec
        return StreamRequest(
            prompt_ids=[s.bos_id, s.task_ids["asr"], *self._audio_ids()],
            audio_items=[codes],
            max_tokens=max_tokens,
            text=text_sampling,
            seed=seed,
            stop_token_ids=[s.eos_id],
            allow_audio=False,
            tag=tag,
        )

    def chat(
        self,
        codes: np.ndarray,
        *,
        reply_in_audio: bool = False,
        text_sampling: Sampling = GREEDY,
        audio_sampling: Sampling = GREEDY,
        seed: int | None = None,
        max_tokens: int = 512,
        max_frames: int = 1000,
        tag: object = None,
    ) -> StreamRequest:
        """Unified speech chat: ``<bos> <|audio_bos|> <|audio|> <|audio_eos|>`` with the user's
        audio as codec codes; the model answers with text and/or audio segments (read them with
        ``audio_segments(out, starts_in_audio=reply_in_audio)``) and ends with ``<eos>``.
        ``reply_in_audio`` appends ``<|audio_bos|>``: the reply opens with speech."""
        s = self.spec
        ids = [s.bos_id, *self._audio_ids()] + ([s.audio_bos_id] if reply_in_audio else [])
        return StreamRequest(
            prompt_ids=ids,
            audio_items=[codes],
            max_tokens=max_tokens,
            text=text_sampling,
            audio=audio_sampling,
            seed=seed,
            stop_token_ids=[s.eos_id],
            starts_in_audio=reply_in_audio,
            allow_audio=True,
            max_frames=max_frames,
            tag=tag,
        )

    def audio_segments(self, out: StreamOutput, starts_in_audio: bool) -> list[np.ndarray]:
        """De-interleave every audio segment of an output into [K, T] codes (of speech that
        continues a voice prompt, its own frames)."""
        s = self.spec
        segments, start = [], 0 if starts_in_audio else None
        for i, tok in enumerate(out.token_ids):
            if tok == s.audio_bos_id:
                start = i + 1
            elif tok == s.audio_eos_id and start is not None:
                steps = out.aux[start:i].T.copy()
                if start == 0:  # before each delay, the rules' tokens: BOS, or continued speech's frames
                    for k, d in enumerate(s.pattern.delays):
                        steps[k, :d] = s.pattern.bos
                try:
                    segments.append(s.pattern.revert(steps))
                except ValueError as e:
                    raise EngineError(f"audio streams came out malformed: {e}") from None
                start = None
        if start is not None:
            raise EngineError("generation stopped before the audio ended (raise max_tokens)")
        return segments

    def final_frames(self, steps: np.ndarray) -> np.ndarray:
        """The frames of an audio segment still being generated that are already final, from its
        steps so far ([S, K]): frame t once step t + max(delays) exists on every stream, up to the
        first frame holding a BOS/EOS/PAD where a code belongs (the audio has ended there)."""
        pat = self.spec.pattern
        codes = complete_frames(steps, pat.delays)
        bad = ((codes < 0) | (codes >= pat.codebook_size)).any(axis=0)
        return codes[:, : int(np.argmax(bad)) if bad.any() else codes.shape[1]]

    def text(self, out: StreamOutput) -> str:
        return self.tokenizer.decode(out.token_ids, skip_special_tokens=True).strip()
