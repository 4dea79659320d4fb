"""Held-out checks on this CPU: the codec's reconstruction (SNR, and Whisper's word error rate on
the original against the reconstruction: the issue asks for at most 2 points more), and the
speech LM's voice through speechctl itself (``speechctl tts --model DIR``)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def wer(refs: list[str], hyps: list[str]) -> float:
    """Word error rate over a set (errors / reference words), on lower-cased words."""
    errors = sum(edit_distance(words(r), words(h)) for r, h in zip(refs, hyps))
    return errors / max(1, sum(len(words(r)) for r in refs))


def transcribe(waves: list[np.ndarray], model: str = "whisper-tiny.en") -> list[str]:
    from speechctl.api import AsrJob, load_asr

    asr = load_asr(model)
    try:
        results = {r.id: r.text or "" for r in asr.run(AsrJob(id=str(i), audio=w) for i, w in enumerate(waves))}
    finally:
        asr.close()
    return [results[str(i)] for i in range(len(waves))]


def eval_codec(codec_model: Path, data_dir: Path, out: Path, limit: int | None = None, asr: str | None = "whisper-tiny.en",
               keep_wavs: int = 8) -> dict:
    import soundfile as sf
    import torch

    from recipes.voice.codes import load_codec_model
    from recipes.voice.data import build, load_split, read_manifest

    if read_manifest(data_dir) is None:  # synthesize the held-out sentences alone (minutes here)
        from recipes.voice.checkpoint import read_record
        from recipes.voice.config import Recipe

        build(Recipe.from_dict(read_record(codec_model)["recipe"]).data, data_dir, limit_hours=0)
    model = load_codec_model(codec_model)
    hop = math.prod(model.config.downsampling_ratios)
    rate = model.config.sampling_rate
    split = load_split(data_dir, "heldout")
    n = len(split) if limit is None else min(limit, len(split))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    originals, rebuilt, snrs = [], [], []
    with torch.no_grad():
        for i in range(n):
            x = split.wave(i)
            padded = np.zeros(-(-len(x) // hop) * hop, np.float32)
            padded[: len(x)] = x
            y = model(torch.from_numpy(padded)[None, None]).audio_values[0, : len(x)].numpy()
            originals.append(x)
            rebuilt.append(y)
            snrs.append(float(10 * np.log10(np.sum(x ** 2) / max(np.sum((x - y) ** 2), 1e-12))))
            if i < keep_wavs:
                sf.write(out / f"{i:03d}-original.wav", x, rate)
                sf.write(out / f"{i:03d}-codec.wav", y, rate)
    report = {"utterances": n, "snr_db_mean": round(float(np.mean(snrs)), 2)}
    if asr:
        texts = split.text[:n]
        hyp_orig, hyp_codec = transcribe(originals, asr), transcribe(rebuilt, asr)
        report.update(asr=asr, wer_original=round(wer(texts, hyp_orig), 4), wer_codec=round(wer(texts, hyp_codec), 4))
        report["wer_increase_points"] = round(100 * (report["wer_codec"] - report["wer_original"]), 2)
        (out / "transcripts.json").write_text(json.dumps(
            [{"text": t, "original": a, "codec": b} for t, a, b in zip(texts, hyp_orig, hyp_codec)], indent=2))
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report
