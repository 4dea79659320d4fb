"""Building the committed text files (``text/``) from Debian's packages: run by a maintainer,
once (``python -m recipes.voice text-sources``); ``tests/test_voice_recipe.py`` checks, where
the packages are installed, that they still give the committed bytes. ``text/SOURCES.md`` has
the licences.

* ``devil.txt``: Debian's ``dict-devil`` cut into sentences (``devil_sentences``);
* ``words.txt``: the plain lower-case words of ``wamerican``;
* ``wordnet.txt``: the example phrases and sentences of WordNet 3.0's glosses (``wordnet-base``),
  in sentence form (``wordnet_sentences``);
* ``jargon.txt``: the Jargon File 4.4.7's entries cut into sentences (``dict-jargon``,
  ``jargon_sentences``).
"""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

from recipes.voice.text import _ABBREVIATIONS, _ALLOWED, TEXT_DIR, _balanced, _dedupe

WORDNET_MIN_WORDS = 3  # shorter examples are single words or pairs, which the word list covers


def build_sources(devil_dict: Path = Path("/usr/share/dictd/devil.dict.dz"),
                  words_file: Path = Path("/usr/share/dict/words"),
                  wordnet_dir: Path = Path("/usr/share/wordnet"),
                  jargon_dict: Path = Path("/usr/share/dictd/jargon.dict.dz"), out: Path = TEXT_DIR) -> dict:
    """Write ``devil.txt``, ``words.txt``, ``wordnet.txt`` and ``jargon.txt`` from Debian's
    ``dict-devil``, ``wamerican``, ``wordnet-base`` and ``dict-jargon`` (``apt-get install
    dict-devil wamerican wordnet-base dict-jargon``); returns their sizes and hashes."""
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(devil_dict, "rt", encoding="latin-1") as f:  # dictzip is gzip
        raw = f.read()
    sentences = _dedupe(devil_sentences(raw))
    words = sorted({w for w in words_file.read_text(encoding="utf-8").split() if re.fullmatch(r"[a-z]{2,14}", w)})
    examples = wordnet_sentences(sorted(wordnet_dir.glob("data.*")))
    with gzip.open(jargon_dict, "rt", encoding="utf-8") as f:
        jargon = _dedupe(jargon_sentences(f.read()))
    made = (("devil.txt", sentences), ("words.txt", words), ("wordnet.txt", examples), ("jargon.txt", jargon))
    for name, items in made:
        (out / name).write_text("\n".join(items) + "\n")
    return {name: {"lines": len(items), "sha256": hashlib.sha256((out / name).read_bytes()).hexdigest()}
            for name, items in made}


def wordnet_sentences(data_files: list[Path]) -> list[str]:
    """The quoted examples of WordNet's glosses ("the dog barked all night"), in the order of the
    data files (adjectives, adverbs, nouns, verbs) and of their synsets, as sentences ("The dog
    barked all night."): at least ``WORDNET_MIN_WORDS`` words, the characters the corpus allows,
    each once."""
    out = []
    for path in data_files:
        for line in path.read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or " | " not in line:  # the licence header; a synset without gloss
                continue
            for example in re.findall(r'"([^"]+)"', line.split(" | ", 1)[1]):
                s = _clean(example)
                if s and len(s.split()) >= WORDNET_MIN_WORDS:
                    out.append(s)
    return _dedupe(out)


_HEADWORD = re.compile(r"^([A-Z][A-Z'\- ]*[A-Z]),\s+((?:[a-z]{1,6}\.\s?)+)\s*")


def devil_sentences(raw: str) -> list[str]:
    """The dictionary's text (from the preface on) as sentences: each headword alone ("Absolute."),
    then its definition, quotations and verse split into sentences; attributions, etymologies in
    brackets and italics marks are dropped."""
    start = raw.index("PREFACE")
    paragraphs = re.split(r"\n\s*\n", raw[start + len("PREFACE"):])
    out = []
    for para in paragraphs:
        lines = [ln for ln in para.split("\n") if ln.strip() and len(ln) - len(ln.lstrip()) < 30]
        if not lines:
            continue
        text = " ".join(ln.strip() for ln in lines)
        m = _HEADWORD.match(text)
        if m:
            out.append(m.group(1).strip().capitalize() + ".")
            text = text[m.end():]
        out.extend(_sentences(_tidy(text)))
    return out


# The Jargon File's typography in the characters the corpus allows (text._ALLOWED)
_JARGON_TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2014": " -- ",
                                    "\u2013": "-", "\u2026": "...", "\u00b7": ""})


def jargon_sentences(raw: str) -> list[str]:
    """The Jargon File's entries (dictd's text: a headword, its pronunciation, then paragraphs
    indented by four spaces) as sentences: the indented paragraphs alone, cross-reference braces
    and etymologies in brackets dropped, curly quotes and dashes made plain, long sentences cut
    at semicolons; a sentence with anything else (an address, a path, code) is left out."""
    out = []
    for para in re.split(r"\n\s*\n", raw):
        lines = [ln for ln in para.split("\n") if ln.strip()]
        if not lines or not all(ln.startswith("    ") for ln in lines):
            continue  # a headword, its pronunciation, the database's header
        text = _tidy(" ".join(ln.strip() for ln in lines).translate(_JARGON_TYPOGRAPHY))
        out.extend(_sentences(re.sub(r"\s+([),.;:!?])", r"\1", text)))  # (a brace's space before punctuation)
    return out


def _sentences(text: str) -> list[str]:
    """Tidied prose as the corpus's sentences: split at sentence ends, long ones (over 160
    characters) apart at semicolons into clauses that stand alone, each cleaned (``_clean``)."""
    out = []
    for sentence in _split_sentences(text):
        parts = re.split(r"(?<=;) ", sentence) if len(sentence) > 160 else [sentence]
        out.extend(s for s in map(_clean, parts) if s)
    return out


def _tidy(text: str) -> str:
    text = re.sub(r"\[[^\]]*\]", " ", text)  # etymologies, editorial notes
    text = text.replace("_", "").replace("{", "").replace("}", "")
    text = re.sub(r"\s*--\s*", ", ", text)
    text = re.sub(r"([.!?]), ", r"\1 ", text)
    text = text.replace("`", "'")
    return " ".join(text.split())


def _split_sentences(text: str) -> list[str]:
    parts, start = [], 0
    for m in re.finditer(r"[.!?][\"')]*\s+(?=[\"'(]*[A-Z0-9])", text):
        before = text[start:m.start()].split()
        last = re.sub(r"[^a-z]", "", before[-1].lower()) if before else ""
        if text[m.start()] == "." and (last in _ABBREVIATIONS or (len(last) == 1)):
            continue
        parts.append(text[start:m.end()].strip())
        start = m.end()
    parts.append(text[start:].strip())
    return parts


def _clean(s: str) -> str | None:
    s = s.strip().strip(",;: ")
    if s.startswith(("'", '"')) and s.count(s[0]) == 1:
        s = s[1:]
    if s.endswith(("'", '"')) and s.count(s[-1]) == 1:
        s = s[:-1]
    s = s.strip()
    if len(s) < 2 or not _ALLOWED.match(s) or not re.search(r"[a-zA-Z]", s) or not _balanced(s):
        return None
    if s.rstrip("\"')")[-1:] not in (".", "!", "?"):
        s += "."
    return s[0].upper() + s[1:]
