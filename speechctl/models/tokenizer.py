"""A byte-level tokenizer: ids 0-255 are the UTF-8 bytes, control tokens follow."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenizing uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = dict(zip(printable, printable))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {b: chr(c) for b, c in chars.items()}


def byte_tokenizer(special_tokens: list[str]) -> PreTrainedTokenizerFast:
    """Bytes take ids 0-255; ``special_tokens`` take 256, 257, ... in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _byte_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(special_tokens)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    ids = fast.convert_tokens_to_ids(special_tokens)
    if ids != list(range(256, 256 + len(special_tokens))):
        raise RuntimeError(f"byte tokenizer special ids came out as {ids}")
    return fast
