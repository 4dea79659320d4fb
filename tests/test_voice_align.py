"""The voice recipe's word timings and guided attention: espeak-ng through its library (the CLI's
bytes, with word starts), the per-frame spans the data gives, the attention probe against
transformers' own eager attention, and a small LM learning where each frame reads."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recipes.voice import text  # noqa: E402
from recipes.voice.align import AttentionProbe, word_spans  # noqa: E402
from recipes.voice.config import ConfigError, DataConfig, preset  # noqa: E402

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng is not installed (apt-get install espeak-ng)")


@needs_espeak
def test_the_library_speaks_the_clis_bytes_and_says_where_words_start():
    from recipes.voice import data
    from recipes.voice.espeak_lib import Synthesizer

    config = DataConfig()
    corpus = text.make_corpus(replace(config, hours=2.0))
    sentences = corpus.heldout[:12] + corpus.train[::400][:12] + ["-5 degrees, said she.", "Hello world"]
    synthesizer = Synthesizer(config.voice, config.words_per_minute, config.pitch)
    try:
        for sentence in sentences:
            pcm, rate, words, _ = synthesizer.synthesize(sentence)
            cli, cli_rate = data.synthesize(sentence, config)
            assert rate == cli_rate and pcm.tobytes() == cli.tobytes(), sentence
            assert (np.diff(words[:, 2]) >= 0).all() and words[-1, 2] < len(pcm)
            assert ((words[:, 0] >= 0) & (words[:, 0] + words[:, 1] <= len(sentence))).all()
        pcm, rate, words, phonemes = synthesizer.synthesize("The quick brown fox jumps over the lazy dog.")
        said = ["The quick brown fox jumps over the lazy dog."[a:a + n] for a, n, _ in words]
        assert said == ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
        assert len(phonemes.split()) == len(words) + 1 and phonemes.endswith(" .")  # (nine words, then the full stop)
    finally:
        synthesizer.close()


@needs_espeak
def test_the_data_records_each_words_first_sample_and_the_codes_its_frame(tmp_path):
    from recipes.voice import data

    config = DataConfig(hours=0.002, heldout=2, max_chars=60)
    data.build(config, tmp_path / "data", workers=1, log=None)
    split = data.load_split(tmp_path / "data", "heldout")
    assert split.text[0] == "The quick brown fox jumps over the lazy dog."
    counts = split.word_counts
    assert counts[0] == 9 and len(split.words) == counts.sum()
    fox = split.words[:9]
    assert fox[0, 2] <= int(0.15 * config.sample_rate)  # the first word starts where the trimmed audio does
    assert (np.diff(fox[:, 2]) > 0).all() and fox[-1, 2] < split.length[0]
    # one word's start, resampled: espeak-ng's sample x 16000 / 22050, less the trimmed silence
    pcm, rate, words, _ = __import__("recipes.voice.espeak_lib", fromlist=["x"]).Synthesizer(
        config.voice, config.words_per_minute, config.pitch).synthesize(split.text[0])
    shift = int(np.floor(words[1, 2] * config.sample_rate / rate)) - fox[1, 2]
    assert ((np.floor(words[:, 2] * config.sample_rate / rate) - shift).astype(int) == fox[:, 2]).all()

    # the codes keep them in frames (a word starting inside a frame: that frame)
    import transformers

    from recipes.voice import checkpoint, codes

    recipe = preset("tiny")
    torch.manual_seed(0)
    transformers.DacModel(recipe.codec.dac_config()).eval().to(torch.float16).save_pretrained(tmp_path / "codec")
    checkpoint.write_record(tmp_path / "codec", {"stage": "codec", "recipe": recipe.to_dict()})
    codes.extract(tmp_path / "codec", tmp_path / "data", tmp_path / "codes", "cpu", "d" * 64, log=None)
    coded = codes.load_codes(tmp_path / "codes", "heldout")
    hop = int(np.prod(recipe.codec.downsampling_ratios))
    assert coded.word_counts.tolist() == counts.tolist()
    assert (coded.words[:, :2] == split.words[:, :2]).all() and (coded.words[:, 2] == split.words[:, 2] // hop).all()
    assert (coded.words[:9, 2] < coded.frames[0]).all()


def test_word_spans_give_each_frame_the_word_it_reads():
    # utterance 0: 6 frames, "ab cd" (words at chars 0 and 3, from frames 1 and 4);
    # utterance 1: 2 frames, no words; utterance 2: 3 frames, one word from frame 0
    words = np.array([[0, 2, 1], [3, 2, 4], [0, 4, 0]], np.int32)
    spans = word_spans(words, np.array([2, 0, 1]), np.array([0, 6, 8]), np.array([6, 2, 3]))
    assert spans.tolist() == [[0, 2], [0, 2], [0, 2], [0, 2], [3, 5], [3, 5], [0, 0], [0, 0], [0, 4], [0, 4], [0, 4]]


def test_the_probe_is_transformers_eager_attention():
    """The probed heads' attention mass on a span equals the sum of the weights transformers'
    eager attention returns for those heads (the model itself runs SDPA)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=50, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    model = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 50, (2, 20))
    probe = AttentionProbe(model, layer=1, heads=3)
    gold = torch.stack([torch.randint(0, 5, (2, 20)), torch.randint(6, 12, (2, 20))], dim=-1)
    gold = torch.minimum(gold, torch.arange(20)[None, :, None] + 1)  # within the causal window
    with torch.no_grad():
        model(input_ids=ids)
        mass = probe.log_mass(gold).exp()
        model.config._attn_implementation = "eager"
        weights = model(input_ids=ids, output_attentions=True).attentions[1][:, :3]  # [B, 3, L, L]
    pos = torch.arange(20)
    in_gold = (pos >= gold[..., :1]) & (pos < gold[..., 1:])
    expected = (weights * in_gold[:, None]).sum(-1)
    assert torch.allclose(mass, expected, atol=1e-5)
    probe.close()


