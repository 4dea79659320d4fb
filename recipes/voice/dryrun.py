"""The whole recipe at tiny scale on a CPU, the way the GPU runs it: each "call" gets a fresh work
directory and only what it carries (packs filed by ``collect``), like a fresh device machine.

    call 1  codec (new)          -> collect: .../carry/codec, codec-model
    call 2  codec (resume)       -> collect
    call 3  lm (new)             -> collect: .../carry/lm
    call 4  lm (resume)          -> collect
    here    export, then speechctl speaks with it (API and CLI)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from recipes.voice.config import preset


def dryrun(work: Path, codec_steps: int = 60, lm_steps: int = 300) -> dict:
    import torch

    from recipes.voice import checkpoint, stages

    # One thread: on a small shared CPU two threads spinning at OpenMP barriers made a step 5-20x
    # slower than one (measured here under the load of other sessions).
    torch.set_num_threads(1)
    work = Path(work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    carry = work / "carry"
    recipe = preset("tiny")
    summary: dict = {"recipe": "tiny"}
    t0 = time.time()

    def call(n: int, fn, **kw):
        dev, out = work / f"device{n}", work / f"out{n}"
        started = time.time()
        fn(work=dev, out=out, **kw)
        files = sorted(p.name for p in out.iterdir())
        big = [p.name for p in out.iterdir() if p.stat().st_size > checkpoint.PART_BYTES]
        if len(files) > 8 or big:
            raise RuntimeError(f"call {n} would bring back {len(files)} files, too large: {big}")
        stages.collect(out, carry)
        summary[f"call{n}"] = {"seconds": round(time.time() - started, 1), "files": files,
                               "bytes": sum(p.stat().st_size for p in out.iterdir())}
        return dev

    call(1, stages.run_codec, recipe=recipe, minutes=30, max_steps=codec_steps)
    call(2, stages.run_codec, recipe=recipe, minutes=30, resume=carry / "codec", max_steps=10)
    codec_record = checkpoint.read_record(carry / "unpacked" / "codec")
    summary["codec"] = {"step": codec_record["step"], "resume": codec_record["resume"],
                        "heldout": codec_record["heldout"], "parameters": codec_record["codec_parameters"]}
    dev3 = call(3, stages.run_lm, recipe=recipe, minutes=30, codec_model=carry / "codec-model", max_steps=lm_steps)
    call(4, stages.run_lm, recipe=recipe, minutes=30, codec_model=carry / "codec-model", resume=carry / "lm",
         max_steps=20)
    lm_record = checkpoint.read_record(carry / "unpacked" / "lm")
    summary["lm"] = {"step": lm_record["step"], "resume": lm_record["resume"], "heldout": lm_record["heldout"],
                     "last": lm_record["last"], "parameters": lm_record["parameters"]}

    model = stages.run_export(carry / "unpacked" / "lm", carry / "unpacked" / "codec-model", work / "model")
    from recipes.voice.export import sizes

    summary["export"] = sizes(model)
    summary["speech"] = speak(model, dev3)
    summary["seconds"] = round(time.time() - t0, 1)
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return summary


def speak(model: Path, dev: Path) -> dict:
    """speechctl on the exported model: greedy TTS of training sentences through the engine
    (how many frames match the codes it was trained on), and one CLI cold start."""
    import numpy as np

    from recipes.voice.codes import load_codes
    from speechctl.api import Speech
    from speechctl.engine.engine import EngineConfig
    from speechctl.engine.params import GREEDY

    train = load_codes(dev / "codes", "train")
    speech = Speech(model, engine_config=EngineConfig(max_num_seqs=8, max_model_len=1024))
    rows = []
    try:
        for i in range(3):
            truth = train.item(i)
            result = speech.tts(train.text[i], audio_sampling=GREEDY, max_seconds=2 * truth.shape[1] / speech.codec.frame_rate + 1)
            got = result.codes
            n = min(got.shape[1], truth.shape[1])
            rows.append({"text": train.text[i], "frames": [int(got.shape[1]), int(truth.shape[1])],
                         "code_match": round(float(np.mean(got[:, :n] == truth[:, :n])) if n else 0.0, 3),
                         "first_codebook_match": round(float(np.mean(got[0, :n] == truth[0, :n])) if n else 0.0, 3)})
    finally:
        speech.close()
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "speechctl.cli", "tts", "Hello world", "--model", str(model),
                           "-o", str(model.parent / "hello.wav")], capture_output=True, text=True)
    return {"greedy_vs_training_codes": rows, "cli_ok": proc.returncode == 0,
            "cli_seconds": round(time.time() - started, 1), "cli_said": proc.stderr.strip().splitlines()[-1:]}
