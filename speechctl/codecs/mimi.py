"""Mimi (Kyutai's codec, CSM's) through transformers' ``MimiModel``.

24 kHz audio, 12.5 frames/s (hop 1920), residual VQ: CSM uses 32 codebooks x 2048. Encoder and
decoder are causal (causal convolutions, causal sliding-window attention): a frame depends on
the past only, so right-padding a batch never changes an item's frames and batching is exact
(``decode_context = (UNBOUNDED, 0)``), checked by tests against decoding items alone.

A CSM checkpoint carries its Mimi inside (``codec_model.*`` weights, ``codec_config``): this codec
loads from such a directory too (``model_type: csm``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .base import DEFAULT_MAX_BATCH_FRAMES, Codec, keep_conv_padding_on_host
from .batching import UNBOUNDED


def load_mimi(path: str | Path):
    """A ``MimiModel`` from a Mimi checkpoint directory or from a CSM checkpoint's codec_model."""
    from transformers import MimiConfig, MimiModel

    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type") != "csm":
        return MimiModel.from_pretrained(str(path))
    codec_config = dict(config["codec_config"])
    codec_config.pop("model_type", None)
    model = MimiModel(MimiConfig(**codec_config))
    prefix = "codec_model."
    state = {name[len(prefix) :]: w for name, w in checkpoint_tensors(path, prefix)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: codec_model weights do not fit Mimi (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model


def checkpoint_tensors(path: Path, prefix: str):
    """(name, tensor) of every safetensors weight under ``prefix`` in a checkpoint directory."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no safetensors weights")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.startswith(prefix):
                    yield name, f.get_tensor(name)


class MimiCodec(Codec):
    """``MimiModel`` in eval mode on ``device``; see ``Codec`` for the interface."""

    model_type = "mimi"

    def __init__(
        self,
        path: str | Path,
        device: str | torch.device = "cpu",
        *,
        max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES,
    ):
        model = load_mimi(path)
        config = model.config
        if not config.use_causal_conv:
            raise ValueError(f"{path}: speechctl batches Mimi as a causal codec (use_causal_conv is off)")
        super().__init__(
            sample_rate=config.sampling_rate,
            hop_length=round(config.sampling_rate / config.frame_rate),
            num_codebooks=config.num_quantizers,
            codebook_size=config.codebook_size,
            device=device,
            max_batch_frames=max_batch_frames,
        )
        self.model = model.to(device=self.device, dtype=torch.float32).eval().requires_grad_(False)
        keep_conv_padding_on_host(self.model)
        self.decode_context = (UNBOUNDED, 0)
        self.encode_context = (UNBOUNDED, 0)

    def _decode_batch(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, K, T]`` codes -> ``[B, T * hop_length]`` waveforms."""
        return self.model.decode(codes).audio_values[:, 0]

    def _encode_batch(self, waveforms: torch.Tensor) -> torch.Tensor:
        """``[B, T * hop_length]`` waveforms -> ``[B, K, T]`` codes."""
        return self.model.encode(waveforms[:, None, :]).audio_codes

    def _encoder_features(self, waveforms: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Mimi's contexts come from its causality, not from measurement")
