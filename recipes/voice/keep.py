"""Training checkpoints kept across sessions in the repository's history, out of its tree.

``.voice/`` is git-ignored, and a new checkout of the repository holds only what was committed:
the fifteenth session found the codec of four sessions' device calls (step 11,215) gone with it.
``keep`` makes the packs in ``.voice/NAME/`` (the parts a device call brought back) reachable
from HEAD without putting them in its tree: a parentless commit holds them under
``voice-kept/NAME/``, and a merge commit on the current branch, whose tree is HEAD's own, names it
as its second parent. A checkout, and so every device call, carries none of it; a clone fetches
it. ``restore`` finds the newest kept pack of each name in HEAD's history and files them under
``.voice/`` as ``collect`` files a device call's (unpacked, and a codec's shipped form made).
``ship_kept`` (``make install``'s step) exports the newest kept LM and codec as speechctl's
default voice.

Only git's plumbing is used, so the index, the working tree and any uncommitted change stay as
they are.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from recipes.voice import checkpoint

SUBJECT = "voice: keep"  # the merge commits' subject starts so; restore looks for it
KEPT_DIR = "voice-kept"


class KeepError(RuntimeError):
    pass


def _git(repo: Path, *args: str, env: dict | None = None) -> bytes:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise KeepError(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


def _text(repo: Path, *args: str, env: dict | None = None) -> str:
    return _git(repo, *args, env=env).decode().strip()


def _pack_files(root: Path, name: str) -> list[Path]:
    """The pack's files, checked whole (or nothing is kept)."""
    folder = root / name
    if not (folder / f"{name}.sha256").is_file():
        raise KeepError(f"{folder}: no {name}.sha256 (collect a device call's files first)")
    checkpoint.joined(folder, name)
    return checkpoint.pack_files(folder, name)


def keep(names: list[str], root: Path = Path(".voice"), repo: Path = Path("."), note: str = "") -> str:
    """Commit the packs ``root/NAME/`` for each of ``names`` as described above; returns the
    merge commit's hash."""
    root, repo = Path(root), Path(repo)
    if not names:
        raise KeepError("name at least one pack to keep (e.g. codec, lm)")
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        for name in names:
            for f in _pack_files(root, name):
                blob = _text(repo, "hash-object", "-w", str(f))
                _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{KEPT_DIR}/{name}/{f.name}", env=env)
        tree = _text(repo, "write-tree", env=env)
    subject = f"{SUBJECT} {', '.join(names)}" + (f" ({note})" if note else "")
    side = _text(repo, "commit-tree", tree, "-m", f"{subject}: the packs")
    head = _text(repo, "rev-parse", "HEAD")
    head_tree = _text(repo, "rev-parse", "HEAD^{tree}")
    body = (f"{subject}\n\nThe packs are in the second parent, under {KEPT_DIR}/; this commit's tree is its first "
            "parent's. `python -m recipes.voice restore` files them under .voice/.\n")
    merge = _text(repo, "commit-tree", head_tree, "-p", head, "-p", side, "-m", body)
    _git(repo, "update-ref", "-m", subject, "HEAD", merge, head)
    return merge


def keep_merges(repo: Path = Path(".")) -> list[str]:
    """The keep merges in HEAD's history, newest first."""
    merges = []
    for line in _text(repo, "log", "--merges", "--format=%H %s", "HEAD").splitlines():
        commit, _, subject = line.partition(" ")
        if subject.startswith(SUBJECT):
            merges.append(commit)
    return merges


def restore(root: Path = Path(".voice"), repo: Path = Path("."), commit: str | None = None) -> list[str]:
    """File under ``root`` (``collect``'s filing) the newest kept pack of each name (a session
    keeps what moved: the LM kept last, the codec some sessions before), or only the packs of the
    keep merge ``commit``; returns their names."""
    from recipes.voice.stages import collect

    merges = [commit] if commit else keep_merges(repo)
    if not merges:
        raise KeepError("no kept packs in this history (python -m recipes.voice keep NAME... keeps them)")
    sources: dict[str, tuple[str, list[str]]] = {}  # name -> (the newest merge's side keeping it, its paths)
    for merge in merges:
        side = f"{merge}^2"
        paths = _text(repo, "ls-tree", "-r", "--name-only", side, f"{KEPT_DIR}/").split()
        if not paths and commit:
            raise KeepError(f"{commit}: its second parent has no {KEPT_DIR}/")
        kept: dict[str, list[str]] = {}
        for path in paths:
            kept.setdefault(Path(path).parent.name, []).append(path)
        for name, files in kept.items():
            sources.setdefault(name, (side, files))  # newest first: an older merge's pack of a name is left
    with tempfile.TemporaryDirectory() as tmp:
        for side, paths in sources.values():
            for path in paths:
                (Path(tmp) / Path(path).name).write_bytes(_git(repo, "cat-file", "blob", f"{side}:{path}"))
        return collect(Path(tmp), Path(root))


def ship_kept(repo: Path = Path("."), dest: Path | None = None, log=print) -> Path | None:
    """``make install``'s step: the newest LM and codec kept in ``repo``'s history (``keep``),
    exported with the voice's defaults and shipped as speechctl's default voice, unless the one
    shipped came from the same keep merge with the same defaults already. The weights travel in
    the history, out of the tree (a device call carries the tree; 49 MB more would not fit beside
    vLLM's bundle). None, with a note, where there is nothing to ship: no git history (an
    unpacked archive) or no keep."""
    from recipes.voice import export
    from recipes.voice.stages import run_export
    from speechctl.voices import provenance, voice_dir

    dest = Path(dest or voice_dir())
    try:
        merges = keep_merges(Path(repo))
    except (KeepError, OSError) as e:
        log(f"note: speechctl's voice is built from this repository's history, and there is none here ({e}); "
            "the default model is the random `tiny`")
        return None
    if not merges:
        log("note: no voice is kept in this history; the default model is the random `tiny`")
        return None
    shipped = provenance(dest)
    if shipped.get("kept") == merges[0] and shipped.get("export") == export.export_settings():
        return dest  # current: the newest keep, exported with today's defaults
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        restore(root, Path(repo))
        model = run_export(root / "unpacked" / "lm", root / "unpacked" / "codec-model", root / "model", kept=merges[0],
                           log=lambda line: None)
        shipped = export.ship(model, dest)
    log(f"speechctl's voice (keep {merges[0][:10]}): {shipped}, {export.sizes(shipped)['total_bytes'] / 1e6:.1f} MB")
    return shipped
