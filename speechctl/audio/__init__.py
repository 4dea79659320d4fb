"""Audio I/O: read any audio as float32 mono at a given rate; write wav/flac atomically."""

from __future__ import annotations

from speechctl.audio.io import (
    AUDIO_FORMATS,
    DEFAULT_AUDIO_FORMAT,
    atomic_write,
    check_writable,
    duration_seconds,
    read_audio,
    read_audio_bytes,
    resolve_audio_format,
    write_audio,
    write_json_atomic,
    write_npy_atomic,
    write_text_atomic,
)

__all__ = [
    "AUDIO_FORMATS",
    "DEFAULT_AUDIO_FORMAT",
    "atomic_write",
    "check_writable",
    "duration_seconds",
    "read_audio",
    "read_audio_bytes",
    "resolve_audio_format",
    "write_audio",
    "write_json_atomic",
    "write_npy_atomic",
    "write_text_atomic",
]
