"""speechctl's model cache on disk: models built or converted on first use (the embedded ``tiny``,
``tiny-lm``, the converted Whisper weights)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("SPEECHCTL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "speechctl"
    )
    return Path(root)


def cached_model(name: str, build, marker: str = "config.json") -> Path:
    """``cache_dir()/models/name``, built on first use by ``build(tmp_dir)`` and moved into place
    atomically (``marker`` exists once it is complete; a concurrent builder may win the race)."""
    target = cache_dir() / "models" / name
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
