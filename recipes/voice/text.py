"""The English text the voice is trained on, and the held-out sentences it never sees.

Sources (committed under ``text/``, so the GPU machine needs no network; ``SOURCES.md`` there has
the licences):

* ``devil.txt``: the sentences of Ambrose Bierce's *The Devil's Dictionary* (1911; public domain,
  copyright expired), one per line, cut from Debian's ``dict-devil`` package by ``build_sources``.
* ``words.txt``: plain lower-case words of SCOWL's American English list (Debian's ``wamerican``;
  permissive licence, its notice in ``words.COPYRIGHT``).

The training text is the source sentences not held out, plus made-up sentences until the estimated
audio reaches ``DataConfig.hours``: sentences of a word-bigram chain fitted to the training
sentences (natural local word order, new combinations), and sentences of random word-list words
(every spelling of the language, some numbers), all drawn from a seeded generator. Every made-up
sentence that normalizes to a held-out one is dropped, so the held-out set stays unseen.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recipes.voice.config import DataConfig

TEXT_DIR = Path(__file__).resolve().parent / "text"
# Always held out: what people try first.
FIXED_HELDOUT = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world.",
    "Hello world, this is speechctl speaking.",
)
CHARS_PER_SECOND = 18.0  # espeak-ng at 175 words per minute, measured on the source text
_ALLOWED = re.compile(r"^[A-Za-z0-9 .,;:!?'\"()-]+$")
_ABBREVIATIONS = {"mr", "mrs", "dr", "st", "jr", "sr", "mt", "no", "vs", "etc", "co", "ie", "eg", "viz", "cf",
                  "rev", "gen", "col", "capt", "prof", "hon", "esq", "ft", "vol", "ch", "p", "pp", "v", "t", "i", "n"}


@dataclass
class Corpus:
    train: list[str]
    heldout: list[str]
    natural: int  # how many of ``train`` are source sentences (the rest are made up)

    def digest(self) -> str:
        h = hashlib.sha256()
        for part in (self.train, self.heldout):
            h.update("\n".join(part).encode())
            h.update(b"\0")
        return h.hexdigest()


def normalize(text: str) -> str:
    """What makes two sentences the same sentence: letters and digits, lower case."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def bare(text: str) -> str:
    """``text`` as people type it: no final full stop, first letter in lower case. espeak-ng
    speaks both forms alike, byte for byte (its end of input is a full stop; checked on 30 random
    training sentences), so the LM may read either with the same audio."""
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    return text[:1].lower() + text[1:]


