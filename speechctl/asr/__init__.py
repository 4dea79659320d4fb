"""Speech recognition with real Whisper weights on vLLM.

* :mod:`speechctl.asr.ct2` reads CTranslate2 model files; :mod:`speechctl.asr.convert` turns the
  bundled Whisper tiny.en into a Hugging Face checkpoint; :mod:`speechctl.asr.probe` checks it
  against numbers from the original implementation; :mod:`speechctl.asr.checkpoint` names models
  and caches the conversion.
* :mod:`speechctl.asr.whisper` runs it on vLLM (:class:`WhisperAsr`); its decoding
  (:class:`WhisperOptions`: beam search, temperature fallback, no-speech, context, language,
  timestamps) is :mod:`speechctl.asr.transcript` (per input), :mod:`speechctl.asr.decoder` (the
  rules, inside vLLM's step) and :mod:`speechctl.asr.beam`; word timestamps
  :mod:`speechctl.asr.timing`; one encoder pass per window :mod:`speechctl.asr.encoder_cache`. The
  vLLM internals it needs are shims in :mod:`speechctl.engine.vllm_compat`.
* :mod:`speechctl.asr.segments` cuts long audio into windows and writes txt/json/srt/vtt.
"""

from __future__ import annotations

from speechctl.asr.checkpoint import BUILTIN, DEFAULT_ASR_MODEL, ensure_whisper, is_whisper, resolve_whisper, whisper_dir
from speechctl.asr.options import PLAIN_GREEDY, WhisperOptions
from speechctl.asr.whisper import WhisperAsr, WhisperConfig

__all__ = [
    "BUILTIN",
    "DEFAULT_ASR_MODEL",
    "WhisperAsr",
    "WhisperConfig",
    "PLAIN_GREEDY",
    "WhisperOptions",
    "ensure_whisper",
    "is_whisper",
    "resolve_whisper",
    "whisper_dir",
]
