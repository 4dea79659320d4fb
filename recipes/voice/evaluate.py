"""Held-out checks on this CPU: the codec's reconstruction (SNR, and Whisper's word error rate on
the original against the reconstruction: the issue asks for at most 2 points more), and issue
20's round-trip table — the same held-out sentences as espeak-ng spoke them, through the codec,
and said by the exported voice through speechctl itself (its prompts, vLLM engine and codec)."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import numpy as np


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def word_errors(ref: str, hyp: str) -> int:
    """Word edits (substitutions, deletions, insertions) from ``ref`` to ``hyp``, on lower-cased
    words (jiwer, installed with speechctl's test extras)."""
    import jiwer

    ref_words, hyp_words = words(ref), words(hyp)
    if not ref_words or not hyp_words:
        return max(len(ref_words), len(hyp_words))
    out = jiwer.process_words(" ".join(ref_words), " ".join(hyp_words))
    return out.substitutions + out.deletions + out.insertions


def wer(refs: list[str], hyps: list[str]) -> float:
    """Word error rate over a set (errors / reference words), on lower-cased words."""
    errors = sum(word_errors(r, h) for r, h in zip(refs, hyps))
    return errors / max(1, sum(len(words(r)) for r in refs))


def transcribe(waves: list[np.ndarray], asr, rate: int = 16000) -> list[str]:
    """Whisper's text of each wave (at ``rate``): ``asr`` an engine from ``speechctl.api.load_asr``."""
    from speechctl.api import AsrJob
    from speechctl.pipeline.asr import resample

    if rate != 16000:  # Whisper hears 16 kHz
        waves = [resample(w, rate, 16000) for w in waves]
    results = {r.id: r.text or "" for r in asr.run(AsrJob(id=str(i), audio=w) for i, w in enumerate(waves))}
    return [results[str(i)] for i in range(len(waves))]


def heldout_split(data_dir: Path, data_config):
    """The held-out split of ``data_dir``, synthesized there first (those sentences alone, minutes
    here) when the directory has no data."""
    from recipes.voice.data import build, load_split, read_manifest

    if read_manifest(data_dir) is None:
        build(data_config, data_dir, limit_hours=0)
    return load_split(data_dir, "heldout")


def reconstruct(codec_model: Path, split, n: int, first: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
    """``n`` held-out utterances from the ``first``-th, through the codec and back: (originals,
    rebuilt, SNRs in dB)."""
    import torch

    from recipes.voice.codes import load_codec_model

    model = load_codec_model(codec_model)
    hop = math.prod(model.config.downsampling_ratios)
    originals, rebuilt, snrs = [], [], []
    with torch.no_grad():
        for i in range(first, first + n):
            x = split.wave(i)
            padded = np.zeros(-(-len(x) // hop) * hop, np.float32)
            padded[: len(x)] = x
            y = model(torch.from_numpy(padded)[None, None]).audio_values[0, : len(x)].numpy()
            originals.append(x)
            rebuilt.append(y)
            snrs.append(float(10 * np.log10(np.sum(x ** 2) / max(np.sum((x - y) ** 2), 1e-12))))
    return originals, rebuilt, snrs


def eval_codec(codec_model: Path, data_dir: Path, out: Path, limit: int | None = None, asr: str | None = "whisper-tiny.en",
               keep_wavs: int = 8) -> dict:
    import soundfile as sf

    from recipes.voice.checkpoint import read_record
    from recipes.voice.config import Recipe

    split = heldout_split(data_dir, Recipe.from_dict(read_record(codec_model)["recipe"]).data)
    n = len(split) if limit is None else min(limit, len(split))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    originals, rebuilt, snrs = reconstruct(codec_model, split, n)
    rate = json.loads((Path(codec_model) / "config.json").read_text())["sampling_rate"]
    for i in range(min(keep_wavs, n)):
        sf.write(out / f"{i:03d}-original.wav", originals[i], rate)
        sf.write(out / f"{i:03d}-codec.wav", rebuilt[i], rate)
    report = {"utterances": n, "snr_db_mean": round(float(np.mean(snrs)), 2)}
    if asr:
        texts = split.text[:n]
        from speechctl.api import load_asr

        engine = load_asr(asr)
        try:
            hyp_orig, hyp_codec = transcribe(originals, engine), transcribe(rebuilt, engine)
        finally:
            engine.close()
        report.update(asr=asr, wer_original=round(wer(texts, hyp_orig), 4), wer_codec=round(wer(texts, hyp_codec), 4))
        report["wer_increase_points"] = round(100 * (report["wer_codec"] - report["wer_original"]), 2)
        (out / "transcripts.json").write_text(json.dumps(
            [{"text": t, "original": a, "codec": b} for t, a, b in zip(texts, hyp_orig, hyp_codec)], indent=2))
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report


def eval_voice(model_dir: Path, data_dir: Path, out: Path, limit: int = 40, samplings=((0.8, 50),), seed: int = 1234,
               asr: str = "whisper-tiny.en", keep_wavs: int = 4, command: str | None = None, first: int = 0,
               repetitions=(None,), dtype: str | None = None) -> dict:
    """Issue 20's round-trip table on ``limit`` held-out sentences from the ``first``-th: Whisper's
    WER on espeak-ng's audio, on the exported voice's codec reconstruction of that audio, and on
    the voice saying the sentences through speechctl's API (``Speech(model_dir)``), one row per
    sampling setting (temperature, top-k and, where a third value is given, the classifier-free
    guidance scale; one seed per sentence) and repetition-aware sampling (``repetitions``: (window,
    max_repeat), (0, 0) off, None the voice's own); ``dtype`` the voice's engine's (None: the
    checkpoint's, as a user gets it). The sentences reported are the first 40;
    settings are chosen on others (``first`` = 40 on): a setting picked on the sentences it is
    reported on reads better than it is. Writes report.json, transcripts.json, table.md (with
    ``command``) and a few wavs to ``out``."""
    import soundfile as sf

    from recipes.voice.config import Recipe
    from speechctl.api import Speech, TtsJob, load_asr
    from speechctl.engine.config import EngineConfig
    from speechctl.engine.params import Guidance, Sampling

    model_dir, out = Path(model_dir), Path(out)
    recipe = Recipe.from_dict(json.loads((model_dir / "speechctl.json").read_text())["recipe"])
    split = heldout_split(data_dir, recipe.data)
    if not 0 <= first < len(split):
        raise ValueError(f"first sentence {first} is outside the {len(split)} held-out sentences")
    n = min(limit, len(split) - first)
    texts = split.text[first:first + n]
    out.mkdir(parents=True, exist_ok=True)
    originals, rebuilt, snrs = reconstruct(model_dir / "codec", split, n, first)
    whisper = load_asr(asr)  # one Whisper engine beside the voice's for the whole table
    speech = None
    try:
        rows = [{"audio": "espeak-ng (the training synthesizer)", "hyps": transcribe(originals, whisper)},
                {"audio": "espeak-ng through the voice's codec", "hyps": transcribe(rebuilt, whisper),
                 "snr_db_mean": round(float(np.mean(snrs)), 2)}]
        speech = Speech(model_dir, engine_config=EngineConfig(dtype=dtype) if dtype else None)
        rate = speech.sample_rate
        for (temperature, top_k, *guided), repetition in itertools.product(samplings, repetitions):
            scale = guided[0] if guided else 1.0
            jobs = [TtsJob(id=str(i), text=t, audio_sampling=Sampling(temperature, top_k), seed=seed + first + i,
                           guidance=Guidance(scale=scale), repetition=repetition) for i, t in enumerate(texts)]
            # the row's settings past temperature and top-k: in its label and in its wavs' names
            label, suffix = (f", CFG {scale:g}", f"-cfg{scale:g}") if scale != 1.0 else ("", "")
            if repetition is not None:
                ras = "off" if repetition == (0, 0) else f"{repetition[0]}/{repetition[1]}"
                label, suffix = f"{label}, repetition-aware {ras}", f"{suffix}-ras{ras.replace('/', '-')}"
            results = {r.id: r for r in speech.run(jobs)}
            failed = [r.error for r in results.values() if r.error]
            if failed:
                raise RuntimeError(f"the voice failed on {len(failed)} sentences: {failed[0]}")
            waves = [results[str(i)].audio for i in range(n)]
            for i in range(min(keep_wavs, n)):
                sf.write(out / f"{i:03d}-voice-t{temperature:g}-k{top_k}{suffix}.wav", waves[i], rate)
            rows.append({"audio": f"speechctl's voice, temperature {temperature:g}, top-k {top_k}{label}",
                         "temperature": temperature, "top_k": top_k, "cfg_scale": scale,
                         "repetition": list(repetition) if repetition is not None else None,
                         "hyps": transcribe(waves, whisper, rate),
                         "seconds_of_audio": round(sum(len(w) for w in waves) / rate, 1)})
    finally:
        if speech is not None:
            speech.close()
        whisper.close()
    for row in rows:
        row["wer"] = round(wer(texts, row["hyps"]), 4)
    report = {"utterances": n, "first": first, "asr": asr, "seed": seed, "model": str(model_dir), "dtype": dtype,
              "command": command,
              "rows": [{k: v for k, v in r.items() if k != "hyps"} for r in rows]}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "transcripts.json").write_text(json.dumps(
        [{"text": t, **{r["audio"]: r["hyps"][i] for r in rows}} for i, t in enumerate(texts)], indent=2))
    lines = [f"Whisper ({asr}) on {n} held-out sentences the voice never trained on"
             + (f" (from the {first}-th)" if first else ""), "",
             "| audio | WER |", "|---|---|"] + [f"| {r['audio']} | {r['wer']:.3f} |" for r in rows]
    if command:
        lines += ["", "```sh", command, "```"]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return report
