"""Random weights for checkpoints written by transformers' own classes (test and benchmark
models of the published families)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_random_model(path: Path, model_class, config, recipe, randomize) -> None:
    """A transformers model of ``config`` with weights drawn by ``randomize(model, recipe)`` from
    ``recipe.seed``, saved with ``save_pretrained``; with ``recipe.weights`` False only the config
    (vLLM's ``load_format="dummy"`` makes the weights)."""
    if recipe.weights:
        torch.manual_seed(recipe.seed)
        model = model_class(config).eval()
        randomize(model, recipe)
        model.to(getattr(torch, recipe.dtype)).save_pretrained(path)
    else:
        config.architectures = [model_class.__name__]
        config.save_pretrained(path)


def draw_parameters(model, seed: int, init_std: float, skip: str | None = None) -> torch.Generator:
    """Matrices N(0, init_std), vectors (norm weights, biases) 1 + N(0, 0.3), in name order from
    ``seed``; parameters whose names start with ``skip`` (a codec inside the model) keep
    transformers' init. Returns the generator, for the caller's further draws."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if skip is not None and name.startswith(skip):
                continue
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(noise * init_std if p.dim() >= 2 else 1 + 0.3 * noise)
    return gen


def draw_codebooks(codec, suffix: str, gen: torch.Generator) -> None:
    """Random codebooks for a codec that transformers initialises to zeros (buffers ending in
    ``suffix``), so that its codes decode to distinct sounds."""
    with torch.no_grad():
        for name, buf in codec.named_buffers():
            if name.endswith(suffix):
                buf.copy_(torch.randn(buf.shape, generator=gen))
