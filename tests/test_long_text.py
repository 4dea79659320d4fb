"""Long text as users paste it: cut at sentence, then clause, then word boundaries into pieces the
model handles, every character kept; the pieces run together in the continuous batch and come
back joined in order with their pauses, one-shot and streamed; a cap that cuts audio says so."""

import re

import numpy as np
import pytest

from speechctl.text import CLAUSE_PAUSE_S, SENTENCE_PAUSE_S, split_for_speech

PARAGRAPH = (
    "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
    "It is easy to tell the depth of a well, though the rope may be long, wet and cold, and the bucket heavy "
    "when it finally comes up full of clear water from the spring below the old stone wall. "
    "These days a chicken leg is a rare dish! Rice is often served in round bowls? "
) * 4


def _letters(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("max_chars", [20, 60, 200])
def test_every_character_is_kept_in_order_within_the_limit(max_chars):
    pieces = split_for_speech(PARAGRAPH, max_chars)
    assert all(len(p.text) <= max_chars for p in pieces)
    assert _letters("".join(p.text for p in pieces)) == _letters(PARAGRAPH)
    assert pieces[-1].pause_s == 0


def test_cuts_prefer_sentences_then_clauses_then_words():
    pieces = split_for_speech("Short one. Another short one. " + "word " * 30 + "end, tail.", 60)
    assert pieces[0].text == "Short one. Another short one." and pieces[0].pause_s == SENTENCE_PAUSE_S
    assert any(p.pause_s == 0.0 for p in pieces[:-1]), "a clause longer than the limit is cut at a space"
    assert split_for_speech("a, b", 3)[0].pause_s == CLAUSE_PAUSE_S
    assert [p.text for p in split_for_speech("x" * 25, 10)] == ["x" * 10, "x" * 10, "x" * 5]  # no spaces: hard cuts


@pytest.mark.engine
def test_a_long_paragraph_comes_out_whole_streamed_and_one_shot():
    from speechctl.api import Speech, TtsJob
    from speechctl.engine.config import EngineConfig

    speech = Speech(engine_config=EngineConfig(max_num_seqs=16, dtype="float32", kv_cache_bytes=1 << 27))
    try:
        text = PARAGRAPH[:700]
        pieces = split_for_speech(text, speech.max_piece_chars)
        assert len(pieces) >= 3
        whole = speech.tts(text, seed=5, max_seconds=1.0)
        parts = list(speech.run([TtsJob(id=str(i), text=p.text, seed=5, max_seconds=1.0) for i, p in enumerate(pieces)]))
        parts = {r.id: r for r in parts}
        expected = []
        for i, piece in enumerate(pieces):
            expected += [parts[str(i)].audio, np.zeros(round(piece.pause_s * speech.sample_rate), np.float32)]
        np.testing.assert_allclose(whole.audio, np.concatenate(expected), atol=1e-5)
        np.testing.assert_array_equal(whole.codes, np.concatenate([parts[str(i)].codes for i in range(len(pieces))], axis=1))
        assert len(whole.warnings) == sum(len(r.warnings) for r in parts.values())  # each capped piece named

        streamed = list(speech.stream_tts(text, seed=5, max_seconds=1.0))
        assert {c.id for c in streamed} == {"text"} and streamed[-1].last and not any(c.error for c in streamed)
        assert [c.start for c in streamed] == list(np.cumsum([0] + [len(c.audio) for c in streamed[:-1]]))
        np.testing.assert_allclose(np.concatenate([c.audio for c in streamed]), whole.audio, atol=1e-5)

        capped = speech.tts(text, seed=5, max_seconds=0.04)
        assert capped.warnings and "cap" in capped.warnings[0] and "piece" in capped.warnings[0]
    finally:
        speech.close()
