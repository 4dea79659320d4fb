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


def tf32_lookup(quantizer, latents: torch.Tensor) -> torch.Tensor:
    """The code ``DacVectorQuantize.decode_latents`` would pick for each frame of ``latents``
    [B, D, T] (normalized latents against normalized codes) had the matmul read its inputs at
    TF32's precision: [B * T] indices."""
    b, d, t = latents.shape
    e = F.normalize(latents.permute(0, 2, 1).reshape(b * t, d))
    c = F.normalize(quantizer.codebook.weight)
    return (tf32(e) @ tf32(c).t()).argmax(1)


def _distribution(codes: list[np.ndarray]) -> tuple[int, float]:
    """(distinct codes, entropy in bits)."""
    _, counts = np.unique(np.concatenate(codes), return_counts=True)
    p = counts / counts.sum()
    return int(len(counts)), round(max(0.0, float(-(p * np.log2(p)).sum())), 2)


@torch.no_grad()
def codebook_stats(model, waves: list[np.ndarray], hop: int) -> list[dict]:
    """One row per stage over ``waves``; each stage runs as transformers' quantizer does in
    float32 (its codes and the residual it leaves), the TF32 lookup beside it on the same latents."""
    stages = model.quantizer.quantizers
    exact, emulated, cones = ([[] for _ in stages] for _ in range(3))
    for wave in waves:
        n = len(wave) // hop * hop
        if n == 0:
            continue
        residual = model.encoder(torch.from_numpy(np.asarray(wave[:n], np.float32))[None, None])
        for k, quantizer in enumerate(stages):
            quantized, _, _, codes, latents = quantizer(residual)
            exact[k].append(codes.flatten().numpy())
            emulated[k].append(tf32_lookup(quantizer, latents).numpy())
            directions = F.normalize(latents[0].T)
            cones[k].append(float((directions @ F.normalize(directions.mean(0), dim=0)).min()))
            residual = residual - quantized
    rows = []
    for k in range(len(stages)):
        (n32, h32), (ntf, htf) = _distribution(exact[k]), _distribution(emulated[k])
        rows.append({"codebook": k, "min_cosine_to_mean_direction": round(min(cones[k]), 6),
                     "float32_distinct": n32, "float32_entropy_bits": h32, "tf32_distinct": ntf, "tf32_entropy_bits": htf})
    return rows


def main(codec: Path, data: Path, limit: int) -> list[dict]:
    from recipes.voice.codec import load_trained_codec
    from recipes.voice.evaluate import heldout_split

    model, recipe, _ = load_trained_codec(codec)
    split = heldout_split(data, recipe.data)
    rows = codebook_stats(model, [split.wave(i) for i in range(min(limit, len(split)))], recipe.codec.hop_length)
    for row in rows:
        print(json.dumps(row))
    return rows
