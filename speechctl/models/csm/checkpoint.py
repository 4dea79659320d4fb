"""Random CSM checkpoints in the published format, written by transformers' own classes.

Tests build tiny ones (``CsmForConditionalGeneration.save_pretrained``, its Mimi codec inside);
benchmarks a config of the real size (``CSM_1B``: sesame/csm-1b's shapes, no weights: vLLM's
``load_format="dummy"``). The tokenizer is a byte tokenizer carrying the special tokens of the
prompt format, so no model hub is needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|end_of_text|>", "<|begin_of_text|>", "<|AUDIO|>", "<|audio_eos|>", "<|pad|>"]
LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
    "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
}


def _id(token: str) -> int:
    return 256 + SPECIAL_TOKENS.index(token)


@dataclass
class CsmRecipe:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2  # head_dim 32: vLLM's CPU attention has no kernels for 16
    num_kv_heads: int = 1
    head_dim: int = 32
    intermediate_size: int = 128
    depth_hidden_size: int = 64
    depth_layers: int = 2
    depth_heads: int = 2
    depth_kv_heads: int = 1
    depth_intermediate_size: int = 128
    text_vocab_size: int = 0  # at least the byte tokenizer's ids
    num_codebooks: int = 4
    codebook_size: int = 32  # Mimi's codes; each codebook's vocabulary adds 3 (as 2048 -> 2051)
    max_position_embeddings: int = 2048
    init_std: float = 0.3  # wide, so greedy choices are not float-rounding ties
    silent_depth: bool = False  # zero the depth decoder's final norm: codebooks 1.. always 0
    seed: int = 0
    dtype: str = "float32"
    weights: bool = True  # False: config and tokenizer only (vLLM's load_format="dummy")
    mimi: dict = field(
        default_factory=lambda: dict(
            hidden_size=32, num_filters=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            head_dim=16, intermediate_size=64, codebook_dim=16, vector_quantization_hidden_dimension=16,
            upsample_groups=32, sliding_window=16,
        )
    )


# sesame/csm-1b's shapes: a Llama-3.2-1B backbone, a 4-layer 1024-wide depth decoder, 32 x 2051.
CSM_1B = CsmRecipe(
    hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, intermediate_size=8192,
    depth_hidden_size=1024, depth_layers=4, depth_heads=8, depth_kv_heads=2, depth_intermediate_size=8192,
    text_vocab_size=128256, num_codebooks=32, codebook_size=2048, dtype="bfloat16", weights=False,
    mimi={},  # transformers' defaults are Mimi's published shape
)


def csm_config(recipe: CsmRecipe):
    from transformers import CsmConfig

    V = recipe.codebook_size + 3
    depth = dict(
        num_codebooks=recipe.num_codebooks, backbone_hidden_size=recipe.hidden_size, vocab_size=V,
        hidden_size=recipe.depth_hidden_size, intermediate_size=recipe.depth_intermediate_size,
        num_hidden_layers=recipe.depth_layers, num_attention_heads=recipe.depth_heads,
        num_key_value_heads=recipe.depth_kv_heads, head_dim=recipe.depth_hidden_size // recipe.depth_heads,
        max_position_embeddings=recipe.num_codebooks + 1, rope_parameters=dict(LLAMA3_ROPE),
    )
    mimi = dict(model_type="mimi", codebook_size=recipe.codebook_size, num_quantizers=recipe.num_codebooks, **recipe.mimi)
    return CsmConfig(
        num_codebooks=recipe.num_codebooks,
        vocab_size=V,
        text_vocab_size=max(recipe.text_vocab_size, 256 + len(SPECIAL_TOKENS)),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_parameters=dict(LLAMA3_ROPE),
        pad_token_id=_id("<|pad|>"),
        bos_token_id=_id("<|begin_of_text|>"),
        eos_token_id=None,
        audio_token_id=_id("<|AUDIO|>"),
        audio_eos_token_id=_id("<|audio_eos|>"),
        codebook_pad_token_id=V - 1,
        codebook_eos_token_id=0,
        depth_decoder_config=depth,
        codec_config=mimi,
        dtype=recipe.dtype,
    )


def create_csm_checkpoint(path: str | os.PathLike, recipe: CsmRecipe | None = None) -> Path:
    """Write config.json, model.safetensors (random, Mimi included) and the tokenizer to ``path``."""
    from transformers import CsmForConditionalGeneration

    from speechctl.models.random_weights import save_random_model
    from speechctl.models.tokenizer import byte_tokenizer

    recipe = recipe or CsmRecipe()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_random_model(path, CsmForConditionalGeneration, csm_config(recipe), recipe, _randomize)
    tok = byte_tokenizer(SPECIAL_TOKENS)
    tok.eos_token, tok.bos_token, tok.pad_token = "<|end_of_text|>", "<|begin_of_text|>", "<|pad|>"
    tok.save_pretrained(path)
    return path


def _randomize(model, recipe: CsmRecipe) -> None:
    """LM matrices N(0, init_std), norm weights 1 + N(0, 0.3); Mimi keeps transformers' init but
    gets random codebooks (transformers initialises them to zeros)."""
    from speechctl.models.random_weights import draw_codebooks, draw_parameters

    gen = draw_parameters(model, recipe.seed, recipe.init_std, skip="codec_model.")
    draw_codebooks(model.codec_model, "embed_sum", gen)
    with torch.no_grad():
        if recipe.silent_depth:
            model.depth_decoder.model.norm.weight.zero_()
