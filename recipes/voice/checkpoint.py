"""Training checkpoints that travel: one ``state.pt`` per stage, a ``recipe.json`` beside it
(every setting, seed, data hash, versions), and a pack/unpack pair that turns a directory into
``NAME.tar.partNN`` files (a gzip-compressed tar, cut) of at most ``PART_BYTES`` (what one device
call carries back) and back.

A checkpoint holds the weights in float32 and the Adam moments in bfloat16 when that fits in
``MAX_STATE_BYTES`` (a call carries at most 64 MiB back or forth, the repository included); past
that, bfloat16 weights and no optimizer state: a resumed run then rebuilds the moments over a short
warm-up (``recipe.json`` says which: ``"resume": "exact"`` or ``"weights"``). The exact state is
then kept beside it all the same (``local.pt``), for the machine that trains: a chained call
there resumes exactly; packs leave it out.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
import time
from pathlib import Path

import torch

PART_BYTES = 16_000_000  # < 16 MiB: the largest file a device call brings back
MAX_STATE_BYTES = 56 * 1024 * 1024  # what a call can carry beside the repository (64 MiB in all)
LOCAL = "local.pt"  # the exact state where state.pt holds bfloat16 weights only: it does not travel


class CheckpointError(RuntimeError):
    pass


def _moments_to(state: dict, dtype) -> dict:
    """An optimizer state dict with its tensors (Adam's moments) in ``dtype`` (steps stay)."""
    out = {"param_groups": state["param_groups"], "state": {}}
    for key, s in state["state"].items():
        out["state"][key] = {
            k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0 else v) for k, v in s.items()
        }
    return out


def state_bytes(modules: dict) -> int:
    return sum(p.numel() * 4 for m in modules.values() for p in m.state_dict().values() if p.is_floating_point())


def save_state(path: Path, modules: dict, optimizers: dict, meta: dict, max_bytes: int = MAX_STATE_BYTES) -> str:
    """Write ``path/state.pt``: ``modules`` ({name: nn.Module}) and ``optimizers`` ({name:
    Optimizer}) as the budget allows, with ``meta`` (step, history, ...). Returns the resume
    kind ("exact" or "weights")."""
    path.mkdir(parents=True, exist_ok=True)
    weights = state_bytes(modules)
    exact = 2 * weights <= max_bytes  # fp32 weights + two bf16 moments = 2x the fp32 weights
    if not exact and weights // 2 > max_bytes:
        raise CheckpointError(f"even bfloat16 weights ({weights // 2 / 2**20:.0f} MiB) exceed {max_bytes / 2**20:.0f} MiB")
    state = {
        "modules": {name: {k: (v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().cpu())
                           for k, v in m.state_dict().items()} for name, m in modules.items()},
        "optimizers": {name: _moments_to(_cpu(o.state_dict()), torch.bfloat16) for name, o in optimizers.items()},
        "meta": meta,
        "resume": "exact",
    }
    if exact:
        (path / LOCAL).unlink(missing_ok=True)
    else:  # the exact state stays here; what travels is its weights in bfloat16
        _write(path / LOCAL, state)
        state = {**state, "modules": {name: {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in m.items()}
                                      for name, m in state["modules"].items()},
                 "optimizers": {}, "resume": "weights"}
    _write(path / "state.pt", state)
    return state["resume"]


def _write(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _cpu(obj):
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cpu(v) for v in obj]
    return obj


def load_state(path: Path, modules: dict, optimizers: dict) -> dict:
    """Load ``path/state.pt`` into ``modules`` and (when it has them) ``optimizers``, or the exact
    state saved with it where this machine kept one (``LOCAL``); returns its meta plus ``resume``."""
    state = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
    local = Path(path) / LOCAL
    if local.is_file():
        exact = torch.load(local, map_location="cpu", weights_only=False)
        if exact["meta"] == state["meta"]:  # saved together (a later state.pt alone would differ)
            state = exact
    for name, m in modules.items():
        params = m.state_dict()
        m.load_state_dict({k: v.to(params[k].dtype) for k, v in state["modules"][name].items()})
    for name, o in optimizers.items():
        if name in state["optimizers"]:
            saved = state["optimizers"][name]
            o.load_state_dict(saved)  # torch casts the moments back to the parameters' dtype
    return {**state["meta"], "resume": state["resume"]}


# -- the record beside each checkpoint ----------------------------------------------------------


