"""CTranslate2 Whisper tiny.en -> Hugging Face checkpoint: the reader, the mapping, the cache, and
the known-logit table checked against CTranslate2 itself."""

import json
import struct

import numpy as np
import pytest

from speechctl.asr.checkpoint import bundled_source, ensure_whisper
from speechctl.asr.convert import hf_state_dict, read_shape
from speechctl.asr.ct2 import read_ct2
from speechctl.asr.probe import ENCODER_FRAMES, KNOWN, PROMPT, probe_features
from speechctl.errors import ModelError


@pytest.fixture(scope="module")
def source():
    return bundled_source()[0]


@pytest.fixture(scope="module")
def ct2(source):
    return read_ct2(source / "model.bin")


@pytest.fixture(scope="module")
def converted():
    return ensure_whisper()


def test_reader_reads_every_variable(ct2):
    assert ct2.spec == "WhisperSpec" and ct2.revision == 3
    assert len(ct2.variables) == 148
    assert ct2.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert ct2.get("decoder/projection/weight").shape == (51864, 384)
    assert ct2.get("encoder/conv1/weight").dtype == np.float16
    assert ct2.scalar("encoder/num_heads") == 6


def test_reader_rejects_broken_files(tmp_path, source):
    data = (source / "model.bin").read_bytes()
    cases = {
        "truncated.bin": data[:100_000],
        "version.bin": struct.pack("<I", 5) + data[4:],
        "trailing.bin": data + b"\0\0",
        "empty.bin": b"",
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ModelError, match=name):
            read_ct2(tmp_path / name)


def test_mapping_uses_every_variable_and_checks_the_key_bias(ct2):
    shape = read_shape(ct2)
    assert (shape.encoder_layers, shape.decoder_layers, shape.vocab_size, shape.n_mels) == (4, 4, 51864, 80)
    state = hf_state_dict(ct2, shape)
    assert len(state) == 167  # every transformers tensor but the tied proj_out (checked in convert)
    q, k, v = np.split(ct2.get("encoder/layer_0/self_attention/linear_0/weight"), 3)
    np.testing.assert_array_equal(state["model.encoder.layers.0.self_attn.k_proj.weight"], k)
    np.testing.assert_array_equal(state["model.decoder.layers.3.encoder_attn.v_proj.bias"], ct2.get("decoder/layer_3/attention/linear_1/bias")[384:])

    broken = type(ct2)(ct2.spec, ct2.revision, dict(ct2.variables), dict(ct2.aliases))
    bias = broken.variables["decoder/layer_1/self_attention/linear_0/bias"].copy()
    bias[384 + 7] = 0.5  # a non-zero key bias cannot be represented in Whisper
    broken.variables["decoder/layer_1/self_attention/linear_0/bias"] = bias
    with pytest.raises(ModelError, match="key bias"):
        hf_state_dict(broken, shape)
    broken = type(ct2)(ct2.spec, ct2.revision, dict(ct2.variables, **{"decoder/extra/weight": bias}), dict(ct2.aliases))
    with pytest.raises(ModelError, match="not mapped"):
        hf_state_dict(broken, shape)


def test_conversion_is_cached_and_complete(converted):
    files = {p.name for p in converted.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
            "tokenizer.json", "tokenizer_config.json", "speechctl.json"} <= files
    record = json.loads((converted / "speechctl.json").read_text())
    assert record["ct2_variables"] == 148 and record["known_logit_max_diff"] < 1e-3
    assert ensure_whisper() == converted
    assert not [p for p in converted.parent.iterdir() if p.name.startswith(".whisper")], "temporary directory left"
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["begin_suppress_tokens"] == [220, 50256] and 50357 in generation["suppress_tokens"]

    from transformers import WhisperProcessor

    processor = WhisperProcessor.from_pretrained(str(converted))
    ids = processor.tokenizer(" The quick brown fox", add_special_tokens=False).input_ids
    assert ids == [383, 2068, 7586, 21831]
    assert processor.tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"]) == PROMPT


def test_a_broken_cache_entry_is_not_used(tmp_path, monkeypatch):
    """A conversion that fails validation leaves nothing in the cache."""
    import speechctl.asr.probe as probe

    monkeypatch.setenv("SPEECHCTL_CACHE", str(tmp_path))
    monkeypatch.setitem(probe.KNOWN, "greedy", [1, 2, 3, 4])
    with pytest.raises(ModelError, match="known-logit check"):
        ensure_whisper()
    assert not any((tmp_path / "models").iterdir())


def test_known_logit_table_is_what_ctranslate2_computes(source, converted):
    """The constants in speechctl/asr/probe.py come from the original implementation: recompute
    them with CTranslate2 on the bundled model.bin."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    features = probe_features(converted)
    model = ctranslate2.models.Whisper(str(source), device="cpu", compute_type="float32")
    view = ctranslate2.StorageView.from_array(features)
    encoded = np.array(model.encode(view))[0]
    for row, t in zip(KNOWN["encoder"], ENCODER_FRAMES):
        np.testing.assert_allclose(encoded[t, :4], row, atol=1e-3)
    (result,) = model.generate(view, [PROMPT], beam_size=1, max_length=12, return_logits_vocab=True,
                               suppress_tokens=[], suppress_blank=False)
    logits = np.array(result.logits[0])[0]
    for token, value in KNOWN["logits"].items():
        assert abs(logits[token] - value) < 1e-3
    assert sorted(KNOWN["logits"], key=lambda t: -logits[t])[:5] == list(np.argsort(-logits)[:5])
    assert result.sequences_ids[0] + [50256] == KNOWN["greedy"]