def test_guided_attention_learns_where_each_frame_reads(tmp_path):
    """The copy task of the recipe's tests (each character two frames of codes), with its word
    starts: the batch marks, for the query predicting frame f, the word frame f reads; with
    ``align_weight`` the probed heads learn to put their weight there on unseen strings."""
    from copy_task import write_copy_task
    from recipes.voice.lm import LMTrainer

    recipe = preset("tiny")
    recipe.lm = replace(recipe.lm, dtype="float32")
    recipe.lm_train = replace(recipe.lm_train, batch_tokens=4096, lr=2e-3, warmup_steps=20, decay_share=0.0,
                              bare_text_share=0.0, log_every=50, eval_every=10**6, align_weight=1.0,
                              align_layer=1, align_heads=1, align_start=0, align_ramp=0)
    path = tmp_path / "codes"
    write_copy_task(path, recipe.codec.n_codebooks, recipe.codec.codebook_size, {"train": 600, "heldout": 32},
                    words=True)
    trainer = LMTrainer(recipe, path, tmp_path / "work", "cpu", "c" * 64, log=lambda line: None)

    t = trainer.heldout.text[0]
    batch = trainer.heldout.batch(torch.tensor([0]), 128)
    P = len(t) + 3
    second = t.rindex(t.split()[1])
    gold = batch["gold"][0]
    assert gold[P - 1].tolist() == [2, 2 + len(t.split()[0])]  # predicting frame 0: the first word
    assert gold[P - 1 + 2 * second].tolist() == [2 + second, 2 + len(t)]  # the second word's first frame
    assert (gold[: P - 1] == -1).all() and (gold[P - 1 + 2 * len(t):] == -1).all()

    before = trainer.evaluate()["heldout_align_loss"]
    trainer.train(1e12, max_steps=80)
    after = trainer.evaluate()["heldout_align_loss"]
    assert after < 0.5 * before and after < 0.7, (before, after)  # mass on the right word: > 0.5
    from recipes.voice.align import attention_table

    table, uniform = attention_table(trainer)  # the recipe's `lm-attention` on this model
    assert table.shape == (2, 2) and table[1, 0] > 0.5 > uniform and table[1, 0] == table.max()


def test_guided_attention_waits_for_its_start_then_ramps(tmp_path):
    """Before ``align_start`` the guided loss is logged but moves nothing: the weights equal a run
    without it, step for step; then its weight rises linearly over ``align_ramp`` steps."""
    from copy_task import write_copy_task
    from recipes.voice.lm import LMTrainer
    from recipes.voice.schedule import ramp

    assert [ramp(s, 10, 4) for s in (0, 9, 10, 11, 12, 13, 14, 100)] == [0, 0, 0.25, 0.5, 0.75, 1, 1, 1]
    assert ramp(0, 0, 0) == 1.0 and ramp(5, 6, 0) == 0.0

    recipe = preset("tiny")
    recipe.lm = replace(recipe.lm, dtype="float32")
    path = tmp_path / "codes"
    write_copy_task(path, recipe.codec.n_codebooks, recipe.codec.codebook_size, {"train": 64, "heldout": 8}, words=True)
    runs = {}
    for weight in (0.0, 1.0):
        recipe.lm_train = replace(recipe.lm_train, batch_tokens=2048, warmup_steps=2, decay_share=0.0, log_every=3,
                                  eval_every=10**6, align_weight=weight, align_layer=1, align_heads=1,
                                  align_start=6, align_ramp=2)
        trainer = LMTrainer(recipe.validate(), path, tmp_path / f"work-{weight}", "cpu", "c" * 64, log=lambda line: None)
        trainer.train(1e12, max_steps=6)
        runs[weight] = trainer
    for (name, a), b in zip(runs[0.0].model.state_dict().items(), runs[1.0].model.state_dict().values()):
        assert torch.equal(a, b), name
    assert all(row["align_loss"] > 0 for row in runs[1.0].history if "align_loss" in row)  # logged all along
    runs[1.0].train(1e12, max_steps=1)  # step 6: the guided loss counts from here
    runs[0.0].train(1e12, max_steps=1)
    assert not all(torch.equal(a, b) for a, b in zip(runs[0.0].model.parameters(), runs[1.0].model.parameters()))
    with pytest.raises(ConfigError, match="align_start"):
        replace(recipe, lm_train=replace(recipe.lm_train, align_start=-1)).validate()


def test_guided_attention_needs_words_and_a_layer_that_exists(tmp_path):
    recipe = preset("tiny")
    with pytest.raises(ConfigError, match="align"):
        replace(recipe, lm_train=replace(recipe.lm_train, align_weight=1.0, align_layer=5)).validate()
