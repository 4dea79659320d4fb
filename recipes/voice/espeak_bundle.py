"""The espeak-ng bundle the device calls carry, cut to what the recipe's English needs.

A device call carries at most 64 MiB, the working tree included. The LM's first call needs the
espeak-ng bundle (its data), the shipped codec (its codes) and, to have vLLM two calls earlier,
the first half of the vLLM bundle: 69.7 MB with Debian's espeak-ng-data, whose 4.3 MB are mostly
the pronunciation dictionaries of ~100 other languages (Russian 2.0 MB, Mandarin 1.6 MB, ...).
``trim`` rebuilds that package with ``en_dict`` as its only dictionary (its phoneme tables,
language and voice definitions stay whole); ``check`` speaks sentences of the recipe's corpus with
both data directories and requires the same bytes, so the data the codec was trained on, and its
hash, do not change.

    python -m recipes.voice trim-espeak .gpu/espeak      # in place; prints the sizes and the check
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from recipes.voice.config import DataConfig

DATA_PACKAGE = "espeak-ng-data_*.deb"
DATA_DIR = Path("usr/lib/x86_64-linux-gnu/espeak-ng-data")
KEPT_DICTIONARIES = {"en_dict"}


def english_only(data_dir: Path) -> int:
    """Remove every pronunciation dictionary but English's from an espeak-ng-data directory;
    returns the bytes removed."""
    removed = 0
    for path in sorted(Path(data_dir).glob("*_dict")):
        if path.name not in KEPT_DICTIONARIES:
            removed += path.stat().st_size
            path.unlink()
    if not (Path(data_dir) / "en_dict").exists():
        raise FileNotFoundError(f"{data_dir}: no en_dict, not an espeak-ng-data directory")
    return removed


def trim(bundle: Path) -> tuple[int, int]:
    """Rebuild the bundle's espeak-ng-data package with English alone, in place (the package keeps
    its name, so ``dpkg -x`` on the device unpacks it as before). Returns (bytes before, after)."""
    [package] = sorted(Path(bundle).glob(DATA_PACKAGE)) or [None]
    if package is None:
        raise FileNotFoundError(f"{bundle}: no {DATA_PACKAGE} (make the bundle first: ../shared/gpu/espeak/make-espeak-bundle.sh)")
    before = package.stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["dpkg-deb", "-R", str(package), str(tree)], check=True)
        english_only(tree / DATA_DIR)
        (tree / "DEBIAN" / "md5sums").unlink(missing_ok=True)  # it lists the removed files
        rebuilt = Path(tmp) / package.name
        subprocess.run(["dpkg-deb", "-Zxz", "-z9", "--root-owner-group", "-b", str(tree), str(rebuilt)],
                       check=True, capture_output=True)
        shutil.move(rebuilt, package)
    return before, package.stat().st_size


def check(bundle: Path, sentences: list[str]) -> None:
    """espeak-ng speaks ``sentences`` with the bundle's (trimmed) data exactly as with the
    system's: raises ``AssertionError`` naming the first that differs."""
    [package] = sorted(Path(bundle).glob(DATA_PACKAGE))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg", "-x", str(package), tmp], check=True)
        same_speech(Path(tmp) / DATA_DIR.parent, None, sentences)


def same_speech(data_a: Path | None, data_b: Path | None, sentences: list[str]) -> None:
    """The same WAV bytes from espeak-ng, with the recipe's settings, for each sentence with data
    ``data_a`` and ``data_b`` (directories that hold an ``espeak-ng-data``; None: espeak-ng's own)."""
    for sentence in sentences:
        outputs = [_speak(data, sentence) for data in (data_a, data_b)]
        if outputs[0] != outputs[1]:
            raise AssertionError(f"espeak-ng speaks {sentence!r} differently with {data_a} than with {data_b}")


def _speak(data: Path | None, text: str) -> bytes:
    config = DataConfig()
    command = (["espeak-ng"] + ([f"--path={data}"] if data else [])
               + ["-v", config.voice, "-s", str(config.words_per_minute), "-p", str(config.pitch), "--stdout"])
    return subprocess.run(command, input=text.encode(), capture_output=True, check=True).stdout
