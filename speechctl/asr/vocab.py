"""Whisper's special tokens and token rules, read from a Hugging Face checkpoint directory.

Every Whisper checkpoint shares the layout of OpenAI's tokenizer (``whisper/tokenizer.py``), only
the offsets differ: English-only models have 51,864 tokens (``<|endoftext|>`` 50256), multilingual
ones 51,865 (99 languages), large-v3 and turbo 51,866 (100)::

    ... text ... <|endoftext|> <|startoftranscript|> <|en|> ... <|su|> [<|yue|>]
    <|translate|> <|transcribe|> <|startoflm|> <|startofprev|> <|nospeech|> <|notimestamps|>
    <|0.00|> <|0.02|> ... <|30.00|>

The ids come from the checkpoint's tokenizer; the suppression lists and alignment heads from its
``generation_config.json`` (what transformers' ``generate`` reads too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from speechctl.errors import ModelError

TIME_PRECISION = 0.02  # seconds per timestamp token (30 s over 1500 encoder positions)
# Languages written without spaces: words are split at unicode boundaries (OpenAI's rule).
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})


@dataclass(frozen=True)
class WhisperVocab:
    eot: int
    sot: int
    sot_prev: int
    no_speech: int | None
    no_timestamps: int
    transcribe: int | None
    translate: int | None
    languages: dict[str, int]  # code -> token id; empty for English-only models
    vocab_size: int
    suppress: tuple[int, ...]  # masked at every free step
    begin_suppress: tuple[int, ...]  # masked at the first free step (" " and <|endoftext|>)
    alignment_heads: tuple[tuple[int, int], ...]  # (decoder layer, head) pairs for word timing
    language_names: dict[int, str] = field(default_factory=dict)  # token id -> code

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)

    def language_token(self, code: str) -> int:
        try:
            return self.languages[code]
        except KeyError:
            raise ValueError(f"unknown language {code!r} (this model knows {', '.join(sorted(self.languages))})") from None

    def sot_sequence(self, language: int | None, task: str) -> list[int]:
        """``<|startoftranscript|>`` and, for multilingual models, the language and task tokens."""
        if not self.multilingual:
            return [self.sot]
        if language is None:
            raise ValueError("a multilingual model needs a language token")
        return [self.sot, language, self.translate if task == "translate" else self.transcribe]


def load_vocab(model_dir: Path, tokenizer=None) -> WhisperVocab:
    """The special tokens of the Whisper checkpoint in ``model_dir`` (``tokenizer``: its Hugging
    Face tokenizer, loaded here if not given)."""
    model_dir = Path(model_dir)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = tokenizer.get_vocab()
    config = json.loads((model_dir / "config.json").read_text())
    try:
        generation = json.loads((model_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        generation = {}

    def token(*names: str, required: bool = True) -> int | None:
        for name in names:
            if name in vocab:
                return vocab[name]
        if required:
            raise ModelError(f"{model_dir}: the tokenizer has no {names[0]} token (not a Whisper tokenizer?)")
        return None

    eot, sot = token("<|endoftext|>"), token("<|startoftranscript|>")
    translate = token("<|translate|>", required=False)
    if "lang_to_id" in generation:
        languages = {k.strip("<|>"): int(v) for k, v in generation["lang_to_id"].items()}
    else:  # the tokens between <|startoftranscript|> and <|translate|>
        names = {i: t for t, i in vocab.items()}
        end = translate if translate is not None else sot + 1
        languages = {names[i].strip("<|>"): i for i in range(sot + 1, end) if i in names}
    multilingual = generation.get("is_multilingual", config["vocab_size"] >= 51865)
    if not multilingual:
        languages = {}
    no_speech = token("<|nospeech|>", "<|nocaptions|>", required=False)
    specials = [token("<|transcribe|>", required=False), translate, sot, token("<|startofprev|>"),
                token("<|startoflm|>", required=False), no_speech]
    # OpenAI's decoder always masks these special tokens besides the checkpoint's list.
    suppress = sorted({t for t in (generation.get("suppress_tokens") or config.get("suppress_tokens") or []) if t >= 0}
                      | {t for t in specials if t is not None})
    begin = generation.get("begin_suppress_tokens") or config.get("begin_suppress_tokens")
    if begin is None:
        begin = [*tokenizer.encode(" ", add_special_tokens=False), eot]
    heads = generation.get("alignment_heads") or []
    return WhisperVocab(
        eot=eot,
        sot=sot,
        sot_prev=token("<|startofprev|>"),
        no_speech=no_speech,
        no_timestamps=token("<|notimestamps|>"),
        transcribe=token("<|transcribe|>", required=False),
        translate=translate,
        languages=languages,
        vocab_size=config["vocab_size"],
        suppress=tuple(suppress),
        begin_suppress=tuple(begin),
        alignment_heads=tuple((int(l), int(h)) for l, h in heads),
        language_names={i: code for code, i in languages.items()},
    )
