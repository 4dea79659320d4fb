"""Reconstruction losses of the codec (DAC's): multi-scale log-mel L1 and waveform L1."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def mel_filters(n_fft: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] triangular filters on the HTK mel scale, area-normalized
    (Slaney), from 0 Hz to Nyquist."""
    def hz_to_mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)

    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    mels = torch.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2, dtype=torch.float64)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    lower, center, upper = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (freqs[None] - lower) / (center - lower)
    down = (upper - freqs[None]) / (upper - center)
    fb = torch.clamp(torch.minimum(up, down), min=0.0)
    fb = fb * (2.0 / (upper - lower))  # equal area per filter
    return fb.float()


class MultiScaleMelLoss(nn.Module):
    """Sum over window sizes of L1(log10(mel(x).clamp(eps)), log10(mel(y).clamp(eps))), hop =
    window / 4, Hann windows (DAC's mel/loss: 7 scales from 32 to 2048 samples)."""

    def __init__(self, sample_rate: int, windows=(32, 64, 128, 256, 512, 1024, 2048),
                 mels=(5, 10, 20, 40, 80, 160, 320), eps: float = 1e-5):
        super().__init__()
        self.windows = tuple(windows)
        self.eps = eps
        for w, m in zip(windows, mels):
            self.register_buffer(f"fb{w}", mel_filters(w, m, sample_rate), persistent=False)
            self.register_buffer(f"win{w}", torch.hann_window(w), persistent=False)

    def mel(self, x: torch.Tensor, w: int) -> torch.Tensor:
        """[B, L] -> [B, mels, frames] magnitude mel spectrogram (float32)."""
        spec = torch.stft(x.float(), n_fft=w, hop_length=w // 4, window=getattr(self, f"win{w}"), center=True,
                          return_complex=True)
        return getattr(self, f"fb{w}") @ spec.abs()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = x.new_zeros((), dtype=torch.float32)
        for w in self.windows:
            a = torch.log10(self.mel(x, w).clamp(min=self.eps))
            b = torch.log10(self.mel(y, w).clamp(min=self.eps))
            loss = loss + F.l1_loss(a, b)
        return loss


def waveform_l1(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.l1_loss(x.float(), y.float())