def bare_variant(text: str, share: float) -> bool:
    """Whether the LM reads this sentence bare: a fixed choice per sentence (by its hash)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 1000 < share * 1000


def estimated_seconds(text: str) -> float:
    return len(text) / CHARS_PER_SECOND


def source_sentences() -> list[str]:
    return (TEXT_DIR / "devil.txt").read_text().splitlines()


def word_list() -> list[str]:
    return (TEXT_DIR / "words.txt").read_text().split()


def make_corpus(config: DataConfig) -> Corpus:
    config.validate()
    natural = [s for s in source_sentences() if len(s) <= config.max_chars]
    fixed = {normalize(s) for s in FIXED_HELDOUT}
    # Held out: the fixed sentences and the natural ones with the smallest hashes (of at least
    # five words, so that they test reading rather than single words): the choice does not depend
    # on the file's order or on the other settings.
    candidates = sorted(
        (s for s in natural if len(s.split()) >= 5 and normalize(s) not in fixed),
        key=lambda s: hashlib.sha256(normalize(s).encode()).hexdigest(),
    )
    heldout = list(FIXED_HELDOUT) + candidates[: config.heldout]
    banned = {normalize(s) for s in heldout}
    train, budget = [], config.hours * 3600
    for s in _dedupe(s for s in natural if normalize(s) not in banned):  # in the book's order
        if budget <= 0:
            break
        train.append(s)
        budget -= estimated_seconds(s)
    rng = np.random.default_rng(config.seed)
    chain = _BigramChain(train)
    words = word_list()
    seen = {normalize(s) for s in train} | banned
    made = []
    while budget > 0:
        s = _word_sentence(rng, words) if rng.random() < config.wordlist_share else chain.sentence(rng)
        key = normalize(s) if s else ""
        if not key or key in seen or len(s) > config.max_chars:
            continue
        seen.add(key)
        made.append(s)
        budget -= estimated_seconds(s)
    return Corpus(train=train + made, heldout=heldout, natural=len(train))


def _dedupe(sentences) -> list[str]:
    seen, out = set(), []
    for s in sentences:
        key = normalize(s)
        if key and key not in seen:
            seen.add(key)
            out.append(s)
    return out


class _BigramChain:
    """Word bigrams of the training sentences (punctuation stays on its word), with sentence
    start and end states; sampling walks it from the start to an end."""

    def __init__(self, sentences: list[str]):
        follow: dict[str, list[str]] = {}
        for s in sentences:
            tokens = ["<s>", *s.split(), "</s>"]
            for a, b in zip(tokens, tokens[1:]):
                follow.setdefault(a, []).append(b)
        self.keys = sorted(follow)
        self.follow = {k: follow[k] for k in self.keys}

    def sentence(self, rng, max_words: int = 30) -> str | None:
        out, word = [], "<s>"
        while len(out) < max_words:
            options = self.follow[word]
            word = options[int(rng.integers(len(options)))]
            if word == "</s>":
                break
            out.append(word)
        if len(out) < 3 or len(out) >= max_words:
            return None
        text = " ".join(out)
        text = text[0].upper() + text[1:]
        if text[-1] not in ".!?":
            text = text.rstrip(",;:-") + "."
        return text if _balanced(text) else None


def _balanced(text: str) -> bool:
    return text.count("(") == text.count(")") and text.count('"') % 2 == 0


def _word_sentence(rng, words: list[str]) -> str:
    """3 to 12 random words (one or two now and then), sometimes a comma, sometimes a number."""
    n = int(rng.integers(1, 3)) if rng.random() < 0.1 else int(rng.integers(3, 13))
    picked = [words[int(i)] for i in rng.integers(len(words), size=n)]
    if n >= 3 and rng.random() < 0.15:
        number = int(rng.integers(0, 100)) if rng.random() < 0.5 else int(rng.integers(100, 10000))
        picked.insert(int(rng.integers(n)), str(number))
    if n >= 6 and rng.random() < 0.4:
        i = int(rng.integers(2, n - 2))
        picked[i] += ","
    text = " ".join(picked)
    end = "." if rng.random() < 0.8 else ("?" if rng.random() < 0.6 else "!")
    return text[0].upper() + text[1:] + end


# -- building the committed files from Debian's packages (run by a maintainer, once) ------------


def build_sources(devil_dict: Path = Path("/usr/share/dictd/devil.dict.dz"),
                  words_file: Path = Path("/usr/share/dict/words"), out: Path = TEXT_DIR) -> dict:
    """Write ``devil.txt`` and ``words.txt`` from Debian's ``dict-devil`` and ``wamerican``
    (``apt-get install dict-devil wamerican``); returns their sizes and hashes."""
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(devil_dict, "rt", encoding="latin-1") as f:  # dictzip is gzip
        raw = f.read()
    sentences = _dedupe(devil_sentences(raw))
    (out / "devil.txt").write_text("\n".join(sentences) + "\n")
    words = sorted({w for w in words_file.read_text(encoding="utf-8").split() if re.fullmatch(r"[a-z]{2,14}", w)})
    (out / "words.txt").write_text("\n".join(words) + "\n")
    return {
        name: {"lines": len(items), "sha256": hashlib.sha256((out / name).read_bytes()).hexdigest()}
        for name, items in (("devil.txt", sentences), ("words.txt", words))
    }


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
        for sentence in _split_sentences(_tidy(text)):
            # Long ones come apart at semicolons into clauses that stand alone.
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
