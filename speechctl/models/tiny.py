"""The embedded default model ``tiny``: speechctl's own layout with random weights, created on first
use in the cache. It exercises the whole pipeline in seconds but does not speak."""

from __future__ import annotations

from pathlib import Path

from speechctl.models.cache import cached_model
from speechctl.models.generic.checkpoint import MultiStreamRecipe, create_multistream_checkpoint

TINY_VERSION = 1  # bump when the recipe changes, so caches rebuild


def ensure_tiny() -> Path:
    """The embedded default model, created on first use in the cache."""
    return cached_model(f"tiny-v{TINY_VERSION}", lambda tmp: create_multistream_checkpoint(tmp, MultiStreamRecipe()))
