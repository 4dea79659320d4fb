"""How fast a candidate shape speaks on this CPU through speechctl's vLLM engine.

A random-weight checkpoint of the shape (``create_multistream_checkpoint``) is loaded by
``speechctl.api.Speech``; one request of exactly ``frames`` audio frames (``min_frames`` =
``max_frames``) is generated ``repeats`` times; the best run counts (the CPU is shared). Speed
does not depend on the weights' values, so this picks the backbone size and frame rate before
anything is trained.

    python -m recipes.voice speed --frames 100                     # the full shape
    python -m recipes.voice speed --set lm.num_layers=12 --cli     # another shape, + CLI cold starts
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recipes.voice.config import CodecShape, LMShape, multistream_recipe


def measure(lm: LMShape, codec: CodecShape, frames: int = 100, repeats: int = 3, cli: bool = False,
            cli_seconds: float = 1.2, log=print) -> dict:
    from speechctl.api import Speech
    from speechctl.engine.engine import EngineConfig
    from speechctl.engine.params import Sampling
    from speechctl.models.generic.checkpoint import create_multistream_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = create_multistream_checkpoint(Path(tmp) / "m", multistream_recipe(lm, codec))
        started = time.perf_counter()
        speech = Speech(path, engine_config=EngineConfig(max_num_seqs=4, max_model_len=frames + 512))
        startup = time.perf_counter() - started
        sampling = Sampling(temperature=0.9, top_k=50)
        runs, cpu, decodes = [], [], []
        for i in range(repeats + 1):  # the first is a warm-up
            request = speech.prompts.tts(
                "The quick brown fox jumps over the lazy dog.", audio_sampling=sampling, seed=i,
                max_frames=frames, min_frames=frames,
            )
            t0, c0 = time.perf_counter(), time.process_time()
            (out,) = list(speech.engine.generate([request]))
            t1, c1 = time.perf_counter(), time.process_time()
            (codes,) = speech.prompts.audio_segments(out, starts_in_audio=True)
            speech.codec.decode([codes])
            t2 = time.perf_counter()
            if i:
                runs.append(t1 - t0)
                cpu.append(c1 - c0)
                decodes.append(t2 - t1)
        frame_rate = speech.codec.frame_rate
        speech.close()
        best, best_decode = min(runs), min(decodes)
        result = {
            "lm": lm.describe(),
            "codec": {**codec.describe(), "frame_rate": frame_rate},
            "frames": frames,
            "audio_s": round(frames / frame_rate, 2),
            "engine_startup_s": round(startup, 2),
            "generate_s": [round(r, 3) for r in runs],
            "frames_per_s": round(frames / best, 1),
            # CPU time of this process (the engine runs in it): what an idle machine's wall time
            # would be, as long as the engine keeps to one thread (vLLM's CPU worker does here)
            "generate_cpu_s": [round(c, 3) for c in cpu],
            "frames_per_cpu_s": round(frames / min(cpu), 1),
            "decode_s": round(best_decode, 3),
            "real_time_factor": round((best + best_decode) * frame_rate / frames, 3),  # < 1: faster than real time
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        if cli:
            result["cli_cold_start_s"] = cli_cold_start(path, cli_seconds, repeats)
        log(json.dumps(result))
        return result


def cli_cold_start(path: Path, seconds: float, repeats: int) -> list[float]:
    """Wall time of ``speechctl tts "Hello world" --model path`` in fresh processes; the random
    weights stop at ``--max-seconds`` at the latest, about what a trained model says."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "speechctl.cli", "tts", "Hello world", "--model", str(path),
                 "-o", f"{tmp}/hello.wav", "--max-seconds", str(seconds)],
                check=True, capture_output=True,
            )
            times.append(round(time.perf_counter() - t0, 2))
    return times
