"""Long text cut into pieces a speech model handles, as users paste it.

A model is trained on sentences and generates a bounded number of frames per request, so a
paragraph is split at sentence ends, a sentence that is still too long at clause marks, a clause
at its last space (hard, for text without spaces). Consecutive short sentences share a piece.
Every character ends up in exactly one piece, in order; each piece says what pause follows it
(a sentence end pauses longer than a clause mark; a cut inside a clause not at all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SENTENCE_PAUSE_S = 0.25
CLAUSE_PAUSE_S = 0.1
MAX_PIECE_CHARS = 200

_SENTENCE = re.compile(r".+?(?:[.!?…。！？]+[\"'”’)\]]*(?=\s|$)|\n\s*\n|$)", re.S)
_CLAUSE = re.compile(r".+?(?:[,;:—–，、；：]+(?=\s)|$)", re.S)


@dataclass(frozen=True)
class Piece:
    text: str
    pause_s: float  # silence after this piece (0 after the last)


def split_for_speech(text: str, max_chars: int = MAX_PIECE_CHARS) -> list[Piece]:
    """``text`` as pieces of at most ``max_chars`` characters (module doc)."""
    if max_chars < 1:
        raise ValueError("max_chars must be positive")
    units = []  # (text, pause after it)
    for sentence in _parts(_SENTENCE, text):
        if len(sentence) <= max_chars:
            units.append((sentence, SENTENCE_PAUSE_S))
            continue
        clauses = _parts(_CLAUSE, sentence)
        for i, clause in enumerate(clauses):
            last_clause = i == len(clauses) - 1
            words = _by_words(clause, max_chars)
            for j, part in enumerate(words):
                end_of_clause = j == len(words) - 1
                units.append((part, SENTENCE_PAUSE_S if last_clause and end_of_clause else CLAUSE_PAUSE_S if end_of_clause else 0.0))
    pieces: list[list] = []
    for unit, pause in units:  # short sentences share a piece
        if pieces and pieces[-1][1] == SENTENCE_PAUSE_S and pause == SENTENCE_PAUSE_S and len(pieces[-1][0]) + 1 + len(unit) <= max_chars:
            pieces[-1][0] += " " + unit
        else:
            pieces.append([unit, pause])
    if pieces:
        pieces[-1][1] = 0.0
    return [Piece(t, p) for t, p in pieces]


def _parts(pattern: re.Pattern, text: str) -> list[str]:
    return [m.group(0).strip() for m in pattern.finditer(text) if m.group(0).strip()]


def _by_words(text: str, max_chars: int) -> list[str]:
    parts = []
    while len(text) > max_chars:
        space = text.rfind(" ", 0, max_chars + 1)
        cut = space if space > 0 else max_chars
        parts.append(text[:cut].strip())
        text = text[cut:].strip()
    return parts + ([text] if text else [])
