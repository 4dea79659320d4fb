"""Random Higgs Audio v2 checkpoints in the published format, written by transformers' own classes.

Tests build tiny ones (``save_pretrained`` of ``HiggsAudioV2ForConditionalGeneration`` and
``HiggsAudioV2TokenizerModel``) and benchmarks a config of the real size (``HIGGS_3B``, no
weights: vLLM's ``load_format="dummy"``). The tokenizer is a byte tokenizer carrying the Llama-3
special tokens the prompt format uses, so no model hub is needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

SPECIAL_TOKENS = [
    "<|end_of_text|>",  # pad
    "<|begin_of_text|>",  # bos
    "<|eot_id|>",  # eos
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|scene_desc_start|>",
    "<|scene_desc_end|>",
    "<|audio_out_bos|>",
    "<|AUDIO_OUT|>",
    "<|audio_eos|>",
    "<|reserved_special_token_6|>",  # the audio "delay" token
    "<|audio_bos|>",
    "<|AUDIO|>",
]


def _id(token: str) -> int:
    return 256 + SPECIAL_TOKENS.index(token)


@dataclass
class HiggsRecipe:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2  # head_dim 32: vLLM's CPU attention has no kernels for 16
    num_kv_heads: int = 1
    head_dim: int = 32
    intermediate_size: int = 128
    vocab_size: int = 0  # text vocabulary; at least the byte tokenizer's ids
    num_codebooks: int = 4
    codebook_size: int = 32  # codes; the model's stream vocabulary adds BOS and EOS
    max_position_embeddings: int = 2048
    init_std: float = 0.3  # wide, so greedy choices are not float-rounding ties
    seed: int = 0
    dtype: str = "float32"
    weights: bool = True  # False: config and tokenizer only (vLLM's load_format="dummy")
    codec: bool = True  # a tiny random codec in audio_tokenizer/ (matching K and codebook_size)
    codec_config: dict = field(
        default_factory=lambda: dict(
            # 16 kHz, hop 640: 25 frames/s; HuBERT's 50 frames/s halved (semantic_downsample_factor 2)
            acoustic_model_config=dict(
                encoder_hidden_size=8, downsampling_ratios=[2, 4, 8, 10], decoder_hidden_size=32,
                upsampling_ratios=[10, 8, 4, 2], hidden_size=16,
            ),
            semantic_model_config=dict(
                model_type="hubert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, conv_dim=(16,) * 7, num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4,
            ),
            codebook_dim=8,
            sample_rate=16000,
            semantic_sample_rate=16000,
        )
    )


# The published 3B model's shapes (bosonai/higgs-audio-v2-generation-3B-base), random weights.
HIGGS_3B = HiggsRecipe(
    hidden_size=3072, num_layers=28, num_heads=24, num_kv_heads=8, head_dim=128, intermediate_size=8192,
    vocab_size=128256, num_codebooks=8, codebook_size=1024, dtype="bfloat16", weights=False, codec=False,
)

# The published audio tokenizer's shape (bosonai/higgs-audio-v2-tokenizer): 24 kHz, DAC strides
# 8·5·4·2·3 = hop 960, so 25 frames/s; HuBERT and the other sizes are transformers' defaults.
# transformers' own default strides stop at 8·5·4·2 (hop 320, 75 frames/s): a codec with three
# times the frames per second of audio, which is not the one the 3B model speaks through.
HIGGS_TOKENIZER_CONFIG = dict(
    acoustic_model_config=dict(downsampling_ratios=[8, 5, 4, 2, 3], upsampling_ratios=[8, 5, 4, 2, 3]),
)
HIGGS_3B_WITH_TOKENIZER = replace(HIGGS_3B, codec=True, codec_config=HIGGS_TOKENIZER_CONFIG)


def higgs_config(recipe: HiggsRecipe):
    from transformers import HiggsAudioV2Config

    C = recipe.codebook_size
    return HiggsAudioV2Config(
        vocab_size=max(recipe.vocab_size, 256 + len(SPECIAL_TOKENS)),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_position_embeddings,
        num_codebooks=recipe.num_codebooks,
        codebook_size=C + 2,
        audio_stream_bos_id=C,
        audio_stream_eos_id=C + 1,
        pad_token_id=_id("<|end_of_text|>"),
        bos_token_id=_id("<|begin_of_text|>"),
        eos_token_id=_id("<|eot_id|>"),
        audio_bos_token_id=_id("<|audio_out_bos|>"),
        audio_token_id=_id("<|AUDIO_OUT|>"),
        audio_delay_token_id=_id("<|reserved_special_token_6|>"),
        dtype=recipe.dtype,
    )


def create_higgs_checkpoint(path: str | os.PathLike, recipe: HiggsRecipe | None = None) -> Path:
    """Write config.json, model.safetensors (random), tokenizer and audio_tokenizer/ to ``path``."""
    from transformers import HiggsAudioV2ForConditionalGeneration

    from speechctl.models.random_weights import save_random_model
    from speechctl.models.tokenizer import byte_tokenizer

    recipe = recipe or HiggsRecipe()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_random_model(path, HiggsAudioV2ForConditionalGeneration, higgs_config(recipe), recipe, _randomize)
    tok = byte_tokenizer(SPECIAL_TOKENS)
    tok.pad_token, tok.bos_token, tok.eos_token = SPECIAL_TOKENS[:3]
    tok.save_pretrained(path)
    if recipe.codec:
        create_higgs_codec(path / "audio_tokenizer", recipe)
    return path


def create_higgs_codec(path: Path, recipe: HiggsRecipe) -> Path:
    """A random ``HiggsAudioV2TokenizerModel`` with ``num_codebooks`` x ``codebook_size`` codes."""
    from transformers import HiggsAudioV2TokenizerConfig

    from speechctl.codecs.higgs import tokenizer_model_class

    base = HiggsAudioV2TokenizerConfig(codebook_size=recipe.codebook_size, **recipe.codec_config)
    # Bandwidth for exactly num_codebooks quantizers: K * frame_rate * bits per code.
    bandwidth = recipe.num_codebooks * base.frame_rate * base.codebook_nbits / 1000
    config = HiggsAudioV2TokenizerConfig(
        codebook_size=recipe.codebook_size, target_bandwidths=[bandwidth], **recipe.codec_config
    )
    if config.num_quantizers != recipe.num_codebooks:
        raise ValueError(f"codec config gives {config.num_quantizers} quantizers, not {recipe.num_codebooks}")
    torch.manual_seed(recipe.seed + 1)
    codec = tokenizer_model_class()(config).eval()
    with torch.no_grad():
        for quantizer in codec.quantizer.quantizers:  # transformers initialises codebooks to zeros
            quantizer.codebook.embed.normal_()
    codec.save_pretrained(path)
    return path


def _randomize(model, recipe: HiggsRecipe) -> None:
    """Matrices N(0, init_std); norm weights 1 + N(0, 0.3), so the text and audio norms differ."""
    from speechctl.models.random_weights import draw_parameters

    draw_parameters(model, recipe.seed, recipe.init_std)
