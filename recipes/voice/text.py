"""The English text the voice is trained on, and the held-out sentences it never sees.

Sources (committed under ``text/``, so the GPU machine needs no network; ``SOURCES.md`` there has
the licences):

* ``devil.txt``: the sentences of Ambrose Bierce's *The Devil's Dictionary* (1911; public domain,
  copyright expired), one per line, cut from Debian's ``dict-devil`` package.
* ``words.txt``: plain lower-case words of SCOWL's American English list (Debian's ``wamerican``;
  permissive licence, its notice in ``words.COPYRIGHT``).
* ``wordnet.txt``: the example phrases of WordNet 3.0's glosses in sentence form ("The captain
  ported the ship at night."; Princeton's permissive licence, in ``wordnet.COPYRIGHT``), read
  where ``DataConfig.natural`` names it.

``text_sources.py`` builds the three files. The training text is the source sentences not held
out (the Devil's Dictionary's, then WordNet's where named), plus made-up sentences until the estimated
audio reaches ``DataConfig.hours``: sentences of a word-bigram chain fitted to the training
sentences (natural local word order, new combinations), and sentences of random word-list words
(every spelling of the language, some numbers), all drawn from a seeded generator. Every made-up
sentence that normalizes to a held-out one is dropped, so the held-out set stays unseen.
"""

from __future__ import annotations

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


def source_sentences(name: str = "devil") -> list[str]:
    """The sentences of a natural source (``config.NATURAL_TEXT``), in its order."""
    return (TEXT_DIR / f"{name}.txt").read_text().splitlines()


def word_list() -> list[str]:
    return (TEXT_DIR / "words.txt").read_text().split()


def make_corpus(config: DataConfig) -> Corpus:
    config.validate()
    devil = [s for s in source_sentences("devil") if len(s) <= config.max_chars]
    fixed = {normalize(s) for s in FIXED_HELDOUT}
    # Held out: the fixed sentences and the Devil's Dictionary's with the smallest hashes (of at
    # least five words, so that they test reading rather than single words): the choice does not
    # depend on the file's order or on the other settings (the other sources included).
    candidates = sorted(
        (s for s in devil if len(s.split()) >= 5 and normalize(s) not in fixed),
        key=lambda s: hashlib.sha256(normalize(s).encode()).hexdigest(),
    )
    heldout = list(FIXED_HELDOUT) + candidates[: config.heldout]
    banned = {normalize(s) for s in heldout}
    natural = devil + [s for name in config.natural if name != "devil" for s in source_sentences(name)
                       if len(s) <= config.max_chars]
    train, budget = [], config.hours * 3600
    for s in _dedupe(s for s in natural if normalize(s) not in banned):  # in the sources' own order
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
