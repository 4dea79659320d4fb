"""Model shapes for benchmarks (random weights: speed does not depend on their values)."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from pathlib import Path

from speechctl.models.cache import cached_model
from speechctl.models.generic.checkpoint import MultiStreamRecipe

_BIG = dict(vocab_size=8208, num_codebooks=8, codebook_size=1024, dtype="bfloat16", weights=False)

SHAPES = {
    # The embedded default's shape; runs anywhere (CPU tests).
    "tiny": MultiStreamRecipe(),
    # Llama-3.2-1B-like backbone.
    "llama-1b": MultiStreamRecipe(
        hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, intermediate_size=8192, **_BIG
    ),
    # The Higgs Audio v2 3B backbone shape (28 layers, hidden 3072, 24/8 heads, vocab 8208).
    "higgs-3b": MultiStreamRecipe(
        hidden_size=3072, num_layers=28, num_heads=24, num_kv_heads=8, intermediate_size=8192, **_BIG
    ),
}


def describe(name: str) -> dict:
    r = SHAPES[name]
    return {
        "shape": name,
        "backbone": r.backbone,
        "layers": r.num_layers,
        "hidden": r.hidden_size,
        "heads": f"{r.num_heads}/{r.num_kv_heads}",
        "vocab": r.vocab_size or 264,
        "codebooks": r.num_codebooks,
        "codebook_size": r.codebook_size,
        "dtype": r.dtype,
    }


def shape_checkpoint(name: str, writer: Callable[[Path, MultiStreamRecipe], object]) -> Path:
    """The checkpoint of bench shape ``name`` that ``writer(directory, recipe)`` writes (speechctl's
    model of the shape, or plain vLLM's of its backbone), built once into speechctl's cache.

    At a stable path because vLLM keys its compile cache by the model's path among the rest: in
    a temporary directory every engine on the shape compiled its backbone anew (each of the plain
    baseline's processes, each call on a machine whose compile caches were carried). Keyed by the
    recipe and the writer's module source, so that a changed shape or writer builds anew."""
    recipe = SHAPES[name]
    module = inspect.getmodule(writer)
    identity = f"{recipe!r}\n{module.__name__}.{writer.__qualname__}\n{inspect.getsource(module)}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return cached_model(f"bench-{name}-{writer.__name__}-{key}", lambda directory: writer(directory, recipe))
