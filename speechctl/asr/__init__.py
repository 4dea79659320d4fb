"""Speech recognition with real Whisper weights on vLLM.

* :mod:`speechctl.asr.ct2` reads CTranslate2 model files; :mod:`speechctl.asr.convert` turns the
  bundled Whisper tiny.en into a Hugging Face checkpoint; :mod:`speechctl.asr.probe` checks it
  against numbers from the original implementation; :mod:`speechctl.asr.checkpoint` names models
  and caches the conversion.
* :mod:`speechctl.asr.whisper` runs it on vLLM (:class:`WhisperAsr`), with Whisper's token
  suppression (:mod:`speechctl.asr.suppress`).
* :mod:`speechctl.asr.segments` cuts long audio into windows and writes txt/json/srt/vtt.
"""

from __future__ import annotations

from speechctl.asr.checkpoint import BUILTIN, DEFAULT_ASR_MODEL, ensure_whisper, is_whisper, whisper_dir
from speechctl.asr.whisper import WhisperAsr, WhisperConfig

__all__ = [
    "BUILTIN",
    "DEFAULT_ASR_MODEL",
    "WhisperAsr",
    "WhisperConfig",
    "ensure_whisper",
    "is_whisper",
    "whisper_dir",
]
