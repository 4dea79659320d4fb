"""EnCodec (Meta's codec, MusicGen's) through transformers' ``EncodecModel``.

32 kHz audio, 50 frames/s (hop 640), residual VQ: MusicGen uses 4 codebooks × 2048. Its
convolutions are not causal (a bounded right context, measured) but its LSTM is: a frame
depends on every frame before it, so the left context is unbounded. Batching pads on the right
only (exact: nothing reaches back), windows never cut the left (``run_exact_batched`` then
groups items of equal length for the natural end; streaming decodes from the start).

A MusicGen checkpoint carries its EnCodec inside (``audio_encoder.*`` weights, the
``audio_encoder`` config): this codec loads from such a directory too (``model_type: musicgen``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .base import DEFAULT_MAX_BATCH_FRAMES, Codec, keep_conv_padding_on_host
from .batching import UNBOUNDED
from .mimi import checkpoint_tensors


def load_encodec(path: str | Path):
    """An ``EncodecModel`` from an EnCodec checkpoint directory or a MusicGen checkpoint's
    audio encoder."""
    from transformers import EncodecConfig, EncodecModel

    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type") != "musicgen":
        return EncodecModel.from_pretrained(str(path))
    codec_config = dict(config["audio_encoder"])
    codec_config.pop("model_type", None)
    model = EncodecModel(EncodecConfig(**codec_config))
    prefix = "audio_encoder."
    state = {name[len(prefix) :]: w for name, w in checkpoint_tensors(path, prefix)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith(("cluster_size", "embed_avg", "inited"))]  # training-only state
    if missing or unexpected:
        raise ValueError(f"{path}: audio_encoder weights do not fit EnCodec (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model


class EncodecCodec(Codec):
    """``EncodecModel`` in eval mode on ``device``; see ``Codec`` for the interface."""

    model_type = "encodec"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu", *,
                 max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES):
        model = load_encodec(path)
        config = model.config
        if config.normalize or config.chunk_length_s is not None or config.audio_channels != 1:
            raise ValueError(f"{path}: speechctl runs mono EnCodec without normalization or chunking (MusicGen's)")
        self.bandwidth = config.target_bandwidths[0]  # encode's default: MusicGen's codebooks
        num_codebooks = model.quantizer.get_num_quantizers_for_bandwidth(self.bandwidth)
        hop_length = int(np.prod(config.upsampling_ratios))
        super().__init__(sample_rate=config.sampling_rate, hop_length=hop_length, num_codebooks=num_codebooks,
                         codebook_size=config.codebook_size, device=device, max_batch_frames=max_batch_frames)
        self.model = model.to(device=self.device, dtype=torch.float32).eval().requires_grad_(False)
        keep_conv_padding_on_host(self.model)
        self.decode_context = (UNBOUNDED, self._right_context(self._decode_output, self.hop_length))
        self.encode_context = (UNBOUNDED, self._right_context(self._encoder_features, 1, encode=True))

    def _decode_batch(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, K, T]`` codes -> ``[B, T * hop_length]`` waveforms."""
        return self.model.decode(codes[None], [None]).audio_values[:, 0]

    def _encode_batch(self, waveforms: torch.Tensor) -> torch.Tensor:
        """``[B, T * hop_length]`` waveforms -> ``[B, K, T]`` codes."""
        return self.model.encode(waveforms[:, None, :], bandwidth=self.bandwidth).audio_codes[0]

    def _encoder_features(self, waveforms: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(waveforms[:, None, :])

    def _decode_output(self, codes: torch.Tensor) -> torch.Tensor:
        return self._decode_batch(codes)[:, None, :]

    def _right_context(self, run, out_per_frame: int, encode: bool = False, frames: int = 64) -> int:
        """Frames after frame t that its output depends on: change one frame in the middle of a
        probe and find the earliest output that moves (one frame of margin, as
        ``measure_context`` adds)."""
        generator = torch.Generator().manual_seed(0)
        middle = frames // 2
        if encode:
            base = 0.1 * torch.randn(1, frames * self.hop_length, generator=generator)
            changed = base.clone()
            changed[0, middle * self.hop_length : (middle + 1) * self.hop_length] += 0.1
        else:
            base = torch.randint(0, self.codebook_size, (1, self.num_codebooks, frames), generator=generator)
            changed = base.clone()
            changed[0, :, middle] = (changed[0, :, middle] + 1) % self.codebook_size
        with torch.no_grad():
            out = run(torch.cat([base, changed]).to(self.device)).float().cpu()
        moved = torch.nonzero((out[1] - out[0]).abs().amax(dim=0) > 0).flatten()
        if moved.numel() == 0:
            raise RuntimeError("changing one frame of the input did not change the output")
        right = middle - int(moved[0]) // out_per_frame
        return right + 1 if right > 0 else 0
