"""What each codebook of a trained codec carries on held-out audio: distinct codes and their
entropy, with the lookup in float32 and emulated at TF32's precision (what the H200 computed
while TF32 matmuls were on), and how narrow each stage's cone of latents is (the lookup compares
directions: a stage whose latents share a large offset is told apart only by tiny angles).

    python -m recipes.voice codebooks --codec .voice/unpacked/codec --limit 40
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to TF32's 10-bit mantissa, as tensor cores read a float32 input."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def _lookup(quantizer, latents: torch.Tensor, emulate_tf32: bool) -> torch.Tensor:
    """The nearest code's index per frame, as ``DacVectorQuantize.decode_latents`` picks it
    (normalized latents against normalized codes)."""
    b, d, t = latents.shape
    e = F.normalize(latents.permute(0, 2, 1).reshape(b * t, d))
    c = F.normalize(quantizer.codebook.weight)
    if emulate_tf32:
        e, c = tf32(e), tf32(c)
    return (e @ c.t()).argmax(1)


@torch.no_grad()
def codebook_stats(model, waves: list[np.ndarray], hop: int) -> list[dict]:
    """One row per stage over ``waves``; the residual is carried as float32 inference does."""
    codes = {False: [[] for _ in model.quantizer.quantizers], True: [[] for _ in model.quantizer.quantizers]}
    cones = [[] for _ in model.quantizer.quantizers]
    for wave in waves:
        n = len(wave) // hop * hop
        if n == 0:
            continue
        residual = model.encoder(torch.from_numpy(np.asarray(wave[:n], np.float32))[None, None])
        for k, quantizer in enumerate(model.quantizer.quantizers):
            latents = quantizer.in_proj(residual)
            for emulate in (False, True):
                codes[emulate][k].append(_lookup(quantizer, latents, emulate).numpy())
            directions = F.normalize(latents[0].T)
            mean = F.normalize(directions.mean(0), dim=0)
            cones[k].append(float((directions @ mean).min()))
            quantized, *_ = quantizer(residual)
            residual = residual - quantized
    rows = []
    for k in range(len(cones)):
        row = {"codebook": k, "min_cosine_to_mean_direction": round(min(cones[k]), 6)}
        for emulate, name in ((False, "float32"), (True, "tf32")):
            values, counts = np.unique(np.concatenate(codes[emulate][k]), return_counts=True)
            p = counts / counts.sum()
            row[f"{name}_distinct"] = int(len(values))
            row[f"{name}_entropy_bits"] = round(max(0.0, float(-(p * np.log2(p)).sum())), 2)
        rows.append(row)
    return rows


def main(codec: Path, data: Path, limit: int) -> list[dict]:
    from recipes.voice.codec import load_trained_codec
    from recipes.voice.config import DataConfig
    from recipes.voice.evaluate import heldout_split

    model, recipe, record = load_trained_codec(codec)
    split = heldout_split(data, recipe.data if recipe.data else DataConfig())
    rows = codebook_stats(model, [split.wave(i) for i in range(min(limit, len(split)))], recipe.codec.hop_length)
    for row in rows:
        print(json.dumps(row))
    return rows
