"""MusicGen's config as vLLM must read it (``family.musicgen_hf_config``); imports transformers."""

from __future__ import annotations

from transformers import MusicgenConfig


class MusicgenStreamConfig(MusicgenConfig):
    """A ``MusicgenConfig`` whose text config is its decoder's: vLLM sizes the engine (layers,
    heads, vocabulary, context) by ``get_text_config()``, which transformers refuses for a
    config holding both a text encoder and a decoder."""

    def get_text_config(self, decoder=None, encoder=None):
        return self.text_encoder if encoder and not decoder else self.decoder
