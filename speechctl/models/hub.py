"""Models named by Hugging Face hub id (``ORG/NAME``, ``ORG/NAME@REVISION``), resolved through the
hub cache as vLLM and transformers resolve them: ``HF_HUB_CACHE`` / ``HF_HOME``, revisions (a
branch, tag or commit), ``HF_HUB_OFFLINE``. Files are downloaded only where the environment allows
it, and then only those the checkpoint needs (``allow_patterns``); a missing piece is a one-line
``ModelError`` naming the repo or file to fetch.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from speechctl.errors import ModelError
from speechctl.models.weights import choose_weights, read_config

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
_TRUE = {"1", "on", "yes", "true"}
# Files a checkpoint needs besides its weights: configs and indexes, the tokenizer (Whisper's too:
# vocab.json, merges.txt, normalizer.json, added_tokens.json), the feature extractor's config.
LIGHT_FILES = ["*.json", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "vocab*", "merges*"]


def is_hub_id(name: str) -> bool:
    """``ORG/NAME[@REVISION]`` that is not a local path."""
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists() and not name.startswith((".", "/", "~"))


def split_hub_id(name: str) -> tuple[str, str | None]:
    repo, _, revision = name.partition("@")
    return repo, revision or None


def offline() -> bool:
    """Downloads are off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``), read now, not at import."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cache_dir() -> Path:
    """The hub cache the environment names now: ``HF_HUB_CACHE``, else ``HF_HOME``/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def download_command(repo: str, revision: str | None = None, patterns: list[str] | None = None) -> str:
    parts = ["huggingface-cli download", repo]
    if revision:
        parts.append(f"--revision {revision}")
    if patterns:
        parts.append("--include " + " ".join(f"'{p}'" for p in patterns))
    return " ".join(parts)


# The snapshots this process resolved: one model is looked up several times per command (what kind
# of model it is, then its files), and online each lookup is a round trip to the hub. Failures are
# not kept (a fetch the user makes in between counts).
_resolved: dict[tuple, Path] = {}


def snapshot(name: str, allow_patterns: list[str] | None = None) -> Path:
    """The local snapshot directory of hub id ``name`` with (at least) the files matching
    ``allow_patterns`` (all files if None)."""
    key = (name, tuple(allow_patterns) if allow_patterns is not None else None, offline(), str(cache_dir()))
    if key not in _resolved or not _resolved[key].is_dir():
        _resolved[key] = _snapshot(name, allow_patterns)
    return _resolved[key]


def _snapshot(name: str, allow_patterns: list[str] | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = split_hub_id(name)
    local_only = offline()
    try:
        path = snapshot_download(repo, revision=revision, cache_dir=str(cache_dir()), local_files_only=local_only,
                                 allow_patterns=allow_patterns)
    except LocalEntryNotFoundError:
        why = "downloads are off (HF_HUB_OFFLINE)" if local_only else "the hub cannot be reached"
        raise ModelError(f"{name}: not in the Hugging Face cache ({cache_dir()}) and {why}; "
                         f"fetch it with `{download_command(repo, revision, allow_patterns)}`") from None
    except (RepositoryNotFoundError, GatedRepoError) as e:
        raise ModelError(f"{name}: the hub refused the repository ({type(e).__name__}); check the name and your access") from None
    except RevisionNotFoundError:
        raise ModelError(f"{name}: no revision {revision!r} in {repo}") from None
    except (HfHubHTTPError, OSError) as e:
        raise ModelError(f"{name}: could not fetch from the hub ({str(e).splitlines()[0]})") from None
    return Path(path)


def repo_files(name: str) -> set[str]:
    """The file names of hub repository ``name`` at its revision (online)."""
    from huggingface_hub import list_repo_files

    repo, revision = split_hub_id(name)
    try:
        return set(list_repo_files(repo, revision=revision))
    except Exception as e:  # the hub's many HTTP and repository errors: one line
        raise ModelError(f"{name}: could not list the repository ({str(e).splitlines()[0]})") from None


def checkpoint_snapshot(name: str) -> Path:
    """The snapshot of hub id ``name`` with what a checkpoint needs. Offline, the cache as it is;
    where downloads are allowed, only the light files, then the weight files transformers' rule
    chooses (``weights.choose_weights``), not a repository's other copies."""
    if offline():
        return snapshot(name)
    path = snapshot(name, LIGHT_FILES)
    config = read_config(path)
    _, chosen, index = choose_weights(repo_files(name), config, lambda n: json.loads((path / n).read_text()))
    return snapshot(name, LIGHT_FILES + [*chosen, *([index] if index else [])])
