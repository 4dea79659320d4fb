"""Codec codes of every utterance: what the LM trains on.

    CODES/train.npy, CODES/heldout.npy    int16 [K, frames of all utterances back to back]
    CODES/train.json, CODES/heldout.json  {"text": [...], "offset": [...], "frames": [...],
                                           "words": [...] (word count of each utterance)}
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

from recipes.voice.data import SPLITS, load_split


@dataclass
class CodeSplit:
    codes: np.ndarray  # [K, F] int16
    text: list[str]
    offset: np.ndarray  # [U] int64 frame offsets
    frames: np.ndarray  # [U] int64
    words: np.ndarray | None = None  # [W, 3] int32 (module doc), utterances back to back
    word_counts: np.ndarray | None = None  # [U] int64

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


@torch.no_grad()
def encode_split(model, split, device: str, batch_seconds: float = 600.0) -> tuple[np.ndarray, np.ndarray]:
    """All utterances of a data split -> ([K, F] int16 codes back to back, [U] frame counts)."""
    hop = math.prod(model.config.downsampling_ratios)
    rate = model.config.sampling_rate
    frames = (split.length + hop - 1) // hop
    order = np.argsort(frames, kind="stable")
    out: list[np.ndarray | None] = [None] * len(split)
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
            w = split.wave(int(u))
            x[row, : len(w)] = w
        codes = model.encode(torch.from_numpy(x).to(device)[:, None]).audio_codes.cpu().numpy()
        for row, u in enumerate(batch):
            out[u] = codes[row, :, : frames[u]].astype(np.int16)
        i = j
    K = model.config.n_codebooks
    flat = np.concatenate([c for c in out], axis=1) if out else np.zeros((K, 0), np.int16)
    return flat, frames.astype(np.int64)


def extract(codec_dir: Path, data_dir: Path, out: Path, device: str, data_sha256: str, log=print) -> dict:
    """Encode every split of ``data_dir`` with the codec at ``codec_dir`` into ``out``."""
    from speechctl.codecs.dac import codes_in_float32

    started = time.time()
    if device.startswith("cuda"):
        torch.backends.cudnn.deterministic = True  # same codes on every run of the same data
        torch.backends.cudnn.benchmark = False
    model = load_codec_model(codec_dir, device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name in SPLITS:
        split = load_split(data_dir, name)
        with codes_in_float32():  # as speechctl computes codes
            codes, frames = encode_split(model, split, device)
        words = None
        if split.words is not None:  # word starts in frames (a word starting mid-frame: that frame)
            words = split.words.copy()
            words[:, 2] //= math.prod(model.config.downsampling_ratios)
        write_split(out, name, codes, split.text, frames, words, split.word_counts)
        splits[name] = {"utterances": len(split), "frames": int(frames.sum()),
                        "codes_sha256": hashlib.sha256(codes.tobytes()).hexdigest(), "words": words is not None}
    manifest = {
        "codec_sha256": file_sha256(Path(codec_dir) / "model.safetensors"),
        "codes_identity": codes_identity(codec_dir),
        "data_sha256": data_sha256,
        "frame_rate": model.config.sampling_rate / math.prod(model.config.downsampling_ratios),
        "num_codebooks": model.config.n_codebooks,
        "codebook_size": model.config.codebook_size,
        "splits": splits,
        "seconds": round(time.time() - started, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if log:
        log(f"codes: {splits['train']['frames']} train frames, {splits['heldout']['frames']} held out, "
            f"{manifest['seconds']} s")
    return manifest


def write_split(out: Path, name: str, codes: np.ndarray, text: list[str], frames, words=None, word_counts=None) -> None:
    """One split in the layout ``load_codes`` reads: [K, F] codes back to back (int16), and each
    utterance's text, frame offset and frame count; its words where given."""
    frames = np.asarray(frames, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(frames)[:-1]]) if len(frames) else frames
    np.save(Path(out) / f"{name}.npy", np.asarray(codes).astype(np.int16))
    index = {"text": list(text), "offset": offsets.tolist(), "frames": frames.tolist()}
    if words is not None:
        np.save(Path(out) / f"{name}.words.npy", np.asarray(words, dtype="<i4").reshape(-1, 3))
        index["words"] = np.asarray(word_counts, dtype=np.int64).tolist()
    (Path(out) / f"{name}.json").write_text(json.dumps(index))


def ensure(codec_dir: Path, data_dir: Path, out: Path, device: str, data_sha256: str, log=print) -> dict:
    try:
        manifest = json.loads((Path(out) / "manifest.json").read_text())
        has_words = (Path(data_dir) / "train.words.npy").is_file()  # (codes made before the data had words: again)
        if (manifest["data_sha256"] == data_sha256 and manifest["codes_identity"] == codes_identity(codec_dir)
                and all(split.get("words", False) == has_words for split in manifest["splits"].values())):
            return manifest
    except (OSError, ValueError, KeyError):
        pass
    return extract(codec_dir, data_dir, out, device, data_sha256, log=log)


def load_codes(path: Path, name: str) -> CodeSplit:
    path = Path(path)
    index = json.loads((path / f"{name}.json").read_text())
    words = path / f"{name}.words.npy"
    return CodeSplit(np.load(path / f"{name}.npy"), index["text"], np.asarray(index["offset"], np.int64),
                     np.asarray(index["frames"], np.int64), np.load(words) if words.is_file() else None,
                     np.asarray(index["words"], np.int64) if "words" in index else None)
