"""AR+NAR checkpoints in speechctl's own layout with random weights from a fixed seed (test models,
benchmark shapes), built like the generic family's ``tiny``: the AR stage is a generic
checkpoint of one stream (codebook 1, no delay), then config.json names this family and its NAR
stage, ``nar/model.safetensors`` holds the NAR's weights and ``codec/`` a DAC of all K codebooks.
Such a model exercises both stages, the codec and the CLI, but does not speak."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speechctl.models.generic.checkpoint import MultiStreamRecipe, create_multistream_checkpoint
from speechctl.models.valle.family import FAMILY, NAR_DIR


@dataclass
class ValleRecipe:
    """Shape of a random AR+NAR checkpoint. The NAR's shape fields default to the AR's."""

    hidden_size: int = 64  # the AR backbone (Llama)
    num_layers: int = 2
    num_heads: int = 2  # head_dim 32: vLLM's CPU attention has no kernels for 16
    num_kv_heads: int = 1
    intermediate_size: int = 128
    max_position_embeddings: int = 4096
    vocab_size: int | None = None  # default: the byte tokenizer's 264 ids
    num_codebooks: int = 4  # K: codebook 1 from the AR stage, K-1 from the NAR stage
    codebook_size: int = 64
    nar_hidden_size: int | None = None
    nar_num_layers: int | None = None
    nar_num_heads: int | None = None
    nar_num_kv_heads: int | None = None
    nar_intermediate_size: int | None = None
    shared_layers: bool = False  # the NAR runs the AR backbone's layers (own AdaLN, embeddings, heads)
    init_std: float = 0.15
    seed: int = 0
    dtype: str = "float32"
    weights: bool = True  # False: config, tokenizer and codec only (benchmarks: random weights in memory)
    codec: dict = field(default_factory=lambda: MultiStreamRecipe().codec)  # transformers DacConfig fields

    def nar_section(self, vocab_size: int) -> dict:
        if self.shared_layers:
            return {"num_codebooks": self.num_codebooks, "shared_layers": True, "text_vocab_size": vocab_size}
        pick = lambda nar, ar: ar if nar is None else nar  # noqa: E731
        return {
            "num_codebooks": self.num_codebooks, "shared_layers": False, "text_vocab_size": vocab_size,
            "hidden_size": pick(self.nar_hidden_size, self.hidden_size), "num_layers": pick(self.nar_num_layers, self.num_layers),
            "num_heads": pick(self.nar_num_heads, self.num_heads), "num_kv_heads": pick(self.nar_num_kv_heads, self.num_kv_heads),
            "intermediate_size": pick(self.nar_intermediate_size, self.intermediate_size),
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        }


def create_valle_checkpoint(path: str | os.PathLike, recipe: ValleRecipe) -> Path:
    """Write a complete AR+NAR checkpoint directory to ``path``."""
    import transformers

    ar = MultiStreamRecipe(
        hidden_size=recipe.hidden_size, num_layers=recipe.num_layers, num_heads=recipe.num_heads,
        num_kv_heads=recipe.num_kv_heads, intermediate_size=recipe.intermediate_size,
        max_position_embeddings=recipe.max_position_embeddings, num_codebooks=1, codebook_size=recipe.codebook_size,
        delays=(0,), vocab_size=recipe.vocab_size, init_std=recipe.init_std, seed=recipe.seed, dtype=recipe.dtype,
        weights=recipe.weights, codec=recipe.codec,
    )
    path = create_multistream_checkpoint(path, ar)
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config["architectures"] = [FAMILY.architecture]
    config["speechctl"].update(family=FAMILY.name, nar=recipe.nar_section(config["vocab_size"]))
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    codec_config = transformers.DacConfig(n_codebooks=recipe.num_codebooks, codebook_size=recipe.codebook_size, **recipe.codec)
    torch.manual_seed(recipe.seed + 1)
    transformers.DacModel(codec_config).eval().save_pretrained(path / "codec")  # replaces the AR recipe's one-codebook DAC
    if recipe.weights:
        _write_nar_weights(path, config, recipe)
    (path / "speechctl.json").write_text(json.dumps({"recipe": repr(recipe)}, indent=2))
    return path


def _write_nar_weights(path: Path, config: dict, recipe: ValleRecipe) -> None:
    """Matrices N(0, init_std); norm weights 1; the AdaLN projections N(0, init_std) too, so
    each stage scales and shifts its norms differently."""
    from safetensors.torch import save_file

    from speechctl.models.valle.nar import NarConfig, NarTransformer

    gen = torch.Generator().manual_seed(recipe.seed + 2)
    model = NarTransformer(NarConfig.from_config(config))
    tensors = {}
    for name, p in model.state_dict().items():
        if recipe.shared_layers and name.startswith(("layers.", "norm.")) and ".adaln." not in name:
            continue  # the AR backbone's
        if p.dim() >= 2:
            p = torch.randn(p.shape, generator=gen) * recipe.init_std
        tensors[name] = p.to(getattr(torch, recipe.dtype)).contiguous()
    (path / NAR_DIR).mkdir(exist_ok=True)
    save_file(tensors, str(path / NAR_DIR / "model.safetensors"))
