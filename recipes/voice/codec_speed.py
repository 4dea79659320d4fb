"""How fast the codec trains at several batch sizes: the recipe's own training step
(``CodecTrainer.train_step``, discriminators on, as after ``disc_start_step``), timed after a
warm-up with the device synchronized around the timed steps. The weights are fresh (a step's time
does not depend on their values) and nothing is saved.

On the H200 a step of 64 one-second crops took ~190 ms (5.3 M parameters): if the step is bound by
kernel launches rather than arithmetic, a larger batch costs little more per step and trains on
more audio per second. This says which.

    VOICE_BATCHES=32,64,128,256 bash recipes/voice/gpu.sh codec-speed     # on the GPU machine
    python -m recipes.voice stage codec-speed --work /root/voice --batches 32,64,128,256
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from recipes.voice.config import Recipe


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_codec_steps(recipe: Recipe, data_dir: Path, device: str, batch_sizes: list[int], steps: int = 10,
                        warmup: int = 3, log=print) -> list[dict]:
    """One row per batch size: seconds per step, audio seconds trained per second, peak device
    memory; a size that does not fit says so in its row and the next is tried."""
    from recipes.voice.codec import CodecTrainer

    recipe = replace(recipe, codec_train=replace(recipe.codec_train, compile=False))
    trainer = CodecTrainer(recipe, data_dir, device, data_sha256="", log=lambda line: None)
    trainer.step = recipe.codec_train.disc_start_step if recipe.codec_train.adversarial else 0
    dev, rate = trainer.device, recipe.codec.sampling_rate
    rows = []
    for size in batch_sizes:
        row = {"batch": size, "crop_s": trainer.segment / rate, "steps": steps}
        try:
            for i in range(warmup):  # cuDNN's autotuner picks its kernels for the new shape here
                trainer.train_step(trainer.crops.batch(i, size))
            _sync(dev)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            started = time.perf_counter()
            for i in range(steps):
                trainer.train_step(trainer.crops.batch(warmup + i, size))
            _sync(dev)
            seconds = (time.perf_counter() - started) / steps
        except torch.OutOfMemoryError:
            row["error"] = "out of memory"
        else:
            row.update(s_per_step=round(seconds, 4), audio_s_per_s=round(size * row["crop_s"] / seconds, 2))
            if dev.type == "cuda":
                row["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        log(json.dumps(row))
        rows.append(row)
    return rows
