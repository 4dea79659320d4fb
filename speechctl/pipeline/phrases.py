"""Cut a streamed reply into phrases that TTS can speak before the reply is complete.

A phrase ends at sentence punctuation followed by a space (``. ! ? ;`` and newlines); once it is
at least ``min_chars`` long, also at a comma or colon. A phrase that reaches ``max_chars`` (the
first one: ``first_max_chars``, shorter, so that speech starts early) is cut at its last space,
or hard when it has none (random or unspaced text). What is left when the reply ends is the last
phrase.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?;。！？]+[\"')\]]*(\s+)|\n+")
_CLAUSE_END = re.compile(r"[,:，、]+(\s+)")


class PhraseSplitter:
    def __init__(self, *, min_chars: int = 12, first_max_chars: int = 48, max_chars: int = 160):
        if first_max_chars < 1 or max_chars < 1:
            raise ValueError("first_max_chars and max_chars must be positive")
        self.min_chars, self.first_max_chars, self.max_chars = min_chars, first_max_chars, max_chars
        self._buffer = ""
        self._count = 0

    def push(self, text: str) -> list[str]:
        """New reply text -> the phrases it completes (stripped, non-empty)."""
        self._buffer += text
        phrases = []
        while True:
            phrase = self._cut()
            if phrase is None:
                return phrases
            if phrase:
                phrases.append(phrase)
                self._count += 1

    def finish(self) -> list[str]:
        """The reply ended: the rest, if any, as the last phrase."""
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []

    def _cut(self) -> str | None:
        buf = self._buffer
        limit = self.first_max_chars if self._count == 0 else self.max_chars
        end = None
        match = _SENTENCE_END.search(buf)
        if match and match.start() < limit:
            end = match.end()
        else:
            for clause in _CLAUSE_END.finditer(buf):
                if clause.start() >= self.min_chars and clause.start() < limit:
                    end = clause.end()
                    break
        if end is None and len(buf) >= limit:
            space = buf.rfind(" ", 0, limit)
            end = space + 1 if space > 0 else limit
        if end is None:
            return None
        phrase, self._buffer = buf[:end].strip(), buf[end:]
        return phrase
