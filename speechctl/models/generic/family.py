"""speechctl's own layout (``SpeechctlMultiStreamLM``, the embedded ``tiny``): the stream layout,
control tokens and codec directory are written in a ``speechctl`` section of config.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from speechctl.engine.streams import StreamSpec
from speechctl.errors import ModelError
from speechctl.models.family import CfgConvention, CodecLocation, Family, GenerationDefaults
from speechctl.models.prompting import VoicePrompt


class MultiStream(Family):
    name = "multistream"
    title = "the multi-stream model"
    description = "generic multi-stream LM (speechctl's own layout; `tiny`)"
    architecture = "SpeechctlMultiStreamLM"
    model_class = "speechctl.models.generic.model:MultiStreamForCausalLM"
    prompts = "speechctl.models.generic.prompts:MultiStreamPrompts"
    cfg = CfgConvention()  # l_u + s·(l_c − l_u), as the paper's families

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        return StreamSpec.from_dict(config.get("speechctl") or {})

    def defaults(self, generation: dict | None, config: Mapping[str, Any] | None = None) -> GenerationDefaults:
        """As every family's, and the ``speechctl`` section's ``max_piece_chars`` (a voice that
        reads best in shorter pieces than speechctl's default)."""
        base = super().defaults(generation, config)
        chars = ((config or {}).get("speechctl") or {}).get("max_piece_chars")
        if chars is None:
            return base
        if not isinstance(chars, int) or isinstance(chars, bool) or chars < 1:
            raise ModelError(f"config.json: speechctl.max_piece_chars must be a positive integer, got {chars!r}")
        return replace(base, max_piece_chars=chars)

    def prompt_options(self, config: Mapping[str, Any]) -> dict:
        section = config.get("speechctl") or {}
        options = {}
        if section.get("text_input", "text") != "text":
            options = {"reads": section["text_input"], "phoneme_voice": section.get("phoneme_voice", "en-us")}
        if "voice_prompt" in section:
            options["voice_prompt"] = voice_prompt(section["voice_prompt"], self.spec(config))
        return options

    def describe(self, config: Mapping[str, Any]) -> dict[str, str]:
        options, described = self.prompt_options(config), {}
        if "reads" in options:
            described["reads"] = (f"espeak-ng's phonemes of the text (voice {options['phoneme_voice']}; "
                                  "needs espeak-ng: apt-get install espeak-ng)")
        if "voice_prompt" in options:
            prompt = options["voice_prompt"]
            described["voice prompt"] = (f"speech follows on from its own {prompt.codes.shape[1]} frames of "
                                         f"\"{prompt.text}\" (no --voice given, no guidance)")
        return described

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        sub = (config.get("speechctl") or {}).get("codec", "codec")
        return CodecLocation(path / sub, f"{sub}/ in the checkpoint")


def voice_prompt(entry: Any, spec: StreamSpec) -> VoicePrompt:
    """config.json's ``speechctl.voice_prompt``: ``{"text": what it says, "codes": [K][T] its
    codec codes, "lead_frames": the frames of its closing pause the new speech keeps}``."""
    try:
        codes = np.asarray(entry["codes"], dtype=np.int64)
        prompt = VoicePrompt(str(entry["text"]), codes, int(entry.get("lead_frames", 0)))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelError(f"config.json: speechctl.voice_prompt: {e!r}") from None
    try:  # what the engine will lay out: codes of every stream, in range, a lead stream without delay
        spec.pattern.continuation(codes)
    except ValueError as e:
        raise ModelError(f"config.json: speechctl.voice_prompt.codes: {e}") from None
    if not 0 <= prompt.lead_frames <= codes.shape[1]:
        raise ModelError(f"config.json: speechctl.voice_prompt.lead_frames must be 0..{codes.shape[1]}, got {prompt.lead_frames}")
    return prompt


FAMILY = MultiStream()
