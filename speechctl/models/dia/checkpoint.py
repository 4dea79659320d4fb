"""Random Dia checkpoints in the published format, written by transformers' own classes.

Tests build tiny ones (``DiaForConditionalGeneration.save_pretrained``, transformers'
``DiaTokenizer``, a ``generation_config.json``, a random 44.1 kHz ``DacModel`` as ``codec/`` or
in a hub cache); benchmarks a config of the real size (``DIA_1_6B``: nari-labs/Dia-1.6B-0626's
shapes, no weights: vLLM's ``load_format="dummy"``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

GREEDY_GENERATION = {"do_sample": False}


@dataclass
class DiaRecipe:
    encoder_hidden: int = 64
    encoder_layers: int = 2
    encoder_heads: int = 2
    hidden_size: int = 64
    decoder_layers: int = 2
    heads: int = 4
    kv_heads: int = 2  # GQA, as Dia's 16/4
    head_dim: int = 32  # vLLM's CPU attention has no kernels for 16
    intermediate_size: int = 128
    encoder_positions: int = 256
    decoder_positions: int = 512
    delays: tuple[int, ...] = (0, 8, 9, 10, 11, 12, 13, 14, 15)
    init_std: float = 0.3  # wide, so greedy choices are not float-rounding ties
    eos_boost: float = 1.0  # scales channel 0's EOS row of the head: > 1 makes requests end early
    seed: int = 0
    dtype: str = "float32"
    weights: bool = True  # False: config and tokenizer only (vLLM's load_format="dummy")
    generation: dict = field(default_factory=lambda: dict(GREEDY_GENERATION))
    codec: dict | None = field(default_factory=lambda: dict(  # a tiny DAC at 44.1 kHz (hop 512)
        encoder_hidden_size=8, decoder_hidden_size=16, codebook_size=1024, codebook_dim=4, hidden_size=32,
        downsampling_ratios=[2, 4, 8, 8], upsampling_ratios=[8, 8, 4, 2], n_codebooks=9, sampling_rate=44100))


# nari-labs/Dia-1.6B-0626's shapes (transformers' DiaConfig defaults)
DIA_1_6B = DiaRecipe(encoder_hidden=1024, encoder_layers=12, encoder_heads=16, hidden_size=2048, decoder_layers=18,
                     heads=16, kv_heads=4, head_dim=128, intermediate_size=8192, encoder_positions=1024,
                     decoder_positions=3072, dtype="bfloat16", weights=False, codec=None,
                     generation={"do_sample": True, "temperature": 1.2, "top_k": 45, "top_p": 0.95, "guidance_scale": 3.0})


def dia_config(recipe: DiaRecipe):
    from transformers import DiaConfig

    encoder = dict(hidden_size=recipe.encoder_hidden, num_hidden_layers=recipe.encoder_layers,
                   num_attention_heads=recipe.encoder_heads, num_key_value_heads=recipe.encoder_heads,
                   head_dim=recipe.encoder_hidden // recipe.encoder_heads, intermediate_size=4 * recipe.encoder_hidden,
                   vocab_size=256, max_position_embeddings=recipe.encoder_positions)
    decoder = dict(hidden_size=recipe.hidden_size, num_hidden_layers=recipe.decoder_layers,
                   num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads, head_dim=recipe.head_dim,
                   intermediate_size=recipe.intermediate_size, cross_num_attention_heads=recipe.encoder_heads,
                   cross_head_dim=recipe.encoder_hidden // recipe.encoder_heads,
                   cross_num_key_value_heads=recipe.encoder_heads, cross_hidden_size=recipe.encoder_hidden,
                   vocab_size=1028, num_channels=len(recipe.delays), max_position_embeddings=recipe.decoder_positions)
    return DiaConfig(encoder_config=encoder, decoder_config=decoder, delay_pattern=list(recipe.delays), dtype=recipe.dtype)


def create_dia_checkpoint(path: str | os.PathLike, recipe: DiaRecipe | None = None) -> Path:
    """Write config.json, model.safetensors (random), generation_config.json, the tokenizer and
    (``recipe.codec``) a random DAC in ``codec/`` to ``path``."""
    from transformers import DiaForConditionalGeneration, DiaTokenizer

    from speechctl.models.random_weights import save_random_model

    recipe = recipe or DiaRecipe()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_random_model(path, DiaForConditionalGeneration, dia_config(recipe), recipe, _randomize)
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1026, "eos_token_id": 1024, "pad_token_id": 1025, **recipe.generation}, indent=2))
    DiaTokenizer().save_pretrained(path)
    if recipe.codec is not None:
        create_dac(path / "codec", recipe.codec, recipe.seed)
    return path


def create_dac(path: Path, shape: dict, seed: int = 0) -> Path:
    """A random ``DacModel`` (random codebooks: transformers' init leaves them near-equal)."""
    from transformers import DacConfig, DacModel

    torch.manual_seed(seed)
    model = DacModel(DacConfig(**shape)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "codebook" in name:
                p.copy_(torch.randn(p.shape))
    model.save_pretrained(path)
    return path


def _randomize(model, recipe: DiaRecipe) -> None:
    """Matrices N(0, init_std), norm weights 1 + N(0, 0.3)."""
    from speechctl.models.random_weights import draw_parameters

    draw_parameters(model, recipe.seed, recipe.init_std)
    with torch.no_grad():
        model.logits_dense.weight[1024].mul_(recipe.eos_boost)  # channel 0's EOS
