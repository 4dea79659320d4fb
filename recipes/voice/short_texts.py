"""The short texts across seeds: how often the voice says "Hello world" and the fox right.

    python -m recipes.voice.short_texts --model speechctl/voices/default --sampling 0.2:10 --seeds 0:64 \
        --out short.jsonl
    python -m recipes.voice.short_texts --seeds 128:256 --dtype float32 --out short-float32.jsonl

Each text is said once per seed (``TtsJob(seed=s)``, all in one run, as ``tests/test_voice_speaks.py``
does), Whisper tiny.en transcribes it, and each draw becomes a JSON line (text, seed, seconds,
word errors, what was heard); the summary per text (mean word errors, exact, at most one wrong,
in blocks of 16 seeds) goes to stdout. One seed is one draw: the voice's rates need many.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

TEXTS = ("Hello world", "The quick brown fox jumps over the lazy dog.")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a voice checkpoint directory (default: speechctl's default model)")
    p.add_argument("--sampling", default=None, metavar="TEMPERATURE:TOP_K", help="default: the voice's own")
    p.add_argument("--seeds", default="0:64", metavar="FIRST:END")
    p.add_argument("--dtype", default=None, help="the engine's dtype (default: the checkpoint's, as a user gets it)")
    p.add_argument("--text", action="append", default=None, help=f"repeatable (default: {' / '.join(TEXTS)})")
    p.add_argument("--out", required=True, help="JSON lines, one per draw")
    args = p.parse_args(argv)

    from recipes.voice.evaluate import transcribe, word_errors
    from speechctl.api import Speech, TtsJob, load_asr
    from speechctl.engine.config import EngineConfig
    from speechctl.engine.params import Sampling

    first, end = (int(x) for x in args.seeds.split(":"))
    sampling = None
    if args.sampling:
        temperature, top_k = args.sampling.split(":")
        sampling = Sampling(temperature=float(temperature), top_k=int(top_k))
    texts = args.text or list(TEXTS)
    os.environ.pop("SPEECHCTL_MODEL", None)  # no model given: the default, as a user gets it
    speech = Speech(args.model, engine_config=EngineConfig(dtype=args.dtype) if args.dtype else None)
    asr = load_asr("whisper-tiny.en")
    try:
        jobs = [TtsJob(id=f"{i}#{s}", text=t, seed=s, audio_sampling=sampling) for i, t in enumerate(texts) for s in range(first, end)]
        results = {r.id: r for r in speech.run(jobs)}
        bad = [r.error for r in results.values() if r.error]
        if bad:
            raise SystemExit(f"short_texts: {bad[0]}")
        heard = transcribe([results[j.id].audio for j in jobs], asr, speech.sample_rate)
    finally:
        speech.close()
        asr.close()
    rows = [{"text": j.text, "seed": j.seed, "seconds": round(len(results[j.id].audio) / speech.sample_rate, 2),
             "errors": word_errors(j.text, h), "heard": h} for j, h in zip(jobs, heard)]
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, args.out)
    for t in texts:
        errors = np.array([r["errors"] for r in rows if r["text"] == t])
        blocks = [f"{b.mean():.2f}/{int((b == 0).sum())}/{int((b <= 1).sum())}" for b in np.array_split(errors, max(1, len(errors) // 16))]
        print(f"{t!r}: {len(errors)} seeds, mean {errors.mean():.3f} words wrong, exact {int((errors == 0).sum())}, "
              f"at most one wrong {int((errors <= 1).sum())} (blocks of 16: mean/exact/<=1 {' '.join(blocks)})")


if __name__ == "__main__":
    main()
