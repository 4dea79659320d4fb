"""Discriminators of the codec's adversarial terms, in plain torch: HiFi-GAN's multi-period
discriminator (waveform folded by period) and a multi-resolution spectrogram discriminator
(UnivNet's, on log magnitudes), with least-squares GAN and feature-matching losses (as DAC)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


class PeriodDiscriminator(nn.Module):
    def __init__(self, period: int, c: int):
        super().__init__()
        self.period = period
        chans = [1, c, 4 * c, 8 * c, 8 * c]
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(a, b, (5, 1), (3, 1), padding=(2, 0))) for a, b in zip(chans, chans[1:])
        )
        self.convs.append(weight_norm(nn.Conv2d(chans[-1], chans[-1], (5, 1), 1, padding=(2, 0))))
        self.post = weight_norm(nn.Conv2d(chans[-1], 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """[B, L] -> features of every layer, the last being the logits."""
        B, L = x.shape
        pad = (-L) % self.period
        x = F.pad(x[:, None], (0, pad), mode="reflect")
        x = x.view(B, 1, (L + pad) // self.period, self.period)
        feats = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), 0.1)
            feats.append(x)
        feats.append(self.post(x))
        return feats


class SpectrogramDiscriminator(nn.Module):
    def __init__(self, n_fft: int, c: int):
        super().__init__()
        self.n_fft = n_fft
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        c2 = 2 * c
        self.convs = nn.ModuleList([
            weight_norm(nn.Conv2d(1, c2, (3, 9), padding=(1, 4))),
            weight_norm(nn.Conv2d(c2, c2, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(c2, c2, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(c2, c2, (3, 9), stride=(1, 2), padding=(1, 4))),
            weight_norm(nn.Conv2d(c2, c2, (3, 3), padding=(1, 1))),
        ])
        self.post = weight_norm(nn.Conv2d(c2, 1, (3, 3), padding=(1, 1)))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        spec = torch.stft(x.float(), self.n_fft, hop_length=self.n_fft // 4, window=self.window, return_complex=True)
        x = torch.log(spec.abs().clamp(min=1e-5)).transpose(1, 2)[:, None]  # [B, 1, frames, bins]
        feats = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), 0.1)
            feats.append(x)
        feats.append(self.post(x))
        return feats


class Discriminators(nn.Module):
    def __init__(self, periods=(2, 3, 5, 7, 11), ffts=(2048, 1024, 512), channels: int = 16):
        super().__init__()
        self.members = nn.ModuleList(
            [PeriodDiscriminator(p, channels) for p in periods] + [SpectrogramDiscriminator(n, channels) for n in ffts]
        )

    def forward(self, x: torch.Tensor) -> list[list[torch.Tensor]]:
        return [d(x) for d in self.members]


def discriminator_loss(real: list[list[torch.Tensor]], fake: list[list[torch.Tensor]]) -> torch.Tensor:
    """Least squares: real logits toward 1, fake toward 0 (``fake`` from detached audio)."""
    return sum(torch.mean((r[-1].float() - 1) ** 2) + torch.mean(f[-1].float() ** 2) for r, f in zip(real, fake))


def generator_losses(real: list[list[torch.Tensor]], fake: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(adversarial: fake logits toward 1, feature matching: L1 between real and fake features
    of every layer but the logits, real ones detached)."""
    adv = sum(torch.mean((f[-1].float() - 1) ** 2) for f in fake)
    feat = sum(F.l1_loss(ff.float(), rf.detach().float()) for r, f in zip(real, fake) for rf, ff in zip(r[:-1], f[:-1]))
    return adv, feat
