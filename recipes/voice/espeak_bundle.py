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
from recipes.voice.data import synthesize

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
    package = _data_package(bundle)
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


def _data_package(bundle: Path) -> Path:
    packages = sorted(Path(bundle).glob(DATA_PACKAGE))
    if len(packages) != 1:
        raise FileNotFoundError(f"{bundle}: {len(packages)} {DATA_PACKAGE} where one was expected "
                                "(make the bundle: ../shared/gpu/espeak/make-espeak-bundle.sh)")
    return packages[0]


def check(bundle: Path, sentences: list[str]) -> None:
    """espeak-ng speaks ``sentences`` with the bundle's (trimmed) data exactly as with the
    system's: raises ``AssertionError`` naming the first that differs."""
    package = _data_package(bundle)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg", "-x", str(package), tmp], check=True)
        same_speech(Path(tmp) / DATA_DIR.parent, None, sentences)


def same_speech(data_a: Path | None, data_b: Path | None, sentences: list[str]) -> None:
    """The same waveform from espeak-ng, with the recipe's settings (``data.synthesize``), for each
    sentence with data ``data_a`` and ``data_b`` (directories that hold an ``espeak-ng-data``;
    None: the one the recipe finds)."""
    config = DataConfig()
    for sentence in sentences:
        (a, rate_a), (b, rate_b) = (synthesize(sentence, config, data) for data in (data_a, data_b))
        if rate_a != rate_b or a.tobytes() != b.tobytes():
            raise AssertionError(f"espeak-ng speaks {sentence!r} differently with {data_a} than with {data_b}")
