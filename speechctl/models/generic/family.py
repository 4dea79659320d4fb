"""speechctl's own layout (``SpeechctlMultiStreamLM``, the embedded ``tiny``): the stream layout,
control tokens and codec directory are written in a ``speechctl`` section of config.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from speechctl.engine.streams import StreamSpec
from speechctl.errors import ModelError
from speechctl.models.family import CfgConvention, CodecLocation, Family, GenerationDefaults


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
        if section.get("text_input", "text") == "text":
            return {}
        return {"reads": section["text_input"], "phoneme_voice": section.get("phoneme_voice", "en-us")}

    def describe(self, config: Mapping[str, Any]) -> dict[str, str]:
        options = self.prompt_options(config)
        if not options:
            return {}
        return {"reads": f"espeak-ng's phonemes of the text (voice {options['phoneme_voice']}; "
                         "needs espeak-ng: apt-get install espeak-ng)"}

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        sub = (config.get("speechctl") or {}).get("codec", "codec")
        return CodecLocation(path / sub, f"{sub}/ in the checkpoint")


FAMILY = MultiStream()
