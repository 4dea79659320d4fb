"""DAC (Descript Audio Codec) through ``transformers.DacModel``.

A non-causal convolutional encoder and decoder with residual vector quantization: ``K`` codebooks
per frame of ``hop_length = prod(downsampling_ratios)`` samples (320 at 16 kHz: 50 frames/s).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import torch

from .base import DEFAULT_MAX_BATCH_FRAMES, Codec


class DacCodec(Codec):
    """``transformers.DacModel`` in eval mode on ``device``; see ``Codec`` for the interface.

    Decoding ``T`` frames gives ``T * hop_length`` samples, except with an odd upsampling stride:
    its transposed convolution returns one sample short per item at that stage (``5T - 1`` for
    stride 5), so the 16 and 24 kHz models return ``T * 320 - 8``; ``Codec.decode`` zero-pads
    those last samples (0.5 ms at 16 kHz).
    """

    model_type = "dac"
    decoder_module = "decoder"  # quantized latents -> audio (``compile_decoder``)

    def __init__(
        self,
        path: str | Path,
        device: str | torch.device = "cpu",
        *,
        max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES,
    ):
        from transformers import DacModel  # heavy import, only when a DAC codec is loaded

        # float32 as stored or wider: a checkpoint may keep its quantizer in float32 beside float16
        # weights (speechctl's own voice does), and loading at the config's dtype would round it
        model = DacModel.from_pretrained(str(path), dtype=torch.float32)
        config = model.config
        hop_length = math.prod(config.downsampling_ratios)
        if math.prod(config.upsampling_ratios) != hop_length:
            raise ValueError(
                f"{path}: DAC upsampling ratios {config.upsampling_ratios} do not undo the "
                f"downsampling ratios {config.downsampling_ratios}"
            )
        super().__init__(
            sample_rate=config.sampling_rate,
            hop_length=hop_length,
            num_codebooks=config.n_codebooks,
            codebook_size=config.codebook_size,
            device=device,
            max_batch_frames=max_batch_frames,
        )
        self.model = model.to(device=self.device, dtype=torch.float32).eval().requires_grad_(False)
        self.measure_contexts()

    def _decode_batch(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, K, T]`` codes -> ``[B, T * hop_length]`` waveforms (fewer samples, odd strides)."""
        return self.model.decode(audio_codes=codes).audio_values

    def _encode_batch(self, waveforms: torch.Tensor) -> torch.Tensor:
        """``[B, T * hop_length]`` waveforms -> ``[B, K, T]`` codes, in full float32 on a GPU."""
        with codes_in_float32():
            return self.model.encode(waveforms[:, None, :]).audio_codes

    def _encoder_features(self, waveforms: torch.Tensor) -> torch.Tensor:
        """``[B, T * hop_length]`` -> encoder output ``[B, hidden_size, T]`` (quantized per frame)."""
        return self.model.encoder(waveforms[:, None, :])


@contextmanager
def codes_in_float32():
    """TF32 off for matmuls and convolutions while codes are computed (here, and where the voice
    recipe encodes its training data: the same codes either way). DAC's codebook lookup
    compares directions, and a stage's latents can sit in a cone narrower than TF32's 10-bit
    mantissa resolves: speechctl's own voice, encoded at TF32, got 1 distinct code from a stage
    where float32 gives hundreds (docs/voice/codec-progress.md), and its LM learnt float32 codes.
    Decoding keeps TF32 (the error is then in the waveform's noise floor, not in a choice)."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
