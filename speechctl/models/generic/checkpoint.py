"""Checkpoints in speechctl's own layout with random weights (from a fixed seed): the embedded
``tiny``, test models and benchmark shapes. Such a model exercises the whole pipeline (engine,
streams, codec, CLI) but does not speak."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.models.generic.family import FAMILY

ARCHITECTURE = FAMILY.architecture
SPECIAL_TOKENS = [
    "<pad>",
    "<bos>",
    "<eos>",
    "<|tts|>",
    "<|asr|>",
    "<|audio_bos|>",
    "<|audio|>",
    "<|audio_eos|>",
]


def byte_stream_spec(delays: tuple[int, ...], codebook_size: int) -> StreamSpec:
    ids = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}
    return StreamSpec(
        pattern=DelayPattern(delays, codebook_size),
        bos_id=ids["<bos>"],
        eos_id=ids["<eos>"],
        pad_id=ids["<pad>"],
        audio_bos_id=ids["<|audio_bos|>"],
        audio_id=ids["<|audio|>"],
        audio_eos_id=ids["<|audio_eos|>"],
        task_ids={"tts": ids["<|tts|>"], "asr": ids["<|asr|>"]},
    )


@dataclass
class MultiStreamRecipe:
    """Shape of a random multi-stream checkpoint (backbone + streams + codec)."""

    backbone: str = "llama"  # llama | qwen3 | qwen2
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2  # head_dim 32: vLLM's CPU attention has no kernels for 16
    num_kv_heads: int = 1
    intermediate_size: int = 128
    max_position_embeddings: int = 4096
    num_codebooks: int = 4
    codebook_size: int = 64
    delays: tuple[int, ...] | None = None  # default: stream k waits k steps
    vocab_size: int | None = None  # text vocabulary; default: the byte tokenizer's 264 ids
    init_std: float = 0.15
    seed: int = 0
    dtype: str = "float32"
    weights: bool = True  # False: config, tokenizer and codec only (vLLM's load_format="dummy")
    # What the model reads: "text" (the bytes of the text) or "phonemes" (espeak-ng's phonemes
    # of it in this espeak-ng voice, ``speechctl.phonemes``): the ``speechctl`` section's
    # ``text_input`` / ``phoneme_voice``.
    text_input: str = "text"
    phoneme_voice: str = "en-us"
    # The longest piece of text one request speaks (the ``speechctl`` section's
    # ``max_piece_chars``, ``GenerationDefaults.max_piece_chars``); None: speechctl's default.
    max_piece_chars: int | None = None
    # transformers DacConfig fields of the codec; codebooks come from the fields above.
    codec: dict = field(
        default_factory=lambda: dict(
            encoder_hidden_size=8,
            downsampling_ratios=[2, 4, 5, 8],
            decoder_hidden_size=32,
            codebook_dim=8,
            sampling_rate=16000,
        )
    )

    @property
    def stream_delays(self) -> tuple[int, ...]:
        return tuple(self.delays) if self.delays is not None else tuple(range(self.num_codebooks))


def _backbone_config(recipe: MultiStreamRecipe, vocab_size: int):
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=256 + SPECIAL_TOKENS.index("<bos>"),
        eos_token_id=256 + SPECIAL_TOKENS.index("<eos>"),
        pad_token_id=256 + SPECIAL_TOKENS.index("<pad>"),
    )
    if recipe.backbone == "llama":
        return transformers.LlamaConfig(**common)
    if recipe.backbone == "qwen3":
        return transformers.Qwen3Config(head_dim=recipe.hidden_size // recipe.num_heads, **common)
    if recipe.backbone == "qwen2":
        return transformers.Qwen2Config(**common)
    raise ValueError(f"unknown backbone {recipe.backbone!r}")


def _backbone_model(config):
    import transformers

    return {
        "llama": transformers.LlamaModel,
        "qwen3": transformers.Qwen3Model,
        "qwen2": transformers.Qwen2Model,
    }[config.model_type](config)


def create_multistream_checkpoint(path: str | os.PathLike, recipe: MultiStreamRecipe) -> Path:
    """Write a complete checkpoint directory (config, weights, tokenizer, codec) to ``path``."""
    import transformers

    from speechctl.models.tokenizer import byte_tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab_size = max(recipe.vocab_size or 0, 256 + len(SPECIAL_TOKENS))
    spec = byte_stream_spec(recipe.stream_delays, recipe.codebook_size)
    config = _backbone_config(recipe, vocab_size)
    config.architectures = [ARCHITECTURE]
    config.speechctl = {**spec.to_dict(), "family": "multistream", "codec": "codec"}
    if recipe.text_input != "text":
        config.speechctl.update(text_input=recipe.text_input, phoneme_voice=recipe.phoneme_voice)
    if recipe.max_piece_chars is not None:
        config.speechctl["max_piece_chars"] = recipe.max_piece_chars
    config.dtype = recipe.dtype
    if recipe.weights:
        _write_weights(path, recipe, config, spec)
    config.save_pretrained(path)

    tok = byte_tokenizer(SPECIAL_TOKENS)
    tok.bos_token, tok.eos_token, tok.pad_token = "<bos>", "<eos>", "<pad>"
    tok.save_pretrained(path)

    codec_config = transformers.DacConfig(
        n_codebooks=recipe.num_codebooks, codebook_size=recipe.codebook_size, **recipe.codec
    )
    torch.manual_seed(recipe.seed + 1)
    codec = transformers.DacModel(codec_config).eval()
    codec.save_pretrained(path / "codec")
    (path / "speechctl.json").write_text(json.dumps({"recipe": repr(recipe)}, indent=2))
    return path


def _write_weights(path: Path, recipe: MultiStreamRecipe, config, spec: StreamSpec) -> None:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    backbone = _backbone_model(config)
    tensors = {}
    for name, p in backbone.state_dict().items():
        if p.dim() >= 2:  # matrices random; norms keep their ones
            p = torch.randn(p.shape, generator=gen) * recipe.init_std
        tensors[f"model.{name}"] = p.contiguous()
    H, K, Va = recipe.hidden_size, recipe.num_codebooks, spec.pattern.vocab_size
    tensors["lm_head.weight"] = torch.randn(config.vocab_size, H, generator=gen) * recipe.init_std
    tensors["audio_embed.weight"] = torch.randn(K * Va, H, generator=gen) * recipe.init_std
    tensors["audio_head.weight"] = torch.randn(K * Va, H, generator=gen) * recipe.init_std
    dtype = getattr(torch, recipe.dtype)
    save_file({k: v.to(dtype) for k, v in tensors.items()}, str(path / "model.safetensors"))
