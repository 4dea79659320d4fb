"""Letters or phonemes: the same small LM trained from scratch twice on the same speech and codes,
once reading the text's bytes and once espeak-ng's phonemes of it (``lm_train.text_input``), with
the same seed, steps and batches; held-out loss and first-codebook accuracy side by side.

    python -m recipes.voice compare-reading --codec-model .voice/unpacked/codec-model --hours 1 --steps 400

A CPU-sized probe of which input the voice's LM learns to read from faster (issue 20), not a
model to ship. Writes OUT/compare-reading.json (every setting, the curves) and prints a table.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from recipes.voice.config import DataConfig, LMShape, Recipe, preset


def compare(codec_model: Path, work: Path, out: Path, hours: float, steps: int, batch_tokens: int, threads: int,
            command: str | None = None, sets: list[str] | None = None, log=print) -> dict:
    """``sets``: ``section.field=value`` overrides of both runs' recipe (``stages.apply_sets``)."""
    import torch

    from recipes.voice import checkpoint, codes
    from recipes.voice.lm import LMTrainer
    from recipes.voice.stages import apply_sets

    torch.set_num_threads(threads)
    codec_recipe = Recipe.from_dict(checkpoint.read_record(codec_model)["recipe"])
    data = DataConfig(hours=hours, natural=["devil", "wordnet"]).voiced_as(codec_recipe.data)
    started = time.time()
    manifest, code_manifest = codes.ensure_with_data(codec_model, data, work / "data", work / "codes", "cpu", log=log)
    log(f"compare: data and codes ready, {time.time() - started:.0f} s")
    base = replace(preset("full"), data=data, codec=codec_recipe.codec, codec_train=codec_recipe.codec_train,
                   lm=LMShape(hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=512,
                              dtype="float32"))
    record = {"command": command, "sets": list(sets or []), "hours": hours, "steps": steps, "batch_tokens": batch_tokens, "threads": threads,
              "data_sha256": manifest["sha256"], "codes_sha256": code_manifest["splits"]["train"]["codes_sha256"],
              "lm": base.lm.describe(), "runs": {}}
    for text_input in ("text", "phonemes"):
        recipe = replace(base, lm_train=replace(base.lm_train, text_input=text_input, batch_tokens=batch_tokens,
                                                lr=2e-3, warmup_steps=50, decay_share=0.3, bf16=False, log_every=50,
                                                eval_every=max(1, steps // 4), seed=0))
        recipe = apply_sets(recipe, sets or []).validate()
        trainer = LMTrainer(recipe, work / "codes", work / f"lm-{text_input}", "cpu",
                            code_manifest["splits"]["train"]["codes_sha256"], log=log)
        began = time.time()
        trainer.train(1e18, max_steps=steps)
        held = [h for h in trainer.history if "heldout_loss" in h]
        record["runs"][text_input] = {"seconds": round(time.time() - began, 1), "heldout": held,
                                      "train_utterances": len(trainer.train_set)}
        log(f"compare: {text_input}: {held[-1]}")
    out.mkdir(parents=True, exist_ok=True)
    record["recipe"] = recipe.to_dict()  # (the phonemes run's; the text run's differs in text_input alone)
    (out / "compare-reading.json").write_text(json.dumps(record, indent=1) + "\n")
    rows = ["| step | held-out loss, text / phonemes | first codebook acc, text / phonemes |", "|---:|---|---|"]
    for a, b in zip(record["runs"]["text"]["heldout"], record["runs"]["phonemes"]["heldout"]):
        rows.append(f"| {a['step']} | {a['heldout_loss']:.3f} / {b['heldout_loss']:.3f} | "
                    f"{a['heldout_stream_acc'][0]:.3f} / {b['heldout_stream_acc'][0]:.3f} |")
    log("\n".join(rows))
    return record
