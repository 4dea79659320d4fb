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
