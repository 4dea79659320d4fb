"""The codec's early plateau, probed on the CPU: the full codec shape on 0.3 h of speech, batch 8,
no GAN, the learning rate warmed up over 300 steps and then held at its peak, dead codes re-seeded
every 200 steps as in training. Every ``every`` steps it prints that step's mel loss and
commitment loss, and the RMS of the encoder's output on the same batch after the step: whether
the latents collapse, and when the decoder starts to use them (the mel loss leaves ~4.7).

    python -m recipes.voice plateau --codebook-init-std 1.0 --steps 1200
    python -m recipes.voice plateau --codebook-init-std 0.02 --steps 1200

About 2.4 s a step on one core of this 2-core machine (two probes side by side). On the H200
(batch 64, GAN from step 1,000) the plateau lasted 1,400 and 3,900 steps with transformers'
N(0, 0.02) codebooks; docs/voice/codec-progress.md has what this probe showed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from recipes.voice import data
from recipes.voice.codec import CodecTrainer
from recipes.voice.config import preset


def probe(work: Path, codebook_init_std: float, steps: int, warmup: int = 300, batch: int = 8, every: int = 20,
          log=print) -> list[dict]:
    torch.set_num_threads(1)
    recipe = preset("full")
    recipe = replace(recipe, data=replace(recipe.data, hours=0.3, heldout=4),
                     codec_train=replace(recipe.codec_train, codebook_init_std=codebook_init_std, data_hours=None,
                                         batch_size=batch, warmup_steps=warmup, disc_start_step=10**9))
    cfg = recipe.codec_train
    manifest = data.ensure(recipe.data, Path(work) / "data", log=None)
    trainer = CodecTrainer(recipe, Path(work) / "data", "cpu", manifest["sha256"], log=lambda line: None)
    rows, started = [], time.time()
    for _ in range(steps):
        lr = cfg.lr * min(1.0, (trainer.step + 1) / warmup)
        for group in trainer.opt_g.param_groups:
            group["lr"] = lr
        x = trainer.crops.batch(trainer.step, batch)
        out = trainer.train_step(x)
        trainer.step += 1
        if trainer.step % cfg.codebook_reset_every == 0:
            trainer._reset_dead_codes()
        if trainer.step % every == 0:
            with torch.no_grad():
                z = trainer.model.encoder(x[:, None])
            rows.append({"step": trainer.step, "mel": out["mel"].item(), "commit": out["commit"].item(),
                         "latent_rms": float(z.pow(2).mean().sqrt()), "lr": lr,
                         "seconds": round(time.time() - started)})
            log(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in rows[-1].items()))
    return rows