def environment() -> dict:
    import numpy
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "host_cpus": os.cpu_count(),
    }
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "recipes", "speechctl"],
                               capture_output=True, text=True)
        if commit.returncode == 0:
            env["git_commit"] = commit.stdout.strip()
            env["git_dirty"] = bool(dirty.stdout.strip())
    except OSError:
        pass
    return env


def write_record(path: Path, record: dict) -> None:
    """``path/recipe.json``: what made this checkpoint (appended to the runs before it)."""
    path.mkdir(parents=True, exist_ok=True)
    record = {**record, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = path / "recipe.json.tmp"  # whole or not at all: a stage beside it may read it
    tmp.write_text(json.dumps(record, indent=2, default=str))
    os.replace(tmp, path / "recipe.json")


def read_record(path: Path) -> dict | None:
    try:
        return json.loads((Path(path) / "recipe.json").read_text())
    except (OSError, ValueError):
        return None


# -- packing a directory into parts that travel ---------------------------------------------------


def pack(src: Path, out: Path, name: str, part_bytes: int = PART_BYTES) -> list[Path]:
    """``src`` (a directory) as ``out/name.tar.part00, part01, ...`` and ``out/name.sha256``
    (the tar's hash, then one line per part)."""
    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # The hash file goes first and comes back last: a pack cut short (a call killed while it
    # packs) has none, and ``collect`` does not mistake its parts for a checkpoint.
    (out / f"{name}.sha256").unlink(missing_ok=True)
    for old in out.glob(f"{name}.tar.part*"):
        old.unlink()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(p for p in src.rglob("*") if p.is_file() and p.name != LOCAL):
            info = tar.gettarinfo(str(f), arcname=str(f.relative_to(src)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""  # same bytes, same tar
            with open(f, "rb") as fh:
                tar.addfile(info, fh)
    # gzip at its fastest level: float32 weights and bfloat16 moments lose 15% (a 54 MB codec
    # checkpoint packs into 3 parts, not 4, in about 2 s); a call brings back at most 8 files.
    data = gzip.compress(buffer.getvalue(), compresslevel=1, mtime=0)
    parts = []
    lines = [f"{hashlib.sha256(data).hexdigest()}  {name}.tar.gz"]
    for i in range(0, max(len(data), 1), part_bytes):
        part = out / f"{name}.tar.part{i // part_bytes:02d}"
        chunk = data[i: i + part_bytes]
        part.write_bytes(chunk)
        parts.append(part)
        lines.append(f"{hashlib.sha256(chunk).hexdigest()}  {part.name}")
    tmp = out / f"{name}.sha256.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, out / f"{name}.sha256")
    return parts


def _sums(src: Path, name: str) -> tuple[str, list[tuple[str, str]]]:
    """``src/name.sha256``: the packed tar's hash, and (hash, file name) of each part in order."""
    lines = [line.split() for line in (Path(src) / f"{name}.sha256").read_text().splitlines() if line.strip()]
    return lines[0][0], [(digest, part) for digest, part in lines[1:]]


def pack_files(src: Path, name: str) -> list[Path]:
    """The files of pack ``name`` in ``src``: its hash file, then the parts it names."""
    src = Path(src)
    return [src / f"{name}.sha256", *(src / part for _, part in _sums(src, name)[1])]


def joined(src: Path, name: str) -> bytes:
    """The packed tar of ``src/name.tar.partNN``, checked part by part and whole against
    ``src/name.sha256``."""
    src = Path(src)
    whole, parts = _sums(src, name)
    data = b""
    for digest, part_name in parts:
        chunk = (src / part_name).read_bytes()
        if hashlib.sha256(chunk).hexdigest() != digest:
            raise CheckpointError(f"{src / part_name}: damaged (sha256 differs)")
        data += chunk
    if hashlib.sha256(data).hexdigest() != whole:
        raise CheckpointError(f"{src}/{name}: the joined parts are not the packed tar")
    return data


def unpack(src: Path, name: str, dest: Path) -> Path:
    """Join ``src/name.tar.partNN`` (checked against ``src/name.sha256``) and extract into
    ``dest``; returns ``dest``."""
    data, dest = joined(src, name), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # gzip or (packs of before) plain
        tar.extractall(dest, filter="data")
    return dest


def find_packed(src: Path) -> list[str]:
    """Names of the packs in ``src`` (``NAME.sha256`` with its parts)."""
    return sorted(p.stem for p in Path(src).glob("*.sha256"))
