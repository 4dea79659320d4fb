"""Which weight files of a checkpoint directory count, by transformers' own rule, and a directory
for vLLM that holds only those.

Published repositories carry more than one copy of the weights: sesame/csm-1b has ``ckpt.pt``, a
``model.safetensors`` in Sesame's original names and the transformers copy in
``transformers-0000N-of-00002.safetensors`` (named by config.json's ``transformers_weights``);
a Higgs repository rewritten to transformers' format may keep an older
``model.safetensors.index.json`` beside its new ``model.safetensors``. transformers picks
(``modeling_utils._get_resolved_checkpoint_files``, local directories), in order:

1. config.json's ``transformers_weights``: that file, or that index's shards;
2. ``model.safetensors``;
3. ``model.safetensors.index.json``'s shards;
4. ``pytorch_model.bin``, then ``pytorch_model.bin.index.json``'s shards.

vLLM's loader globs every ``*.safetensors`` instead (filtered by ``model.safetensors.index.json``
where one exists), so where the directory holds weights that do not count, the engine reads a
view of it (``engine_view``): links to every other file and to the chosen weights only.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from speechctl.errors import ModelError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")


@dataclass(frozen=True)
class WeightFiles:
    rule: str  # which of transformers' rules chose them
    chosen: tuple[str, ...]  # file names relative to the directory
    ignored: tuple[str, ...]  # other weight and index files found there
    index: str | None = None  # the index file that names the chosen shards


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(INDEX_SUFFIXES)


def choose_weights(names: set[str], config: dict, read_index) -> tuple[str, tuple[str, ...], str | None]:
    """(rule, weight files, index) by transformers' rule (module doc) among the file ``names`` of
    a directory or a hub repository; ``read_index(name)`` -> that index's JSON."""
    explicit = config.get("transformers_weights")
    if explicit:
        if Path(explicit).is_absolute() or ".." in Path(explicit).parts:
            raise ModelError(f"transformers_weights {explicit!r} must name a file inside the directory")
        rule, target = f"config.json transformers_weights: {explicit}", explicit
    else:
        order = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
        target = next((n for n in order if n in names), None)
        if target is None:
            raise ModelError("no weights (model.safetensors, an index of shards, or config.json's transformers_weights)")
        rule = target
    if target not in names:
        raise ModelError(f"{rule} names {target}, which is not there")
    if not target.endswith(INDEX_SUFFIXES):
        return rule, (target,), None
    try:
        shards = tuple(sorted(set(read_index(target)["weight_map"].values())))
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise ModelError(f"{target}: unreadable index ({e})") from None
    return rule, shards, target


def select_weights(path: Path, config: dict) -> WeightFiles:
    """The weight files transformers would load from the directory ``path`` (module doc);
    ModelError naming what is missing."""
    path = Path(path)
    names = {p.name for p in path.iterdir() if p.is_file()}
    try:
        rule, chosen, index = choose_weights(names, config, lambda n: json.loads((path / n).read_text()))
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    missing = [s for s in chosen if s not in names]
    if missing:
        raise ModelError(f"{path}: {index} names {len(missing)} shard(s) that are not there, first {missing[0]}")
    keep = set(chosen) | {index}
    ignored = tuple(sorted(n for n in names if is_weight_file(n) and n not in keep))
    return WeightFiles(rule, chosen, ignored, index)


def tensor_names(file: Path) -> list[str]:
    """The tensor names of a safetensors file (its header only)."""
    from safetensors import safe_open

    with safe_open(str(file), framework="numpy") as f:
        return list(f.keys())


def engine_view(path: Path, weights: WeightFiles, root: Path) -> Path:
    """``path`` itself where vLLM's loader reads exactly ``weights`` from it; else a directory
    under ``root`` of links to every non-weight file and to the chosen weights, with their index
    as ``model.safetensors.index.json`` (the name vLLM filters shards by)."""
    path = Path(path).resolve()
    if not weights.ignored:
        return path
    key = hashlib.sha256(f"{path}\n{weights}".encode()).hexdigest()[:16]
    view = Path(root) / f"{path.name}-{key}"
    if (view / ".complete").exists():
        return view
    tmp = view.with_name(view.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    chosen = set(weights.chosen)
    for entry in path.iterdir():
        if is_weight_file(entry.name) and entry.name not in chosen:
            continue  # ignored copies, and the chosen index (linked below under vLLM's name)
        link = tmp / entry.name
        if not link.exists():
            link.symlink_to(entry.resolve())
    if weights.index is not None and weights.index.endswith(".safetensors.index.json"):
        (tmp / "model.safetensors.index.json").symlink_to((path / weights.index).resolve())
    (tmp / ".complete").write_text(json.dumps({"source": str(path), "rule": weights.rule, "chosen": list(weights.chosen)}))
    try:
        tmp.rename(view)
    except OSError:  # another process made it first
        if not (view / ".complete").exists():
            raise
    return view


def read_config(path: Path) -> dict:
    """config.json of a checkpoint directory; ModelError naming the file if it is not one."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    try:
        return json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{config_file}: unreadable config ({e})") from None
