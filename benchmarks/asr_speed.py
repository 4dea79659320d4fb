"""Whisper speed, side by side in one run: speechctl (vLLM) against transformers' batched
``generate`` and, when installed, CTranslate2 (faster-whisper's engine), on the same windows,
greedy and beam 5, at several batch sizes; audio-s/s and WER beside each.

    python benchmarks/asr_speed.py --batch 1,16,64 --files 128 --out asr-speed.json --plot asr-speed.png

Inputs: the 24 clips of samples/asr (one window each, 1.9-3.1 s), repeated to ``--files`` with a
different 1e-4 noise on every copy, so that no system (speechctl shares encoder outputs of
identical inputs) sees the same input twice; WER is against each copy's sentence. "batch" is the
number of windows in flight: speechctl keeps ``batch x lanes`` sequences in its continuous batch
(lanes = 1 greedy, 5 beam), transformers and CTranslate2 take ``batch`` windows per call. Every
system is timed from waveforms to text (its feature extraction included), after an untimed
warm-up at the same batch size (CUDA graphs, kernel autotuning). Decoding settings:

* speechctl: temperature 0 only, no context, no timestamps, OpenAI's no-speech check off
  (OpenAI's beam search: length normalisation, patience 1);
  (speechctl's defaults otherwise: on a GPU its log-mel features are computed there, and vLLM
  batches, copies and encodes them in its admitting step);
* speechctl-cpu-mel (GPU only, when asked for): the same as speechctl, its log-mel features computed on the CPU
  (``WhisperConfig.feature_device="cpu"``: the feature extractor's ``device``); the speechctl
  systems run each row at every ``--admit-share`` (grouped admission, ``admit_share`` in the row);
* transformers: ``generate(num_beams=1|5, max_new_tokens=224)``, the checkpoint's generation
  config (its beam search: length_penalty 1.0 over the generated length, early_stopping False);
* CTranslate2: ``Whisper.generate(beam_size=1|5)`` on transformers' log-mel features, Whisper's
  suppression (faster-whisper's defaults), the bundled model.bin (whisper-tiny.en only).

The JSON records the exact command (every option spelled out), versions and device; ``--plot``
draws audio-s/s against batch size. speechctl's rows also say where the time went: its engine
steps (``step_s``; ``apply_s`` of it is the host in speechctl's logits processor, ``beam_s`` the
beam steps' share of that), the time outside steps (admission, rendering waits, results), the
steps that admitted lanes and their time (``admitting_step_s``), beam restarts; ``--profile
speechctl`` adds a cProfile of one more, untimed run of each row (the main thread's top functions).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples" / "asr"
RATE = 16000
MODES = {"greedy": 1, "beam5": 5}
SYSTEMS = ("speechctl", "speechctl-cpu-mel", "transformers", "ctranslate2")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="whisper-tiny.en", help="built-in name or Whisper checkpoint directory")
    p.add_argument("--batch", default="1,16,64", help="windows in flight, comma-separated")
    p.add_argument("--files", type=int, default=128, help="windows per measurement")
    p.add_argument("--modes", default="greedy,beam5")
    p.add_argument("--systems", default="speechctl,transformers,ctranslate2",
                   help=f"of {', '.join(SYSTEMS)}; skipped when not installed (speechctl-cpu-mel: without a GPU)")
    p.add_argument("--dtype", default="auto", help="auto: float16 on CUDA, float32 on CPU")
    p.add_argument("--admit-share", default="0",
                   help="speechctl's grouped admission (WhisperConfig.admit_share), comma-separated: each speechctl "
                        "row runs at each, in the same engine (0: a window joins as soon as a lane is free)")
    p.add_argument("--max-tokens", type=int, default=224)
    p.add_argument("--repeats", type=int, default=1,
                   help="timed passes per row; the median pass is reported (one pass of ~1 s swung by up to half on an H100)")
    p.add_argument("--profile", default="",
                   help="systems (comma-separated) whose rows, after their timed run, run once more under cProfile "
                        "to record the functions that held the main thread longest (timed runs are never profiled)")
    p.add_argument("--out", required=True)
    p.add_argument("--plot", default=None)
    args = p.parse_args(argv)
    args.batch = [int(b) for b in str(args.batch).split(",")]
    args.modes = [m for m in str(args.modes).split(",") if m]
    args.systems = [s for s in str(args.systems).split(",") if s]
    args.profile = [s for s in str(args.profile).split(",") if s]
    args.admit_share = [float(x) for x in str(args.admit_share).split(",") if x]
    if not args.admit_share or any(not 0 <= x <= 1 for x in args.admit_share):
        p.error(f"--admit-share: shares of the lanes in [0, 1], got {args.admit_share}")
    if args.repeats < 1:
        p.error(f"--repeats: at least 1, got {args.repeats}")
    bad = [m for m in args.modes if m not in MODES] + [s for s in args.systems + args.profile if s not in SYSTEMS]
    if bad:
        p.error(f"unknown mode/system {bad}")
    return args


def command(args) -> str:
    """The exact command, every option spelled out (defaults too)."""
    parts = ["python", "benchmarks/asr_speed.py", "--model", str(args.model), "--batch", ",".join(map(str, args.batch)),
             "--files", str(args.files), "--modes", ",".join(args.modes), "--systems", ",".join(args.systems),
             "--dtype", args.dtype, "--admit-share", ",".join(f"{x:g}" for x in args.admit_share),
             "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats), "--out", args.out]
    if args.profile:
        parts += ["--profile", ",".join(args.profile)]
    if args.plot:
        parts += ["--plot", args.plot]
    return " ".join(parts)


def inputs(n: int):
    from speechctl.audio import read_audio

    sentences = SAMPLES.joinpath("sentences.txt").read_text().splitlines()
    clips = [read_audio(SAMPLES / f"{i:02d}.flac", RATE) for i in range(1, len(sentences) + 1)]
    rng = np.random.default_rng(0)
    audio = [(clips[k % len(clips)] + rng.normal(0, 1e-4, len(clips[k % len(clips)]))).astype(np.float32) for k in range(n)]
    return audio, [sentences[k % len(sentences)] for k in range(n)]


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER in % after Whisper's English normaliser (edit distance written out: the GPU
    machine has no jiwer)."""
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    norm = EnglishTextNormalizer({})
    errors = words = 0
    for r, h in zip(references, hypotheses):
        r, h = norm(r).split(), norm(h).split()
        d = list(range(len(h) + 1))
        for i, rw in enumerate(r, 1):
            prev, d[0] = d[0], i
            for j, hw in enumerate(h, 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
        errors += d[-1]
        words += len(r)
    return round(100 * errors / max(words, 1), 2)


# --------------------------------------------------------------------------------------------
# The systems: each returns (texts, seconds) for all windows at one batch size
# --------------------------------------------------------------------------------------------


class Speechctl:
    name = "speechctl"
    feature_device = None  # speechctl's default: the engine's device

    def __init__(self, args, on_gpu):
        from speechctl.asr import WhisperAsr, WhisperConfig

        if self.feature_device == "cpu" and not on_gpu:
            raise RuntimeError("needs a GPU (on the CPU it is the speechctl row)")
        lanes = max(MODES[m] for m in args.modes)
        self.asr = WhisperAsr(args.model, WhisperConfig(max_num_seqs=max(args.batch) * lanes, dtype=args.dtype,
                                                        feature_device=self.feature_device))
        self.max_tokens = args.max_tokens

    def run(self, audio, mode, batch, admit_share=None):
        from speechctl.api import AsrJob
        from speechctl.asr import PLAIN_GREEDY

        opts = PLAIN_GREEDY.with_(beam_size=MODES[mode])
        jobs = [AsrJob(id=str(i), audio=a, whisper=opts, max_tokens=self.max_tokens) for i, a in enumerate(audio)]
        self.asr.encoder.cache.clear()  # every measurement encodes its windows (no outputs kept from the last)
        before = self._counters()
        t = time.perf_counter()
        results = {r.id: r for r in self.asr.run(jobs, max_lanes=batch * MODES[mode], admit_share=admit_share)}
        seconds = time.perf_counter() - t
        # where the time went: the engine's steps (our logits processor's host time inside them),
        # the beams, the main thread's wait for rendered windows; the rest is the driver's own
        after = self._counters()
        self.detail = {k: round(after[k] - before[k], 3) if isinstance(after[k], float) else after[k] - before[k] for k in after}
        self.detail["outside_steps_s"] = round(seconds - self.detail["step_s"], 3)
        return [results[str(i)].text or "" for i in range(len(audio))], seconds

    def _counters(self) -> dict:
        counters = self.asr.counters()
        return {k: counters[k] for k in ("steps", "step_s", "admitting_steps", "admitting_step_s", "restarts", "apply_s",
                                         "beam_steps", "beam_s", "kv_copies", "broken_groups", "render_wait_s",
                                         "rendered_ahead", "rendered_inline", "render_calls", "encoded_windows")}

    def close(self):
        self.asr.close()


class SpeechctlCpuMel(Speechctl):
    """speechctl with the log-mel features computed on the CPU (WhisperConfig.feature_device),
    as before its GPU default: on a GPU only (on the CPU it is the speechctl row)."""

    name = "speechctl-cpu-mel"
    feature_device = "cpu"


class Transformers:
    name = "transformers"

    def __init__(self, args, on_gpu):
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        from speechctl.asr.checkpoint import resolve_whisper

        path = resolve_whisper(args.model)
        self.device = "cuda" if on_gpu else "cpu"
        dtype = {"auto": torch.float16 if on_gpu else torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float32": torch.float32}[args.dtype]
        self.processor = WhisperProcessor.from_pretrained(str(path))
        self.model = WhisperForConditionalGeneration.from_pretrained(str(path), dtype=dtype).to(self.device).eval()
        self.dtype, self.max_tokens, self.torch = dtype, args.max_tokens, torch

    def run(self, audio, mode, batch):
        torch = self.torch
        texts = []
        t = time.perf_counter()
        for i in range(0, len(audio), batch):
            feats = self.processor.feature_extractor(audio[i : i + batch], sampling_rate=RATE, return_tensors="pt").input_features
            with torch.inference_mode():
                out = self.model.generate(feats.to(self.device, self.dtype), num_beams=MODES[mode], max_new_tokens=self.max_tokens)
            texts += self.processor.tokenizer.batch_decode(out, skip_special_tokens=True)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return [x.strip() for x in texts], time.perf_counter() - t

    def close(self):
        del self.model


class CTranslate2:
    name = "ctranslate2"

    def __init__(self, args, on_gpu):
        import ctranslate2
        from transformers import WhisperProcessor

        from speechctl.asr.checkpoint import BUILTIN, bundled_source, resolve_whisper

        if str(args.model) not in BUILTIN:
            raise RuntimeError("CTranslate2 runs the bundled model.bin only (whisper-tiny.en)")
        compute = "float16" if on_gpu and args.dtype in ("auto", "float16") else "float32"
        self.model = ctranslate2.models.Whisper(str(bundled_source()[0]), device="cuda" if on_gpu else "cpu", compute_type=compute,
                                                intra_threads=os.cpu_count() if not on_gpu else 0)
        self.processor = WhisperProcessor.from_pretrained(str(resolve_whisper(args.model)))
        self.prompt = self.processor.tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"])
        self.ct2, self.max_tokens = ctranslate2, args.max_tokens

    def run(self, audio, mode, batch):
        texts = []
        t = time.perf_counter()
        for i in range(0, len(audio), batch):
            feats = self.processor.feature_extractor(audio[i : i + batch], sampling_rate=RATE, return_tensors="np").input_features
            view = self.ct2.StorageView.from_array(np.ascontiguousarray(feats, dtype=np.float32))
            results = self.model.generate(view, [self.prompt] * len(feats), beam_size=MODES[mode], max_length=self.max_tokens,
                                          suppress_blank=True, suppress_tokens=[-1])
            texts += [self.processor.tokenizer.decode(r.sequences_ids[0], skip_special_tokens=True).strip() for r in results]
        return texts, time.perf_counter() - t

    def close(self):
        del self.model


# --------------------------------------------------------------------------------------------


def profiled(run, top: int = 30) -> dict:
    """``run()`` under cProfile: its wall time, the ``top`` functions by own time and by
    cumulative time, and speechctl's own functions by cumulative time (seconds, calls), each as
    "folder/file:line(function)"."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    t = time.perf_counter()
    profile.runcall(run)
    wall = time.perf_counter() - t
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive calls, own, cumulative, callers)}

    def name(key):
        file, line, function = key
        return f"{'/'.join(Path(file).parts[-2:])}:{line}({function})"

    def ranked(index, keep=lambda key: True):
        rows = sorted(((k, v) for k, v in stats.items() if keep(k)), key=lambda kv: kv[1][index], reverse=True)[:top]
        return [[name(k), round(v[index], 4), v[0]] for k, v in rows]

    ours = str(ROOT / "speechctl")
    return {"wall_s": round(wall, 3), "own": ranked(2), "cumulative": ranked(3),
            "speechctl": ranked(3, lambda key: key[0].startswith(ours))}


def environment(on_gpu: bool) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name(0) if on_gpu else f"cpu ({os.cpu_count()} cores)"}
    for module in ("vllm", "ctranslate2"):
        try:
            env[module] = __import__(module).__version__
        except ImportError:
            env[module] = None
    from speechctl.bench.report import source_commit

    env["commit"] = source_commit()
    return env


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in record["results"] if r.get("audio_s_per_s")]
    def label(r):  # speechctl rows at several admission shares are lines of their own
        return r["system"] + (f" admit {r['admit_share']:g}" if r.get("admit_share") else "")

    for system in dict.fromkeys(label(r) for r in rows):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            line = sorted((r for r in rows if label(r) == system and r["mode"] == mode), key=lambda r: r["batch"])
            if not line:
                continue
            wer_text = "/".join(f"{r['wer']:g}" for r in line)
            ax.plot([r["batch"] for r in line], [r["audio_s_per_s"] for r in line], marker="o" if mode == "greedy" else "s",
                    linestyle="-" if mode == "greedy" else "--", label=f"{system} {mode} (WER {wer_text} %)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("windows in flight (batch)")
    ax.set_ylabel("audio seconds per second")
    ax.set_title(f"Whisper {record['model']} on {record['environment']['device']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    args = parse(sys.argv[1:] if argv is None else argv)
    from speechctl.accelerator import has_cuda

    on_gpu = has_cuda()
    audio, sentences = inputs(args.files)
    warm_audio, _ = inputs(max(args.batch))  # (other noise would be the same: warm-up inputs differ by index)
    warm_audio = [a * 0.99 for a in warm_audio]
    record = {"command": command(args), "model": str(args.model), "files": args.files,
              "audio_s": round(sum(len(a) for a in audio) / RATE, 2), "environment": environment(on_gpu), "results": [],
              "notes": __doc__.split("\n\n", 2)[2].strip()}
    out = Path(args.out)
    classes = {cls.name: cls for cls in (Speechctl, SpeechctlCpuMel, Transformers, CTranslate2)}
    for cls in (classes[name] for name in args.systems):  # in the order asked for (a timeout keeps the first)
        try:
            t = time.perf_counter()
            system = cls(args, on_gpu)
            startup = round(time.perf_counter() - t, 1)
        except (ImportError, RuntimeError) as e:
            record["results"].append({"system": cls.name, "skipped": str(e).splitlines()[0]})
            print(f"{cls.name}: skipped ({str(e).splitlines()[0]})", flush=True)
            continue
        shares = args.admit_share if isinstance(system, Speechctl) else [None]
        for mode in args.modes:
            for batch in args.batch:
                for share in shares:
                    options = {} if share is None else {"admit_share": share}
                    system.run(warm_audio[:batch], mode, batch, **options)  # warm-up, untimed
                    passes = []  # (seconds, texts, where the pass's time went)
                    for _ in range(args.repeats):
                        texts, seconds = system.run(audio, mode, batch, **options)
                        passes.append((seconds, texts, dict(getattr(system, "detail", {}))))
                    # the median pass (the lower of the middle two for an even count): its time and detail
                    seconds, texts, detail = sorted(passes, key=lambda p: p[0])[(len(passes) - 1) // 2]
                    row = {"system": cls.name, "mode": mode, "batch": batch, "files": len(audio), "wall_s": round(seconds, 3),
                           "wall_s_passes": [round(p[0], 3) for p in passes],
                           "audio_s_per_s": round(record["audio_s"] / seconds, 1), "wer": wer(sentences, texts),
                           "startup_s": startup, **detail}
                    if share is not None:
                        row["admit_share"] = share
                    if cls.name in args.profile:
                        row["profile"] = profiled(lambda: system.run(audio, mode, batch, **options))
                    record["results"].append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
                    out.write_text(json.dumps(record, indent=1) + "\n")  # a timeout keeps what ran
        system.close()
    out.write_text(json.dumps(record, indent=1) + "\n")
    if args.plot:
        plot(record, args.plot)
    return record


if __name__ == "__main__":
    main()
