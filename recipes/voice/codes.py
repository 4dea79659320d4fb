"""Codec codes of every utterance: what the LM trains on.

    CODES/train.npy, CODES/heldout.npy    int16 [K, frames of all utterances back to back]
    CODES/train.json, CODES/heldout.json  {"text": [...], "offset": [...], "frames": [...],
                                           "words": [...] (word count of each utterance),
                                           "phonemes": [...] (the data's)}
    CODES/train.words.npy, ...            int32 [words, 3]: character start, length, first frame
                                          (the data's word starts, ``data.py``, in frames)
    CODES/manifest.json                   codec and data hashes, codes sha256, frame rate

The codes of given audio depend on the codec's encoder and quantizer alone: ``codes_identity``
hashes those, so that a decoder trained on after the codes were frozen (``codec_train.freeze_codes``)
keeps the LM trained on them valid.

An utterance of n samples has ceil(n / hop) frames (zero-padded to whole frames). Batches are
formed by sorted length in a fixed way, so the same codec and data give the same codes.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recipes.voice.data import SPLITS, load_split, read_manifest


@dataclass
class CodeSplit:
    codes: np.ndarray  # [K, F] int16
    text: list[str]
    offset: np.ndarray  # [U] int64 frame offsets
    frames: np.ndarray  # [U] int64
    words: np.ndarray | None = None  # [W, 3] int32 (module doc), utterances back to back
    word_counts: np.ndarray | None = None  # [U] int64
    phonemes: list[str] | None = None  # each utterance's (``speechctl.phonemes``)

    def __len__(self) -> int:
        return len(self.text)

    def item(self, i: int) -> np.ndarray:
        o, n = int(self.offset[i]), int(self.frames[i])
        return self.codes[:, o: o + n].astype(np.int64)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def codes_identity(codec_dir: Path) -> str:
    """sha256 of the tensors that fix a saved codec's codes (``encoder.*`` and ``quantizer.*`` of
    its model.safetensors: names, dtypes, shapes and bytes, in name order); the decoder is left out."""
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(Path(codec_dir) / "model.safetensors"), framework="pt") as f:
        for name in sorted(k for k in f.keys() if k.startswith(("encoder.", "quantizer."))):
            t = f.get_tensor(name).contiguous()
            digest.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def load_codec_model(path: Path, device: str = "cpu"):
    """The DacModel of a saved codec directory as speechctl itself loads it (``DacCodec``: float32,
    a float32 quantizer read exactly; eval, no gradients)."""
    from speechctl.codecs.dac import DacCodec

    return DacCodec(path, device).model


def encode_split(model, split, device: str, batch_seconds: float = 600.0) -> tuple[np.ndarray, np.ndarray]:
    """All utterances of a data split -> ([K, F] int16 codes back to back, [U] frame counts)."""
    return encode_waves(model, split.length, split.wave, device, batch_seconds)


@torch.no_grad()
def encode_waves(model, lengths: np.ndarray, wave, device: str, batch_seconds: float = 600.0) -> tuple[np.ndarray, np.ndarray]:
    """Utterances of ``lengths`` samples (``wave(i)``: utterance i, float32 in [-1, 1)) -> ([K, F]
    int16 codes back to back, [U] frame counts), encoded in batches of about ``batch_seconds``
    (padded) of similar lengths."""
    hop = math.prod(model.config.downsampling_ratios)
    rate = model.config.sampling_rate
    frames = (np.asarray(lengths, np.int64) + hop - 1) // hop
    order = np.argsort(frames, kind="stable")
    out: list[np.ndarray | None] = [None] * len(frames)
    limit = max(1, int(batch_seconds * rate / hop))  # frames per batch (padded)
    i = 0
    while i < len(order):
        longest = int(frames[order[i]])
        j = i
        while j < len(order) and (j - i + 1) * max(longest, int(frames[order[j]])) <= limit:
            longest = max(longest, int(frames[order[j]]))
            j += 1
        j = max(j, i + 1)
        batch = order[i:j]
        T = int(frames[batch].max())
        x = np.zeros((len(batch), T * hop), dtype=np.float32)
        for row, u in enumerate(batch):
            w = wave(int(u))
            x[row, : len(w)] = w
        codes = model.encode(torch.from_numpy(x).to(device)[:, None]).audio_codes.cpu().numpy()
        for row, u in enumerate(batch):
            out[u] = codes[row, :, : frames[u]].astype(np.int16)
        i = j
    K = model.config.n_codebooks
    flat = np.concatenate([c for c in out], axis=1) if out else np.zeros((K, 0), np.int16)
    return flat, frames.astype(np.int64)


class ChunkEncoder:
    """The codes of utterances as they are made (``data.build``'s ``sink``): waves gathered in
    order and encoded about ``chunk_seconds`` of audio at a time, so that the device encodes one
    chunk while the CPU workers speak the next; ``result(split)`` gives what ``encode_split``
    gives for the finished split. ``busy_s``: the main process's time in the encoder."""

    def __init__(self, model, device: str, chunk_seconds: float = 3600.0, batch_seconds: float = 600.0):
        self.model, self.device, self.batch_seconds = model, device, batch_seconds
        self.chunk_samples = chunk_seconds * model.config.sampling_rate
        self.pending: list[np.ndarray] = []
        self.pending_samples = 0
        self.parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.busy_s = 0.0

    def add(self, split: str, wave: np.ndarray) -> None:
        """``wave``: int16 samples."""
        self.pending.append(wave)
        self.pending_samples += len(wave)
        if self.pending_samples >= self.chunk_samples:
            self._encode(split)

    def end(self, split: str) -> None:
        self._encode(split)
        self.parts.setdefault(split, [])

    def _encode(self, split: str) -> None:
        from speechctl.codecs.dac import codes_in_float32

        started = time.perf_counter()
        waves, self.pending, self.pending_samples = self.pending, [], 0
        if waves:
            with codes_in_float32():  # as speechctl computes codes (and ``extract``)
                part = encode_waves(self.model, np.array([len(w) for w in waves], np.int64),
                                    lambda i: waves[i].astype(np.float32) / 32768.0, self.device, self.batch_seconds)
            self.parts.setdefault(split, []).append(part)
        self.busy_s += time.perf_counter() - started

    def result(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        parts = self.parts[split]
        if not parts:
            return np.zeros((self.model.config.n_codebooks, 0), np.int16), np.zeros(0, np.int64)
        return np.concatenate([c for c, _ in parts], axis=1), np.concatenate([f for _, f in parts])


def _deterministic(device: str) -> None:
    if device.startswith("cuda"):
        torch.backends.cudnn.deterministic = True  # same codes on every run of the same data
        torch.backends.cudnn.benchmark = False


def extract(codec_dir: Path, data_dir: Path, out: Path, device: str, data_sha256: str, log=print,
            encoded: ChunkEncoder | None = None) -> dict:
    """Encode every split of ``data_dir`` with the codec at ``codec_dir`` into ``out``;
    ``encoded``: the splits' codes already made while the data was (``ensure_with_data``)."""
    from speechctl.codecs.dac import codes_in_float32

    started = time.time()
    _deterministic(device)
    model = encoded.model if encoded is not None else load_codec_model(codec_dir, device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name in SPLITS:
        split = load_split(data_dir, name)
        if encoded is not None:
            codes, frames = encoded.result(name)
        else:
            with codes_in_float32():  # as speechctl computes codes
                codes, frames = encode_split(model, split, device)
        if len(frames) != len(split):
            raise RuntimeError(f"codes of {len(frames)} {name} utterances for {len(split)} in {data_dir}")
        words = None
        if split.words is not None:  # word starts in frames (a word starting mid-frame: that frame)
            words = split.words.copy()
            words[:, 2] //= math.prod(model.config.downsampling_ratios)
        write_split(out, name, codes, split.text, frames, words, split.word_counts, split.phonemes)
        splits[name] = {"utterances": len(split), "frames": int(frames.sum()),
                        "codes_sha256": hashlib.sha256(codes.tobytes()).hexdigest(), "words": words is not None,
                        "phonemes": split.phonemes is not None}
    manifest = {
        "codec_sha256": file_sha256(Path(codec_dir) / "model.safetensors"),
        "codes_identity": codes_identity(codec_dir),
        "data_sha256": data_sha256,
        "frame_rate": model.config.sampling_rate / math.prod(model.config.downsampling_ratios),
        "num_codebooks": model.config.n_codebooks,
        "codebook_size": model.config.codebook_size,
        "splits": splits,
        "seconds": round(time.time() - started + (encoded.busy_s if encoded is not None else 0.0), 1),
        "made_with_data": encoded is not None,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if log:
        how = f" (encoded while the data was made: {encoded.busy_s:.0f} s of its main loop)" if encoded is not None else ""
        log(f"codes: {splits['train']['frames']} train frames, {splits['heldout']['frames']} held out, "
            f"{manifest['seconds']} s{how}")
    return manifest


def write_split(out: Path, name: str, codes: np.ndarray, text: list[str], frames, words=None, word_counts=None,
                phonemes=None) -> None:
    """One split in the layout ``load_codes`` reads: [K, F] codes back to back (int16), and each
    utterance's text, frame offset and frame count; its words and phonemes where given."""
    frames = np.asarray(frames, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(frames)[:-1]]) if len(frames) else frames
    np.save(Path(out) / f"{name}.npy", np.asarray(codes).astype(np.int16))
    index = {"text": list(text), "offset": offsets.tolist(), "frames": frames.tolist()}
    if words is not None:
        np.save(Path(out) / f"{name}.words.npy", np.asarray(words, dtype="<i4").reshape(-1, 3))
        index["words"] = np.asarray(word_counts, dtype=np.int64).tolist()
    if phonemes is not None:
        index["phonemes"] = list(phonemes)
    (Path(out) / f"{name}.json").write_text(json.dumps(index))


def ensure(codec_dir: Path, data_dir: Path, out: Path, device: str, data_sha256: str, log=print) -> dict:
    try:
        manifest = json.loads((Path(out) / "manifest.json").read_text())
        has_words = (Path(data_dir) / "train.words.npy").is_file()  # (codes made before the data had words: again)
        has_phonemes = "phonemes_sha256" in (read_manifest(data_dir) or {"splits": {"train": {}}})["splits"]["train"]
        if (manifest["data_sha256"] == data_sha256 and manifest["codes_identity"] == codes_identity(codec_dir)
                and all(split.get("words", False) == has_words and split.get("phonemes", False) == has_phonemes
                        for split in manifest["splits"].values())):
            return manifest
    except (OSError, ValueError, KeyError):
        pass
    return extract(codec_dir, data_dir, out, device, data_sha256, log=log)


def ensure_with_data(codec_dir: Path, config, data_dir: Path, out: Path, device: str, log=print,
                     chunk_seconds: float = 3600.0, workers: int | None = None) -> tuple[dict, dict]:
    """The data set of ``config`` (``data.ensure``'s) and its codes (``ensure``'s): (data manifest,
    codes manifest). Where the data must be made, each hour of it is encoded on ``device`` as soon
    as it is spoken, while the CPU workers speak the next (no second pass over the audio)."""
    from recipes.voice import data

    manifest = data.read_manifest(data_dir)
    if data.matches(manifest, config):
        return manifest, ensure(codec_dir, data_dir, out, device, manifest["sha256"], log=log)
    _deterministic(device)
    encoder = ChunkEncoder(load_codec_model(codec_dir, device), device, chunk_seconds)
    manifest = data.build(config, data_dir, workers=workers, log=log, sink=encoder)
    return manifest, extract(codec_dir, data_dir, out, device, manifest["sha256"], log=log, encoded=encoder)


def load_codes(path: Path, name: str) -> CodeSplit:
    path = Path(path)
    index = json.loads((path / f"{name}.json").read_text())
    words = path / f"{name}.words.npy"
    return CodeSplit(np.load(path / f"{name}.npy"), index["text"], np.asarray(index["offset"], np.int64),
                     np.asarray(index["frames"], np.int64), np.load(words) if words.is_file() else None,
                     np.asarray(index["words"], np.int64) if "words" in index else None, index.get("phonemes"))
