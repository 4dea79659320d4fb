"""Acoustic codecs: mono waveforms <-> multi-codebook integer codes ``[K, T]``.

``load_codec(path, device)`` picks the codec class from ``path/config.json``'s ``model_type``.
"""

from .base import Codec
from .registry import load_codec

__all__ = ["Codec", "load_codec"]
