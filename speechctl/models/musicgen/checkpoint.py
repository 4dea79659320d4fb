"""Random MusicGen checkpoints in the published format, written by transformers' own classes.

Tests build tiny ones (``MusicgenForConditionalGeneration.save_pretrained``: a T5 text encoder,
a random EnCodec at 32 kHz inside as ``audio_encoder.*``, the decoder; a byte tokenizer that
appends ``</s>`` as T5's does); benchmarks a config of the real size (``MUSICGEN_SMALL``:
facebook/musicgen-small's shapes, no weights: vLLM's ``load_format="dummy"``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class MusicgenRecipe:
    hidden_size: int = 64
    layers: int = 2
    heads: int = 2  # head_dim 32: vLLM's CPU attention has no kernels for 16
    ffn_dim: int = 128
    num_codebooks: int = 4
    positions: int = 512
    t5: dict = field(default_factory=lambda: dict(vocab_size=300, d_model=48, d_kv=24, d_ff=96, num_layers=2, num_heads=2,
                                                  relative_attention_num_buckets=8, feed_forward_proj="relu",
                                                  n_positions=128))
    encodec: dict = field(default_factory=lambda: dict(num_filters=4, hidden_size=16, codebook_dim=16,
                                                       num_lstm_layers=1, upsampling_ratios=[8, 5, 4, 4]))
    init_std: float = 0.3  # wide, so greedy choices are not float-rounding ties
    seed: int = 0
    dtype: str = "float32"
    weights: bool = True  # False: config and tokenizer only (vLLM's load_format="dummy")
    generation: dict = field(default_factory=lambda: {"do_sample": False})


# facebook/musicgen-small's shapes: t5-base, a 24-layer 1024-wide decoder, EnCodec 32 kHz
MUSICGEN_SMALL = MusicgenRecipe(hidden_size=1024, layers=24, heads=16, ffn_dim=4096, positions=2048,
                                t5=dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12,
                                        relative_attention_num_buckets=32, feed_forward_proj="relu"),
                                encodec=dict(num_filters=64, hidden_size=128, upsampling_ratios=[8, 5, 4, 4]),
                                dtype="bfloat16", weights=False,
                                generation={"do_sample": True, "guidance_scale": 3.0, "max_length": 1500})


def musicgen_config(recipe: MusicgenRecipe):
    from transformers import EncodecConfig, MusicgenConfig, MusicgenDecoderConfig, T5Config

    t5 = T5Config(**recipe.t5)
    encodec = EncodecConfig(sampling_rate=32000, audio_channels=1, codebook_size=2048, target_bandwidths=[2.2],
                            normalize=False, use_causal_conv=False, **recipe.encodec)
    decoder = MusicgenDecoderConfig(vocab_size=2048, hidden_size=recipe.hidden_size, num_hidden_layers=recipe.layers,
                                    num_attention_heads=recipe.heads, ffn_dim=recipe.ffn_dim,
                                    num_codebooks=recipe.num_codebooks, max_position_embeddings=recipe.positions)
    return MusicgenConfig(text_encoder=t5.to_dict(), audio_encoder=encodec.to_dict(), decoder=decoder.to_dict(),
                          dtype=recipe.dtype)


def create_musicgen_checkpoint(path: str | os.PathLike, recipe: MusicgenRecipe | None = None) -> Path:
    """Write config.json, model.safetensors (random, EnCodec inside), generation_config.json and
    the tokenizer to ``path``."""
    from transformers import MusicgenForConditionalGeneration

    from speechctl.models.random_weights import save_random_model

    recipe = recipe or MusicgenRecipe()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_random_model(path, MusicgenForConditionalGeneration, musicgen_config(recipe), recipe, _randomize)
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 2048, "decoder_start_token_id": 2048, "pad_token_id": 2048, **recipe.generation}, indent=2))
    t5_tokenizer().save_pretrained(path)
    return path


def t5_tokenizer():
    """Bytes 0-255, ``</s>`` 256 appended to every text (as T5's tokenizer appends its own)."""
    from tokenizers import processors

    from speechctl.models.tokenizer import byte_tokenizer

    tok = byte_tokenizer(["</s>", "<pad>"])
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 256)])
    tok.eos_token, tok.pad_token = "</s>", "<pad>"
    return tok


def _randomize(model, recipe: MusicgenRecipe) -> None:
    """Decoder and text-encoder matrices N(0, init_std), norm weights 1 + N(0, 0.3); EnCodec
    keeps transformers' init but gets random codebooks."""
    from speechctl.models.random_weights import draw_codebooks, draw_parameters

    gen = draw_parameters(model, recipe.seed, recipe.init_std, skip="audio_encoder.")
    draw_codebooks(model.audio_encoder, ".embed", gen)
