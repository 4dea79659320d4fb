"""The training speech: every sentence of the corpus (``text.py``) spoken by espeak-ng, resampled
to 16 kHz, trimmed of long silences and stored as one int16 file per split, with where each word
starts (espeak-ng's word events, ``espeak_lib.py``).

    DIR/train.pcm, DIR/heldout.pcm    int16 little-endian samples, utterances back to back
    DIR/train.json, DIR/heldout.json  {"text": [...], "offset": [...], "length": [...] (samples),
                                       "words": [...] (word count of each utterance),
                                       "phonemes": [...] (espeak-ng's, ``speechctl.phonemes``)}
    DIR/train.words.npy, ...          int32 [words, 3]: character start, length, first sample in
                                      its utterance, utterances back to back
    DIR/manifest.json                 settings, espeak-ng version, corpus digest, audio sha256

The same settings give the same bytes (espeak-ng is deterministic; the resampler runs in float64),
so every GPU call that finds no data makes it again and checks the hash a checkpoint recorded.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from recipes.voice.config import DataConfig
from recipes.voice.text import estimated_seconds, make_corpus

SPLITS = ("train", "heldout")


class DataError(RuntimeError):
    pass


# -- espeak-ng ------------------------------------------------------------------------------------


def espeak_command(data: str | os.PathLike | None = None) -> list[str]:
    """``$ESPEAK_NG`` (default ``espeak-ng``), with ``--path=DATA`` (default ``$ESPEAK_NG_DATA``,
    when set: the GPU machine unpacks Debian's package under /opt/espeak, see gpu.sh)."""
    binary = os.environ.get("ESPEAK_NG", "espeak-ng")
    if shutil.which(binary) is None:
        raise DataError(f"espeak-ng not found ({binary}); apt-get install espeak-ng, or set ESPEAK_NG")
    data = data or os.environ.get("ESPEAK_NG_DATA")
    return [binary] + ([f"--path={data}"] if data else [])


def espeak_version() -> str:
    out = subprocess.run(espeak_command() + ["--version"], capture_output=True, text=True, check=True)
    return out.stdout.split("Data at")[0].strip()


def synthesize(text: str, config: DataConfig, espeak_data: str | os.PathLike | None = None) -> tuple[np.ndarray, int]:
    """espeak-ng's waveform of ``text``: (int16 samples, their rate); ``espeak_data``: a
    directory holding another ``espeak-ng-data`` to speak with (``espeak_command``)."""
    command = espeak_command(espeak_data) + ["-v", config.voice, "-s", str(config.words_per_minute), "-p", str(config.pitch),
                                  "--stdout"]
    # The text goes in on stdin: a sentence that starts with "-" is not an option there.
    out = subprocess.run(command, input=text.encode(), capture_output=True, check=True).stdout
    return _parse_wav(out)


def _parse_wav(data: bytes) -> tuple[np.ndarray, int]:
    """espeak-ng's streamed WAV (its sizes are placeholders): 16-bit mono PCM after 'data'."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise DataError("espeak-ng wrote no WAV")
    rate = int.from_bytes(data[24:28], "little")
    channels, bits = int.from_bytes(data[22:24], "little"), int.from_bytes(data[34:36], "little")
    if channels != 1 or bits != 16:
        raise DataError(f"espeak-ng wrote {channels} channels of {bits} bits")
    start = data.index(b"data", 36) + 8
    pcm = data[start:]
    return np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").copy(), rate


# -- resampling (torchaudio's windowed-sinc method, in float64 so that it is reproducible) --------


@lru_cache(maxsize=4)
def _sinc_kernel(orig: int, new: int, zeros: int = 16, rolloff: float = 0.945, beta: float = 14.769656459379492):
    import torch

    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * rolloff
    width = math.ceil(zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx) * base
    t = t.clamp(-zeros, zeros)
    window = torch.i0(beta * torch.sqrt(1 - (t / zeros) ** 2)) / torch.i0(torch.tensor(beta, dtype=torch.float64))
    t = t * math.pi
    kernel = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * window * (base / orig)
    return kernel, width, orig, new


def resample(x: np.ndarray, orig: int, new: int) -> np.ndarray:
    """[L] float -> [ceil(L * new / orig)] float64, band-limited (Kaiser-windowed sinc)."""
    import torch

    if orig == new:
        return np.asarray(x, dtype=np.float64)
    kernel, width, o, n = _sinc_kernel(orig, new)
    wave = torch.from_numpy(np.asarray(x, dtype=np.float64))
    length = wave.shape[0]
    padded = torch.nn.functional.pad(wave[None, None], (width, width + o))
    y = torch.nn.functional.conv1d(padded, kernel, stride=o)  # [1, n, blocks]
    y = y.transpose(1, 2).reshape(-1)
    return y[: math.ceil(n * length / o)].numpy()


def trim_bounds(x: np.ndarray, rate: int, keep_s: float, threshold: float = 1e-3) -> tuple[int, int]:
    """(start, end) of ``x`` with leading and trailing silence cut down to ``keep_s`` seconds."""
    loud = np.flatnonzero(np.abs(x) > threshold)
    if loud.size == 0:
        return 0, 0
    keep = int(keep_s * rate)
    return max(0, int(loud[0]) - keep), min(len(x), int(loud[-1]) + 1 + keep)


def trim_silence(x: np.ndarray, rate: int, keep_s: float, threshold: float = 1e-3) -> np.ndarray:
    start, end = trim_bounds(x, rate, keep_s, threshold)
    return x[start:end]


_SYNTHESIZERS: dict = {}  # one espeak-ng server per process and settings (espeak_lib.py)


def utterance(text: str, config: DataConfig) -> tuple[np.ndarray, np.ndarray, str]:
    """``text`` spoken, at ``config.sample_rate``, int16; its words ([n, 3] int32: character
    start, length, first sample in the returned wave); its phonemes (``speechctl.phonemes``)."""
    from recipes.voice.espeak_lib import Synthesizer

    key = (config.voice, config.words_per_minute, config.pitch, os.environ.get("ESPEAK_NG_DATA"))
    if key not in _SYNTHESIZERS:
        _SYNTHESIZERS[key] = Synthesizer(*key)
    pcm, rate, words, phonemes = _SYNTHESIZERS[key].synthesize(text)
    wave = resample(pcm.astype(np.float64) / 32768.0, rate, config.sample_rate)
    start, end = trim_bounds(wave, config.sample_rate, config.max_silence_s)
    wave = wave[start:end]
    words = words.copy()
    words[:, 2] = np.clip(np.floor(words[:, 2] * (config.sample_rate / rate)) - start, 0, len(wave))
    return np.clip(np.round(wave * 32768.0), -32768, 32767).astype("<i2"), words, phonemes


def _worker_init():
    import torch

    torch.set_num_threads(1)


def _job(args):
    text, config = args
    return utterance(text, config)


@contextmanager
def _synthesizer(workers: int):
    """A function mapping (text, config) pairs to waves in order: inline for one worker, else a
    pool of spawned processes. Not forked: a fork of a process whose torch already started its
    OpenMP threads can hang in the child's first conv1d (seen under pytest, after other tests)."""
    if workers <= 1:
        yield lambda jobs: map(_job, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(workers, initializer=_worker_init) as pool:
        yield lambda jobs: pool.imap(_job, jobs, chunksize=16)


# -- the data set ---------------------------------------------------------------------------------


@dataclass
class Split:
    """One split in memory: int16 samples back to back, and where each utterance lies."""

    audio: np.ndarray  # [N] int16
    text: list[str]
    offset: np.ndarray  # [U] int64
    length: np.ndarray  # [U] int64
    words: np.ndarray | None = None  # [W, 3] int32 (module doc), utterances back to back
    word_counts: np.ndarray | None = None  # [U] int64
    phonemes: list[str] | None = None  # each utterance's (``speechctl.phonemes``)

    def __len__(self) -> int:
        return len(self.text)

    def wave(self, i: int) -> np.ndarray:
        """Utterance i as float32 in [-1, 1)."""
        o, n = int(self.offset[i]), int(self.length[i])
        return self.audio[o: o + n].astype(np.float32) / 32768.0


def build(config: DataConfig, out: Path, workers: int | None = None, limit_hours: float | None = None,
          log=print, sink=None) -> dict:
    """Synthesize the corpus into ``out`` (replacing what is there); returns the manifest.
    ``limit_hours``: only the first sentences of the training text, about that much audio (the
    codec needs less than the LM; a prefix of the corpus is the same whatever the limit).
    ``sink``: takes every utterance as it is made, in order (``sink.add(split, wave)``, then
    ``sink.end(split)``), on the main process while the workers speak the next ones (the voice's
    codes are computed so: ``codes.ChunkEncoder``)."""
    out = Path(out)
    corpus = make_corpus(config)
    train = corpus.train
    if limit_hours is not None:
        budget, n = limit_hours * 3600, 0
        while n < len(train) and budget > 0:
            budget -= estimated_seconds(train[n])
            n += 1
        train = train[:n]
    workers = workers or os.cpu_count() or 1
    version = espeak_version()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.time()
    splits = {}
    busy = 0.0  # the main process's own time on results (the rest: waiting for the workers)
    with _synthesizer(workers) as synthesize_all:
        for name, texts in (("train", train), ("heldout", corpus.heldout)):
            digest = hashlib.sha256()
            offsets, lengths, position, words, phonemes = [], [], 0, [], []
            with open(tmp / f"{name}.pcm", "wb") as f:
                for i, (wave, spoken, names) in enumerate(synthesize_all((t, config) for t in texts)):
                    took = time.perf_counter()
                    data = wave.tobytes()
                    f.write(data)
                    digest.update(data)
                    offsets.append(position)
                    lengths.append(len(wave))
                    words.append(spoken)
                    phonemes.append(names)
                    position += len(wave)
                    if sink is not None:
                        sink.add(name, wave)
                    busy += time.perf_counter() - took
                    if log and (i + 1) % 5000 == 0:
                        log(f"data: {name} {i + 1}/{len(texts)} utterances, {time.time() - started:.0f} s")
            if sink is not None:
                took = time.perf_counter()
                sink.end(name)
                busy += time.perf_counter() - took
            flat_words = np.concatenate(words).astype("<i4") if words else np.zeros((0, 3), "<i4")
            np.save(tmp / f"{name}.words.npy", flat_words)
            index = {"text": texts, "offset": offsets, "length": lengths, "words": [len(w) for w in words],
                     "phonemes": phonemes}
            (tmp / f"{name}.json").write_text(json.dumps(index))
            splits[name] = {
                "utterances": len(texts),
                "hours": round(position / config.sample_rate / 3600, 3),
                "pcm_sha256": digest.hexdigest(),
                "words_sha256": hashlib.sha256(flat_words.tobytes()).hexdigest(),
                "phonemes_sha256": hashlib.sha256("\n".join(phonemes).encode()).hexdigest(),
                "empty": int(sum(n == 0 for n in lengths)),
            }
    manifest = {
        "config": asdict(config),
        "espeak_ng": version,
        "corpus_sha256": corpus.digest(),
        "natural_sentences": corpus.natural,
        "limit_hours": limit_hours,
        "splits": splits,
        "sha256": data_hash(splits, corpus.digest()),
        "seconds": round(time.time() - started, 1),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    if log:
        log(f"data: {splits['train']['hours']} h train, {splits['heldout']['utterances']} held out, "
            f"sha256 {manifest['sha256'][:16]}, {manifest['seconds']} s with {workers} workers "
            f"(its main loop busy {busy:.0f} s of it)")
    return manifest


def data_hash(splits: dict, corpus_sha256: str) -> str:
    h = hashlib.sha256(corpus_sha256.encode())
    for name in SPLITS:
        h.update(splits[name]["pcm_sha256"].encode())
    return h.hexdigest()


def read_manifest(path: Path) -> dict | None:
    try:
        return json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def matches(manifest: dict | None, config: DataConfig, limit_hours: float | None = None) -> bool:
    """Whether the data set of ``manifest`` is the one of these settings (and has word starts)."""
    return (manifest is not None and manifest["config"] == asdict(config) and manifest.get("limit_hours") == limit_hours
            and all("words_sha256" in split and "phonemes_sha256" in split  # (made without words, phonemes)
                    for split in manifest["splits"].values()))


def ensure(config: DataConfig, path: Path, expect_sha256: str | None = None, limit_hours: float | None = None,
           strict: bool = False, log=print) -> dict:
    """The data set of ``config`` (the first ``limit_hours`` of it) at ``path``: reused when its
    manifest has exactly these settings, made otherwise. ``expect_sha256``: what a checkpoint
    being resumed was trained on; another hash (another espeak-ng build; in principle a last-bit
    difference of the float64 resampler on another CPU) is an error with ``strict``, else a
    warning (a resumed codec sees random crops: one sample's LSB does not matter)."""
    manifest = read_manifest(path)
    if not matches(manifest, config, limit_hours):
        manifest = build(config, path, limit_hours=limit_hours, log=log)
    if expect_sha256 and manifest["sha256"] != expect_sha256:
        message = (f"the data at {path} (sha256 {manifest['sha256'][:16]}) is not what the checkpoint was trained "
                   f"on ({expect_sha256[:16]}): another espeak-ng build or other settings")
        if strict:
            raise DataError(message)
        if log:
            log("WARNING: " + message)
    return manifest


def load_split(path: Path, name: str, mmap: bool = True) -> Split:
    path = Path(path)
    index = json.loads((path / f"{name}.json").read_text())
    pcm = path / f"{name}.pcm"
    # (an empty split, as the held-out-only data of the evaluations has for training, cannot be mapped)
    audio = np.memmap(pcm, dtype="<i2", mode="r") if mmap and pcm.stat().st_size else np.fromfile(pcm, "<i2")
    words = path / f"{name}.words.npy"
    return Split(audio, index["text"], np.asarray(index["offset"], np.int64), np.asarray(index["length"], np.int64),
                 np.load(words) if words.is_file() else None,
                 np.asarray(index["words"], np.int64) if "words" in index else None, index.get("phonemes"))
