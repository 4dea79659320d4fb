"""The voice recipe's copy task (tests/test_voice_recipe.py, tests/test_voice_align.py): each
character of a random two-word string is two frames of codes fixed by (character, codebook,
frame), so an LM can predict a frame's first codebook only by reading its text."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LETTERS = "abcdefghijklmnopqrstuvwxyz "


def write_copy_task(path: Path, K: int, C: int, sizes: dict[str, int], words: bool = False) -> None:
    """A codes directory (``codes.write_split``) of ``sizes[split]`` strings per split; with
    ``words``, each word's character start, length and first frame too (what the data records)."""
    from recipes.voice.codes import write_split

    rng = np.random.default_rng(0)
    table = rng.integers(0, C, (len(LETTERS), K, 2))

    def phrase():
        return " ".join("".join(rng.choice(list(LETTERS[:-1]), rng.integers(3, 9))) for _ in range(2))

    def word_table(text):  # two words: (character start, length, first frame) of each
        first, second = text.split()
        return [(0, len(first), 0), (len(first) + 1, len(second), 2 * (len(first) + 1))]

    path.mkdir(parents=True)
    for name, n in sizes.items():
        texts = [phrase() for _ in range(n)]
        codes = [np.concatenate([table[LETTERS.index(ch)] for ch in t], axis=1) for t in texts]
        rows = [word_table(t) for t in texts] if words else None
        write_split(path, name, np.concatenate(codes, axis=1), texts, [c.shape[1] for c in codes],
                    None if rows is None else np.array([w for ws in rows for w in ws]),
                    None if rows is None else [len(ws) for ws in rows])
