"""Higgs Audio v2's codec through transformers' ``HiggsAudioV2TokenizerModel``.

An xcodec-style codec: a DAC acoustic encoder plus a HuBERT semantic encoder, fused and
quantized with residual VQ; decoding uses the acoustic (DAC) decoder only. The published
tokenizer (bosonai/higgs-audio-v2-tokenizer) takes 24 kHz audio and gives 8 codebooks x 1024 at
25 frames/s (hop 960).

Decoding is a local convolution stack: its receptive field is measured and batching is exact
(``Codec.decode``). Encoding runs HuBERT, which attends over the whole input (and group-norms
it), so no frame depends on a bounded context: only items of equal length share an encode call.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from .base import DEFAULT_MAX_BATCH_FRAMES, Codec
from .batching import UNBOUNDED, measure_context


def tokenizer_model_class():
    """transformers' ``HiggsAudioV2TokenizerModel`` (its module imports torchaudio; see
    ``speechctl.codecs.torchaudio_shim``)."""
    from speechctl.codecs.torchaudio_shim import ensure_torchaudio

    ensure_torchaudio()
    # The module itself: the package's lazy attribute is a placeholder while transformers
    # believes torchaudio missing (it checked before the stand-in existed).
    module = importlib.import_module("transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer")
    return module.HiggsAudioV2TokenizerModel


class HiggsAudioV2Codec(Codec):
    """``HiggsAudioV2TokenizerModel`` in eval mode on ``device``; see ``Codec`` for the interface."""

    model_type = "higgs_audio_v2_tokenizer"
    decoder_module = "acoustic_decoder"  # quantized latents -> audio (``compile_decoder``)

    def __init__(
        self,
        path: str | Path,
        device: str | torch.device = "cpu",
        *,
        max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES,
    ):
        model = tokenizer_model_class().from_pretrained(str(path))
        config = model.config
        super().__init__(
            sample_rate=config.sample_rate,
            hop_length=config.hop_length,
            num_codebooks=config.num_quantizers,
            codebook_size=config.codebook_size,
            device=device,
            max_batch_frames=max_batch_frames,
        )
        self.model = model.to(device=self.device, dtype=torch.float32).eval().requires_grad_(False)
        self.measure_contexts()

    def measure_contexts(self, seed: int = 0) -> None:
        """Decode: measured. Encode: unbounded (HuBERT), so ``run_exact_batched`` only groups
        equal lengths."""
        generator = torch.Generator().manual_seed(seed)
        K, C = self.num_codebooks, self.codebook_size

        def probe(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
            base = torch.randint(0, C, (1, K, frames), generator=generator)
            changed = base.clone()
            changed[0, :, frames // 2] = (base[0, :, frames // 2] + torch.randint(1, C, (K,), generator=generator)) % C
            return base, changed

        def decode(codes: torch.Tensor) -> torch.Tensor:
            return self._decode_batch(codes.to(self.device)).float().cpu()[:, None, :]

        self.decode_context = measure_context(decode, probe, out_per_frame=self.hop_length)
        self.encode_context = (UNBOUNDED, UNBOUNDED)

    def _decode_batch(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, K, T]`` codes -> ``[B, T * hop_length]`` waveforms."""
        return self.model.decode(codes).audio_values[:, 0]

    def _encode_batch(self, waveforms: torch.Tensor) -> torch.Tensor:
        """``[B, T * hop_length]`` waveforms at ``sample_rate`` -> ``[B, K, T]`` codes."""
        return self.model.encode(waveforms[:, None, :]).audio_codes

    def _encoder_features(self, waveforms: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("the encode context is not measured: HuBERT sees the whole input")
