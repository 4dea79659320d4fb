"""recipes/voice (issue 20): the training recipe of speechctl's own codec and speech LM, at toy
sizes on the CPU. The LM's teacher-forced batches are checked against speechctl's own prompt
builder and delay layout, its logits against tests/reference.py on the exported checkpoint, and
an LM overfitted to one utterance must say exactly that utterance through speechctl's engine."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recipes.voice import checkpoint, text  # noqa: E402
from recipes.voice.config import ConfigError, DataConfig, preset  # noqa: E402

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Training steps on one thread: on a small shared CPU, two threads waiting on each other
    made a step 5-20x slower (measured beside other sessions' jobs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng is not installed (apt-get install espeak-ng)")


# -- text and data ---------------------------------------------------------------------------------


def test_corpus_is_deterministic_and_holds_out_its_test_sentences():
    config = DataConfig()  # the full scale: text only, nothing is synthesized here
    a, b = text.make_corpus(config), text.make_corpus(config)
    assert a.train == b.train and a.heldout == b.heldout
    assert "The quick brown fox jumps over the lazy dog." in a.heldout
    assert len(a.heldout) >= 100
    held = {text.normalize(s) for s in a.heldout}
    assert not held & {text.normalize(s) for s in a.train}
    hours = sum(map(text.estimated_seconds, a.train)) / 3600
    assert hours >= config.hours * 0.99
    assert text.bare("The quick brown fox.") == "the quick brown fox" and text.bare("Why?") == "why?"
    assert 0.25 < sum(text.bare_variant(s, 0.3) for s in a.train[:3000]) / 3000 < 0.35
    other = text.make_corpus(replace(config, seed=1, hours=8.0))
    assert other.heldout == a.heldout and other.train[: a.natural] == a.train[: a.natural]
    assert other.train != a.train  # the made-up sentences follow the seed


@pytest.mark.parametrize("source", ["wordnet", "jargon"])
def test_a_source_adds_natural_sentences_and_leaves_the_held_out_set_alone(source):
    """``data.natural`` with WordNet or the Jargon File: its sentences come after the Devil's
    Dictionary's, none of them is a held-out one, and the held-out set is the same as without it
    (losses stay comparable across the voice's runs)."""
    config = DataConfig(hours=8.0)
    devil = text.make_corpus(config)
    both = text.make_corpus(replace(config, natural=["devil", source]))
    assert both.heldout == devil.heldout
    assert both.natural > devil.natural
    assert both.train[: devil.natural] == devil.train[: devil.natural]
    added = set(text.source_sentences(source))
    assert set(both.train[devil.natural: both.natural]) <= added
    assert not {text.normalize(s) for s in both.heldout} & {text.normalize(s) for s in both.train}
    for bad in (["wordnet"], ["devil", "gutenberg"]):
        with pytest.raises(ConfigError, match="data.natural"):
            replace(config, natural=bad).validate()
    from recipes.voice.stages import apply_sets

    for value in ("devil,wordnet", '["devil","wordnet"]'):  # as gpu.sh's VOICE_SET passes it
        assert apply_sets(preset("full"), [f"data.natural={value}"]).data.natural == ["devil", "wordnet"]


@pytest.mark.skipif(not all(Path(p).exists() for p in ("/usr/share/dictd/devil.dict.dz", "/usr/share/dict/words",
                                                         "/usr/share/wordnet/data.noun", "/usr/share/dictd/jargon.dict.dz")),
                    reason="Debian's dict-devil, wamerican, wordnet-base and dict-jargon are not installed")
def test_committed_text_is_what_the_debian_packages_give(tmp_path):
    from recipes.voice.text_sources import build_sources

    build_sources(out=tmp_path)
    for name in ("devil.txt", "words.txt", "wordnet.txt", "jargon.txt"):
        assert (tmp_path / name).read_bytes() == (text.TEXT_DIR / name).read_bytes()


def test_resampler_is_band_limited_and_exact_in_length():
    from recipes.voice.data import resample

    t = np.arange(22050) / 22050
    y = resample(np.sin(2 * np.pi * 440 * t), 22050, 16000)
    assert len(y) == 16000
    assert np.abs(y - np.sin(2 * np.pi * 440 * np.arange(16000) / 16000))[100:-100].max() < 1e-4
    high = resample(np.sin(2 * np.pi * 10000 * t), 22050, 16000)  # above 8 kHz: removed
    assert np.abs(high[200:-200]).max() < 1e-3


@needs_espeak
def test_the_data_records_the_phonemes_speechctl_reads(tmp_path):
    """Every utterance's phonemes, written by the synthesis server beside its speech, are what
    speechctl's engine reads for its text (``speechctl.phonemes.phonemize``: a voice trained on
    them is given text), and they are espeak-ng's own: its CLI's ``-x`` words, stress marks aside
    (the CLI's come from its synthesis pass, which moves a stress now and then)."""
    import re

    from recipes.voice import data
    from speechctl.phonemes import phonemize, word_spans

    config = DataConfig(hours=0.01, heldout=30, max_chars=120)
    data.build(config, tmp_path / "d", workers=2, log=None)
    unstressed = lambda words: [re.sub(r"[',]", "", w) for w in words]  # noqa: E731
    exact = 0
    for name in ("train", "heldout"):
        split = data.load_split(tmp_path / "d", name)
        assert len(split.phonemes) == len(split.text) > 0
        for sentence, phonemes in zip(split.text, split.phonemes):
            assert phonemes == phonemize(sentence, config.voice)
            words = [phonemes[s: s + n] for s, n in word_spans(phonemes)]
            cli = subprocess.run(["espeak-ng", "-q", "-x", "-v", config.voice], input=sentence.encode(),
                                 capture_output=True, check=True).stdout.decode().split()
            assert unstressed(words) == unstressed(cli), (sentence, phonemes, cli)
            exact += words == cli
    assert exact >= 0.9 * (len(split.text) + len(data.load_split(tmp_path / "d", "train").text))
    # each clause's punctuation is a word of its own (inside words, ":" is a long vowel)
    said = phonemize("Hello, world. Is it true? Yes!")
    assert [w for w in said.split() if w in ",.?!"] == [",", ".", "?", "!"] and len(word_spans(said)) == 6
    assert word_spans("h@l'oU , w'3:ld .") == [(0, 6), (9, 6)]


def test_the_lm_reads_phonemes_with_its_word_starts_moved_onto_them():
    from recipes.voice.codes import CodeSplit
    from recipes.voice.lm import as_read

    split = CodeSplit(np.zeros((2, 9), np.int16), ["Hello world.", "In 1990."], np.array([0, 5]), np.array([5, 4]),
                      words=np.array([[0, 5, 0], [6, 5, 2], [0, 2, 0], [3, 4, 1]], np.int32),
                      word_counts=np.array([2, 2]), phonemes=["h@l'oU w'3:ld .", "In n'aInti:nh'VndrI2d n'aInti ."])
    read = as_read(split, "phonemes", 0.0)
    assert read.text == split.phonemes and split.text == ["Hello world.", "In 1990."]  # (the split is left as it was)
    # "1990" is three phoneme words for one word event: that utterance keeps no spans
    assert read.words.tolist() == [[0, 6, 0], [7, 6, 2], [0, 0, 0], [0, 0, 1]]
    assert as_read(split, "phonemes", 1.0).text == ["h@l'oU w'3:ld", "In n'aInti:nh'VndrI2d n'aInti"]  # as typed
    assert as_read(split, "text", 1.0).text == ["hello world", "in 1990"] and as_read(split, "text", 0.0).text == split.text
    with pytest.raises(ConfigError, match="without phonemes"):
        as_read(CodeSplit(split.codes, split.text, split.offset, split.frames), "phonemes", 0.0)
    with pytest.raises(ConfigError, match="text_input"):
        replace(tiny_recipe(), lm_train=replace(preset("tiny").lm_train, text_input="ipa")).validate()


@needs_espeak
def test_codes_made_while_the_data_is_spoken_are_the_codes_of_the_data(tmp_path):
    """The LM stage encodes each chunk of speech while the workers speak the next: the same data,
    the same codes and words as speaking everything first and encoding it after; a second call
    reuses both."""
    import transformers

    from recipes.voice import codes, data

    recipe = preset("tiny")
    config = DataConfig(hours=0.01, heldout=3, max_chars=60)
    torch.manual_seed(0)
    transformers.DacModel(recipe.codec.dac_config()).eval().save_pretrained(tmp_path / "codec")
    lines = []
    made, coded = codes.ensure_with_data(tmp_path / "codec", config, tmp_path / "together", tmp_path / "together-codes",
                                         "cpu", log=lines.append, chunk_seconds=5.0, workers=2)
    apart = data.build(config, tmp_path / "apart", workers=1, log=None)
    codes.extract(tmp_path / "codec", tmp_path / "apart", tmp_path / "apart-codes", "cpu", apart["sha256"], log=None)
    assert made["sha256"] == apart["sha256"] and coded["data_sha256"] == apart["sha256"] and coded["made_with_data"]
    train_seconds = made["splits"]["train"]["hours"] * 3600
    assert train_seconds > 3 * 5.0  # several chunks
    for name in ("train", "heldout"):
        a, b = codes.load_codes(tmp_path / "together-codes", name), codes.load_codes(tmp_path / "apart-codes", name)
        assert a.text == b.text and (a.frames == b.frames).all() and (a.offset == b.offset).all()
        assert (a.words == b.words).all() and (a.word_counts == b.word_counts).all()
        assert (a.codes == b.codes).all(), f"{name}: {(a.codes != b.codes).mean():.4f} of the codes differ"
    assert any(line.startswith("codes:") and "encoded while the data was made" for line in lines), lines
    lines.clear()
    again = codes.ensure_with_data(tmp_path / "codec", config, tmp_path / "together", tmp_path / "together-codes", "cpu",
                                   log=lines.append)
    assert again == (made, coded) and lines == []  # nothing made again


@needs_espeak
def test_synthesis_is_deterministic(tmp_path):
    from recipes.voice import data

    config = DataConfig(hours=0.004, heldout=2, max_chars=60)
    a = data.build(config, tmp_path / "a", workers=1, log=None)
    b = data.build(config, tmp_path / "b", workers=2, log=None)
    assert a["sha256"] == b["sha256"] and a["splits"]["train"]["empty"] == 0
    split = data.load_split(tmp_path / "a", "heldout")
    assert split.text[0] == "The quick brown fox jumps over the lazy dog."
    seconds = split.length[0] / config.sample_rate
    assert 1.5 < seconds < 5.0
    assert data.ensure(config, tmp_path / "a", expect_sha256=a["sha256"], log=None)["sha256"] == a["sha256"]
    for sentence in split.text[:2]:  # what the LM may read instead: the same speech
        assert text.bare(sentence) != sentence
        assert data.synthesize(text.bare(sentence), config)[0].tobytes() == data.synthesize(sentence, config)[0].tobytes()
    with pytest.raises(data.DataError):
        data.ensure(config, tmp_path / "a", expect_sha256="0" * 64, strict=True, log=None)
    warned = []
    data.ensure(config, tmp_path / "a", expect_sha256="0" * 64, log=warned.append)
    assert warned and warned[0].startswith("WARNING")


def fake_data(path: Path, rate: int = 16000, seconds=(0.7, 1.1, 0.9), texts=None) -> str:
    """A data directory of synthetic 'speech' (harmonic tones), without espeak-ng."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in ("train", "heldout"):
        waves = []
        for i, s in enumerate(seconds):
            t = np.arange(int(s * rate)) / rate
            f0 = 110 + 40 * i + 30 * np.sin(2 * np.pi * 2 * t)
            w = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / rate) / k for k in range(1, 6)) * 0.2
            waves.append(np.round((w + 0.01 * rng.standard_normal(len(t))) * 32767).astype("<i2"))
        lengths = [len(w) for w in waves]
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist()
        np.concatenate(waves).tofile(path / f"{name}.pcm")
        names = texts or [f"Sentence {i}." for i in range(len(waves))]
        (path / f"{name}.json").write_text(json.dumps({"text": names, "offset": offsets, "length": lengths}))
    return "f" * 64


# -- codec ------------------------------------------------------------------------------------------


def tiny_recipe(**lm):
    recipe = preset("tiny")
    recipe.codec_train = replace(recipe.codec_train, disc_start_step=1, log_every=1, codebook_reset_every=2,
                                 batch_size=2, segment_s=0.2, decay_share=0.0)
    recipe.lm = replace(recipe.lm, dtype="float32", **lm)
    return recipe


def test_codebooks_start_as_dacs_reference_draws_them():
    """transformers draws a DacModel's codebooks from N(0, 0.02) (every Embedding); DAC's
    reference keeps nn.Embedding's N(0, 1), and from codes that small the commitment loss
    crushed the encoder's latents (the mel loss's 1,400- and 3,900-step plateaus on the H200).
    The rest of the model is transformers' own init; a record made before the setting existed
    reads the init it ran with."""
    import transformers

    from recipes.voice.codec import build_codec
    from recipes.voice.config import Recipe

    recipe = preset("full")
    model = build_codec(recipe.codec, recipe.codec_train)
    books = torch.cat([q.codebook.weight.detach().flatten() for q in model.quantizer.quantizers])
    assert books.std().item() == pytest.approx(1.0, abs=0.01) and abs(books.mean().item()) < 0.01
    torch.manual_seed(recipe.codec_train.seed)
    reference = transformers.DacModel(recipe.codec.dac_config())
    assert reference.quantizer.quantizers[0].codebook.weight.std().item() == pytest.approx(0.02, abs=0.002)
    ours = {k: v for k, v in model.state_dict().items() if "codebook" not in k and "parametrizations" not in k}
    theirs = reference.state_dict()
    assert ours and all(torch.equal(v, theirs[k]) for k, v in ours.items())
    again = build_codec(recipe.codec, recipe.codec_train)
    assert torch.equal(again.quantizer.quantizers[3].codebook.weight, model.quantizer.quantizers[3].codebook.weight)

    old = recipe.to_dict()
    del old["codec_train"]["codebook_init_std"]
    assert Recipe.from_dict(old).codec_train.codebook_init_std == 0.02
    assert Recipe.from_dict(recipe.to_dict()).codec_train.codebook_init_std == 1.0


def test_codec_trains_saves_and_resumes_where_it_stopped(tmp_path):
    from recipes.voice.codec import CodecTrainer, load_trained_codec

    sha = fake_data(tmp_path / "data")
    recipe = tiny_recipe()
    far = 1e12

    def trainer():
        return CodecTrainer(recipe, tmp_path / "data", "cpu", sha, log=lambda line: None)

    straight = trainer()
    straight.train(far, max_steps=3)
    assert {"mel", "wave", "commit", "codebook", "latent_rms", "d", "adv", "feat"} <= set(straight.history[1])
    first = trainer()
    first.train(far, max_steps=2)
    first.save(tmp_path / "ckpt")
    first.train(far, max_steps=1)  # saving leaves the trainer as it was
    assert first.step == 3
    record = checkpoint.read_record(tmp_path / "ckpt")
    assert record["resume"] == "exact" and record["data_sha256"] == sha and record["step"] == 2
    second = trainer()
    second.resume(tmp_path / "ckpt")
    second.train(far, max_steps=1)
    assert second.step == 3
    a, b = straight.model.state_dict(), second.model.state_dict()
    c = first.model.state_dict()
    assert max(float((a[k] - c[k]).abs().max()) for k in a) < 1e-6
    # The moments travel in bfloat16: the resumed step is the same step up to their rounding.
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-3
    model, _, _ = load_trained_codec(tmp_path / "ckpt")
    assert not any("parametrizations" in k for k in model.state_dict())
    with torch.no_grad():
        out = model(torch.zeros(1, 1, 6400)).audio_values
    assert out.shape == (1, 6400)


def test_a_log_line_is_the_mean_of_the_steps_its_window_had(tmp_path):
    """A resumed run's first window is shorter than log_every, and the adversarial terms begin
    mid-window: each logged value is the mean over the steps that gave it (dividing by log_every
    logged a mel of 1.80 at the first line of a resumed H200 run whose mel was 5.0)."""
    from recipes.voice.codec import CodecTrainer

    sha = fake_data(tmp_path / "data")
    recipe = tiny_recipe()
    recipe.codec_train = replace(recipe.codec_train, log_every=4, disc_start_step=3, codebook_reset_every=0)
    trainer = CodecTrainer(recipe, tmp_path / "data", "cpu", sha, log=lambda line: None)
    trainer.step = 2  # as if resumed at step 2: the first window holds steps 3 and 4

    def step(x):
        out = {"mel": torch.tensor(2.0)}
        if trainer.step >= recipe.codec_train.disc_start_step:
            out["adv"] = torch.tensor(6.0)
        return out

    trainer.train_step = step
    trainer.evaluate = lambda: {}
    trainer.train(1e12, max_steps=2)
    assert trainer.history[0]["step"] == 4
    assert trainer.history[0]["mel"] == 2.0 and trainer.history[0]["adv"] == 6.0


def test_the_shipped_codec_keeps_its_quantizer_exact(tmp_path):
    """The codec speechctl ships stores its encoder and decoder in float16 and its quantizer in
    float32, and both loaders (the recipe's and speechctl's DAC codec) read the quantizer back
    bit for bit: a stage whose latents sit in a narrow cone changed its codes for 60% of the
    frames when its weights were rounded to float16."""
    from safetensors.torch import load_file

    from recipes.voice.codec import CodecTrainer, load_trained_codec
    from recipes.voice.codes import load_codec_model
    from recipes.voice.stages import make_codec_model
    from speechctl.codecs.dac import DacCodec

    sha = fake_data(tmp_path / "data")
    trainer = CodecTrainer(tiny_recipe(), tmp_path / "data", "cpu", sha, log=lambda line: None)
    trainer.train(1e12, max_steps=1)
    trainer.save(tmp_path / "ckpt")
    shipped = make_codec_model(tmp_path / "ckpt", tmp_path / "codec-model")
    stored = load_file(str(shipped / "model.safetensors"))
    assert {str(t.dtype) for k, t in stored.items() if k.startswith("quantizer.")} == {"torch.float32"}
    assert {str(t.dtype) for k, t in stored.items() if not k.startswith("quantizer.")} == {"torch.float16"}
    master = dict(load_trained_codec(tmp_path / "ckpt")[0].quantizer.named_parameters())
    codec = DacCodec(shipped)
    for model in (load_codec_model(shipped), codec.model):
        loaded = dict(model.quantizer.named_parameters())
        assert loaded.keys() == master.keys()
        assert all(torch.equal(loaded[k], master[k]) for k in master)
    # speechctl computes codes (voice prompts) with TF32 off, and leaves the flags as they were
    flags = lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)  # noqa: E731
    seen, encode = [], codec.model.encode
    codec.model.encode = lambda *a, **k: seen.append(flags()) or encode(*a, **k)
    before = flags()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        codes = codec.encode([np.zeros(3 * codec.hop_length, np.float32)])
    finally:
        after = flags()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert seen == [(False, False)] and after == (True, True) and codes[0].shape[-1] == 3


def test_frozen_codes_keep_the_codes_while_the_decoder_trains_on(tmp_path):
    """``codec_train.freeze_codes`` on a resume: the encoder and quantizer stay bit for bit (so do
    the codes of any audio, and ``codes_identity``), the decoder trains on; an LM trained on the
    frozen codes exports with the later codec and is refused with one trained unfrozen."""
    from recipes.voice import stages
    from recipes.voice.codec import CodecTrainer
    from recipes.voice.codes import codes_identity, file_sha256, load_codec_model

    sha = fake_data(tmp_path / "data")
    trainer = CodecTrainer(tiny_recipe(), tmp_path / "data", "cpu", sha, log=lambda line: None)
    trainer.train(1e12, max_steps=2)
    trainer.save(tmp_path / "ckpt")

    def resumed(frozen: bool, name: str) -> Path:
        recipe = stages.apply_sets(tiny_recipe(), [f"codec_train.freeze_codes={str(frozen).lower()}"])
        t = CodecTrainer(recipe, tmp_path / "data", "cpu", sha, log=lambda line: None)
        t.resume(tmp_path / "ckpt")
        t.train(1e12, max_steps=2)
        t.save(tmp_path / f"ckpt-{name}")
        assert t.runs[-1]["freeze_codes"] is frozen
        return stages.make_codec_model(tmp_path / f"ckpt-{name}", tmp_path / f"model-{name}")

    before = stages.make_codec_model(tmp_path / "ckpt", tmp_path / "model-before")
    frozen, unfrozen = resumed(True, "frozen"), resumed(False, "unfrozen")
    assert file_sha256(frozen / "model.safetensors") != file_sha256(before / "model.safetensors")  # the decoder moved
    assert codes_identity(frozen) == codes_identity(before) != codes_identity(unfrozen)
    audio = torch.from_numpy(np.fromfile(tmp_path / "data" / "heldout.pcm", "<i2")[None, None] / 32768.0).float()
    with torch.no_grad():
        codes = [load_codec_model(m).encode(audio).audio_codes for m in (before, frozen)]
    assert torch.equal(codes[0], codes[1])

    lm = tmp_path / "lm"
    checkpoint.write_record(lm, {"stage": "lm", "codes_identity": codes_identity(before)})
    with pytest.raises(RuntimeError, match="does not give the codes"):
        stages.run_export(lm, unfrozen, tmp_path / "export")


def test_a_narrow_cone_of_latents_is_one_code_at_tf32():
    """The diagnosis behind the trainer's float32 matmuls (codebooks.py): latents that share a
    large offset are told apart by transformers' own codebook lookup in float32 and not at TF32's
    precision; at full precision the emulated lookup is transformers' lookup."""
    import transformers
    from transformers.models.dac.modeling_dac import DacVectorQuantize

    from recipes.voice.codebooks import tf32, tf32_lookup

    x = torch.tensor([1.0, 1.0 + 2**-10, 1.0 + 2**-12, 3.14159, -2.5e-3])
    rounded = tf32(x)
    assert (rounded.view(torch.int32) & ((1 << 13) - 1) == 0).all()
    assert rounded[0] == 1.0 and rounded[1] == x[1] and ((rounded - x).abs() <= x.abs() * 2**-11).all()
    g = torch.Generator().manual_seed(0)
    quantizer = DacVectorQuantize(transformers.DacConfig(hidden_size=16, codebook_size=64, codebook_dim=8))
    offset = torch.randn(8, generator=g) * 50
    with torch.no_grad():
        quantizer.codebook.weight.copy_(offset + 0.25 * torch.randn(64, 8, generator=g))
    latents = (offset[:, None] + 0.25 * torch.randn(8, 200, generator=g))[None]  # [1, D, T]: ~0.005 rad, as codebook 5
    (_, exact), emulated = quantizer.decode_latents(latents), tf32_lookup(quantizer, latents)
    assert len(torch.unique(exact)) > 20 and len(torch.unique(emulated)) < len(torch.unique(exact)) / 4
    spread = torch.randn(1, 8, 50, generator=g)  # a wide cone: TF32 rarely changes the choice
    assert (tf32_lookup(quantizer, spread) == quantizer.decode_latents(spread)[1].flatten()).float().mean() > 0.9


@needs_espeak
def test_codec_stage_resumes_the_machines_own_checkpoint(tmp_path):
    """A chained call (``codec resume``) continues the codec this machine trained in its previous
    call, also where an older pack an earlier call carried is still on the machine (the device
    keeps ignored paths between calls); a fresh machine takes the pack; with neither, one line."""
    from recipes.voice import stages

    recipe = replace(preset("tiny"), data=DataConfig(hours=0.004, heldout=2, max_chars=60))
    stages.run_codec(recipe, tmp_path / "machine", tmp_path / "pack", minutes=30, max_steps=2)  # the pack: step 2
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        stages.run_codec(recipe, tmp_path / "fresh", None, minutes=30, resume=tmp_path / "nothing", max_steps=1)
    stages.run_codec(recipe, tmp_path / "machine", None, minutes=30, resume=tmp_path / "nothing", max_steps=1)
    assert checkpoint.read_record(tmp_path / "machine" / "codec")["step"] == 3
    stages.run_codec(recipe, tmp_path / "machine", None, minutes=30, resume=tmp_path / "pack", max_steps=1)
    assert checkpoint.read_record(tmp_path / "machine" / "codec")["step"] == 4  # its own step 3, not the pack's 2
    stages.run_codec(recipe, tmp_path / "fresh", None, minutes=30, resume=tmp_path / "pack", max_steps=1)
    assert checkpoint.read_record(tmp_path / "fresh" / "codec")["step"] == 3


@needs_espeak
def test_codec_and_lm_train_side_by_side_in_one_call(tmp_path):
    """``gpu.sh codec+lm`` as a fresh device machine runs it (tiny scale, here, vLLM not
    importable): the carried codec resumes with its codes frozen while a new LM trains on its
    codes, both packs come back within a call's 8 files, and the LM exports with the codec as the
    call left it."""
    import os

    from recipes.voice import stages
    from recipes.voice.codes import codes_identity

    # vLLM is not importable there, as on the GPU machine before it is staged
    (tmp_path / "no-vllm").mkdir()
    (tmp_path / "no-vllm" / "sitecustomize.py").write_text("import sys\nsys.modules['vllm'] = None\n")
    env = {**os.environ, "PYTHON": sys.executable, "VOICE_SCALE": "tiny", "VOICE_MAX_STEPS": "2",
           "MINUTES": "5", "VOICE_CARRIED": str(tmp_path / "carry"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "no-vllm"), os.environ.get("PYTHONPATH")]))}
    gpu_sh = "recipes/voice/gpu.sh"  # from the repository's root, as a device call runs it

    def call(n: int, *stage: str) -> Path:
        out = tmp_path / f"out{n}"
        run = subprocess.run(["bash", gpu_sh, *stage], env={**env, "VOICE_WORK": str(tmp_path / f"machine{n}"),
                             "OUT": str(out)}, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return out

    stages.collect(call(1, "codec"), tmp_path / "carry")
    # the LM's own share of the codec's voice, its own text (sentences' seed) and what it reads
    env["VOICE_LM_SET"] = "data.hours=0.03 data.seed=7 lm_train.text_input=phonemes"
    out = call(2, "codec+lm")
    assert len(list(out.iterdir())) <= 8 and checkpoint.find_packed(out) == ["codec", "lm"]
    stages.collect(out, tmp_path / "carry")
    unpacked = tmp_path / "carry" / "unpacked"
    codec = checkpoint.read_record(unpacked / "codec")
    assert codec["step"] == 4 and codec["runs"][-1]["freeze_codes"] is True
    lm = checkpoint.read_record(unpacked / "lm")
    assert lm["codes_identity"] == codes_identity(unpacked / "codec-model")
    assert lm["recipe"]["data"] == {**codec["recipe"]["data"], "hours": 0.03, "seed": 7}
    assert codec["recipe"]["data"]["hours"] == preset("tiny").data.hours != 0.03
    assert lm["recipe"]["lm_train"]["text_input"] == "phonemes"
    model = stages.run_export(unpacked / "lm", unpacked / "codec-model", tmp_path / "model")
    made = json.loads((model / "speechctl.json").read_text())
    assert made["text"].startswith("The Devil's Dictionary") and "Jargon" not in made["text"]  # what it read, credited
    assert json.loads((model / "config.json").read_text())["speechctl"]["text_input"] == "phonemes"


def test_the_lm_takes_the_machines_own_codec_before_a_carried_pack(tmp_path):
    """Without a carried shipped codec, an LM stage takes this machine's codec (a chained `codec
    resume` trained it past any pack on the machine), else the carried codec pack, unpacked whole
    into a directory of its own; with neither, one line."""
    from recipes.voice import stages

    src = tmp_path / "src"
    src.mkdir()
    (src / "state.pt").write_bytes(b"carried")
    checkpoint.pack(src, tmp_path / "carried", "codec")
    got = stages._codec_for_lm(tmp_path / "carried", tmp_path / "work")
    assert got == tmp_path / "work" / "lm-codec" and (got / "state.pt").read_bytes() == b"carried"
    assert not (tmp_path / "work" / "lm-codec.unpacking").exists()
    (tmp_path / "work" / "codec").mkdir()
    (tmp_path / "work" / "codec" / "state.pt").write_bytes(b"trained here")
    assert stages._codec_for_lm(tmp_path / "carried", tmp_path / "work") == tmp_path / "work" / "codec"
    with pytest.raises(FileNotFoundError, match="no codec for the LM"):
        stages._codec_for_lm(tmp_path / "nothing", tmp_path / "fresh")


def test_a_letter_lm_resumed_on_a_fresh_machine_reads_phonemes_from_there(tmp_path):
    """The next issue-20 call: the kept letter LM's pack carried to a fresh machine and resumed
    with ``lm_train.text_input=phonemes``: its weights go on (steps counted from its own), its
    data is made again with phonemes, and the record and the export say phonemes."""
    from recipes.voice import stages

    recipe = tiny_recipe()
    codec_model = fake_codec_model(tmp_path / "codec-model", recipe)
    stages.run_lm(recipe, tmp_path / "machine1", tmp_path / "out1", 5, codec_model, max_steps=2)
    letters = checkpoint.read_record(tmp_path / "machine1" / "lm")
    assert letters["recipe"]["lm_train"]["text_input"] == "text" and letters["step"] == 2
    ckpt = stages.run_lm(recipe, tmp_path / "machine2", tmp_path / "out2", 5, codec_model, resume=tmp_path / "out1",
                         max_steps=2, sets=["lm_train.text_input=phonemes", "data.seed=4"])
    record = checkpoint.read_record(ckpt)
    assert record["step"] == 4 and [r["steps"] for r in record["runs"]] == [[0, 2], [2, 4]]
    assert record["recipe"]["lm_train"]["text_input"] == "phonemes" and record["recipe"]["data"]["seed"] == 4
    model = stages.run_export(ckpt, codec_model, tmp_path / "model")
    assert json.loads((model / "config.json").read_text())["speechctl"]["text_input"] == "phonemes"


def test_a_term_signal_ends_training_with_its_checkpoint_packed(tmp_path):
    """A device call's time limit (SIGTERM) ends training at the next step, the watch's periodic
    checkpoint on the machine comes with its pack in out, and the process's own SIGTERM handler
    is back afterwards."""
    import signal

    from recipes.voice.codec import CodecTrainer
    from recipes.voice.stages import StageWatch

    sha = fake_data(tmp_path / "data")
    trainer = CodecTrainer(tiny_recipe(), tmp_path / "data", "cpu", sha, log=lambda line: None)
    ckpt, out = tmp_path / "machine" / "codec", tmp_path / "out"
    saves = []

    def save():
        trainer.save(ckpt)
        saves.append(trainer.step)
        if len(saves) == 2:
            signal.raise_signal(signal.SIGTERM)  # the limit, arriving after the second checkpoint

    before = signal.getsignal(signal.SIGTERM)
    with StageWatch(save, ckpt, out, "codec", every_s=0, log=lambda line: None) as watch:
        trainer.train(1e12, max_steps=50, watch=watch)
    assert watch.stop and trainer.step == 2 and saves == [1, 2]
    assert signal.getsignal(signal.SIGTERM) is before
    assert checkpoint.find_packed(out) == ["codec"]
    unpacked = checkpoint.unpack(out, "codec", tmp_path / "unpacked")
    assert checkpoint.read_record(unpacked)["step"] == 2


@needs_espeak
def test_the_stage_clock_starts_with_the_call(tmp_path, monkeypatch):
    """The deadline counts from gpu.sh's start (VOICE_STARTED), not from when Python got there: a
    stage whose minutes are spent before training begins trains no step, and still saves."""
    import time

    from recipes.voice import stages

    recipe = replace(preset("tiny"), data=DataConfig(hours=0.004, heldout=2, max_chars=60))
    monkeypatch.setenv("VOICE_STARTED", str(time.time() - 10 * 60))
    stages.run_codec(recipe, tmp_path / "machine", None, minutes=10)
    assert checkpoint.read_record(tmp_path / "machine" / "codec")["step"] == 0


def test_codec_falls_back_to_eager_where_the_compiler_fails(tmp_path, monkeypatch):
    """codec_train.compile on a machine whose compiler fails: the step runs again in eager mode
    and training goes on, saying so in the log (a device call is not lost)."""
    from recipes.voice.codec import CodecTrainer

    sha = fake_data(tmp_path / "data")
    recipe = tiny_recipe()
    recipe.codec_train = replace(recipe.codec_train, compile=True)

    def broken_compile(module, **kw):
        def run(*a, **k):
            raise RuntimeError("inductor: no C compiler")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    lines = []
    trainer = CodecTrainer(recipe, tmp_path / "data", "cpu", sha, log=lines.append)
    trainer.train(1e12, max_steps=2)
    assert trainer.step == 2 and not trainer.compiled
    assert any("torch.compile failed at step 0" in line for line in lines)


def test_codec_speed_times_the_training_step_per_batch_size(tmp_path, monkeypatch):
    """The probe times the trainer's own step with the discriminators on, reports audio seconds
    per second from the crop it trained on, and goes on past a batch that does not fit."""
    from recipes.voice import codec
    from recipes.voice.codec_speed import measure_codec_steps

    sha = fake_data(tmp_path / "data")
    recipe = tiny_recipe()
    recipe.codec_train = replace(recipe.codec_train, disc_start_step=10**6)
    sizes = []
    step = codec.CodecTrainer.train_step

    def counted(self, x):
        sizes.append(x.shape[0])
        assert self.step >= self.cfg.disc_start_step  # the adversarial step is what is timed
        if x.shape[0] == 3:
            raise torch.OutOfMemoryError("no room")
        return step(self, x)

    monkeypatch.setattr(codec.CodecTrainer, "train_step", counted)
    rows = measure_codec_steps(recipe, tmp_path / "data", "cpu", [1, 3, 2], steps=2, warmup=1, log=lambda line: None)
    assert [r["batch"] for r in rows] == [1, 3, 2] and sizes == [1, 1, 1, 3, 2, 2, 2]
    assert rows[1] == {"batch": 3, "crop_s": 0.2, "steps": 2, "error": "out of memory"}
    for row in (rows[0], rows[2]):
        assert row["s_per_step"] > 0
        assert row["audio_s_per_s"] == pytest.approx(row["batch"] * 0.2 / row["s_per_step"], rel=0.01, abs=0.01)


def test_disc_bf16_puts_only_the_discriminators_in_bfloat16(tmp_path):
    from recipes.voice.codec import CodecTrainer

    sha = fake_data(tmp_path / "data")
    recipe = tiny_recipe()
    recipe.codec_train = replace(recipe.codec_train, disc_bf16=True)
    trainer = CodecTrainer(recipe, tmp_path / "data", "cpu", sha, log=lambda line: None)
    seen = {"disc": set(), "decoder": set()}
    disc, decoder = trainer.disc_forward, trainer.decoder

    def spy(name, module):
        def run(x):
            out = module(x)
            seen[name] |= {t.dtype for t in ([out] if name == "decoder" else [f for d in out for f in d])}
            return out
        return run

    trainer.disc_forward, trainer.decoder = spy("disc", disc), spy("decoder", decoder)
    trainer.train(1e12, max_steps=2)  # the second step is adversarial (disc_start_step 1)
    assert seen == {"disc": {torch.bfloat16}, "decoder": {torch.float32}}
    assert np.isfinite(trainer.history[-2]["d"])


@needs_espeak
def test_codec_speed_runs_of_a_call_share_one_file(tmp_path):
    from recipes.voice.stages import run_codec_speed

    recipe = tiny_recipe()
    out = tmp_path / "out"
    run_codec_speed(recipe, tmp_path / "work", out, [1], steps=1)
    recipe.codec_train = replace(recipe.codec_train, disc_bf16=True)
    run_codec_speed(recipe, tmp_path / "work", out, [2], steps=1)
    runs = json.loads((out / "codec-speed.json").read_text())["runs"]
    assert [r["codec_train"]["disc_bf16"] for r in runs] == [False, True]
    assert [[row["batch"] for row in r["rows"]] for r in runs] == [[1], [2]]


def test_schedule_warms_up_holds_and_anneals_by_the_clock():
    from recipes.voice.schedule import RunSchedule, resumed_rate

    now = [0.0]
    s = RunSchedule(100.0, first_step=0, warmup_steps=10, decay_share=0.3, floor=0.1, clock=lambda: now[0])
    assert s.factor(0) == pytest.approx(0.1) and s.factor(9) == 1.0
    now[0] = 69.0
    assert s.factor(500) == 1.0
    now[0] = 85.0
    assert 0.1 < s.factor(500) < 1.0
    now[0] = 100.0
    assert s.factor(500) == pytest.approx(0.1)
    # A resumed run climbs from the rate the last one ended at (the optimizer's moments saw it):
    # unknown, the floor...
    resumed = RunSchedule(1e9, first_step=500, warmup_steps=10, decay_share=0.3, floor=0.1, clock=lambda: 0.0)
    assert resumed.factor(500) == pytest.approx(0.1 + 0.9 * 0.1) and resumed.factor(509) == 1.0
    assert resumed.factor(505) == pytest.approx(0.1 + 0.9 * 0.6)
    # ... as the checkpoint's log says: a run that ended at the peak (decay_share 0) goes on at it
    ended = resumed_rate([{"step": 450, "lr": 0.3}, {"step": 500, "heldout_mel": 1.0}], peak=0.6)
    assert ended == 0.5 and resumed_rate([{"step": 500}], peak=0.6) is None
    half = RunSchedule(1e9, first_step=500, warmup_steps=10, decay_share=0.3, floor=0.1, ended_at=ended,
                       clock=lambda: 0.0)
    assert half.factor(500) == pytest.approx(0.5 + 0.5 * 0.1) and half.factor(509) == 1.0
    # one that stopped inside its warm-up goes on with it, as if it had not stopped
    straight = RunSchedule(1e9, first_step=0, warmup_steps=10, decay_share=0.0, floor=0.1, clock=lambda: 0.0)
    stopped = RunSchedule(1e9, first_step=4, warmup_steps=10, decay_share=0.0, floor=0.1, ended_at=straight.factor(3),
                          clock=lambda: 0.0)
    assert [stopped.factor(i) for i in range(4, 12)] == [straight.factor(i) for i in range(4, 12)]
    at_peak = RunSchedule(1e9, first_step=500, warmup_steps=10, decay_share=0.0, floor=0.1, ended_at=1.0,
                          clock=lambda: 0.0)
    assert at_peak.factor(500) == 1.0
    now[0] = 0.0
    no_decay = RunSchedule(100.0, first_step=500, warmup_steps=10, decay_share=0.0, floor=0.1, ended_at=1.0,
                           clock=lambda: now[0])
    now[0] = 100.0
    assert no_decay.factor(900) == 1.0  # ends at the peak, for the next call to go on from
    # ... and from nearly nothing where the moments were rebuilt
    rebuilt = RunSchedule(1e9, first_step=500, warmup_steps=10, decay_share=0.3, floor=0.1, rewarm_from=500,
                          clock=lambda: 0.0)
    assert rebuilt.factor(500) == pytest.approx(0.2 * 0.19) and rebuilt.factor(509) == 1.0


def test_pack_and_unpack_round_trip(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(np.random.default_rng(0).bytes(2500))
    (src / "sub" / "b.json").write_text("{}")
    parts = checkpoint.pack(src, tmp_path / "out", "thing", part_bytes=1000)
    assert len(parts) >= 3 and all(p.stat().st_size <= 1000 for p in parts)
    (src / "zeros.bin").write_bytes(bytes(20000))  # compressed: far less than its size travels
    assert sum(p.stat().st_size for p in checkpoint.pack(src, tmp_path / "z", "z", part_bytes=1000)) < 10000
    (src / "zeros.bin").unlink()
    dest = checkpoint.unpack(tmp_path / "out", "thing", tmp_path / "dest")
    assert (dest / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert (dest / "sub" / "b.json").read_text() == "{}"
    again = checkpoint.pack(src, tmp_path / "out2", "thing", part_bytes=1000)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in parts]  # same bytes, same parts
    parts[1].write_bytes(b"x" + parts[1].read_bytes()[1:])
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.unpack(tmp_path / "out", "thing", tmp_path / "dest2")


def test_the_machine_keeps_the_exact_state_that_does_not_travel(tmp_path):
    """A checkpoint too large to travel exact (the LM: bf16 weights only, Adam restarted on every
    resume) keeps its exact state on the machine that trains it: a chained call there resumes
    with float32 weights and the optimizer's moments, while the pack still carries the small one."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    ckpt = tmp_path / "ckpt"
    assert checkpoint.save_state(ckpt, {"m": model}, {"m": opt}, {"step": 1}, max_bytes=200) == "weights"

    here = torch.nn.Linear(8, 8)
    here_opt = torch.optim.AdamW(here.parameters(), lr=0.1)
    assert checkpoint.load_state(ckpt, {"m": here}, {"m": here_opt})["resume"] == "exact"
    assert torch.equal(here.weight, model.weight)  # float32, bit for bit
    assert here_opt.state_dict()["state"][0]["step"] == 1

    checkpoint.pack(ckpt, tmp_path / "out", "ckpt")
    travelled = checkpoint.unpack(tmp_path / "out", "ckpt", tmp_path / "there")
    assert not (travelled / checkpoint.LOCAL).exists() and (travelled / "state.pt").is_file()
    there = torch.nn.Linear(8, 8)
    there_opt = torch.optim.AdamW(there.parameters(), lr=0.1)
    assert checkpoint.load_state(travelled, {"m": there}, {"m": there_opt})["resume"] == "weights"
    assert torch.equal(there.weight, model.weight.to(torch.bfloat16).float()) and not there_opt.state_dict()["state"]

    # a later save that fits exact leaves no stale local state behind
    assert checkpoint.save_state(ckpt, {"m": model}, {"m": opt}, {"step": 2}) == "exact"
    assert not (ckpt / checkpoint.LOCAL).exists()


def test_a_pack_cut_short_is_no_pack(tmp_path, monkeypatch):
    """Packing over an earlier pack removes its hash file first and writes the new one last: a
    pack killed half-way (a call's limit) leaves no hash, and collect does not take its parts
    for a checkpoint."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(np.random.default_rng(0).bytes(2500))
    checkpoint.pack(src, tmp_path / "out", "thing", part_bytes=1000)
    assert checkpoint.find_packed(tmp_path / "out") == ["thing"]
    written = []
    real = Path.write_bytes

    def dies_on_the_second_part(self, data):
        written.append(self.name)
        if len(written) == 2:
            raise KeyboardInterrupt("killed")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", dies_on_the_second_part)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.pack(src, tmp_path / "out", "thing", part_bytes=1000)
    assert checkpoint.find_packed(tmp_path / "out") == []


def test_kept_packs_live_in_history_not_in_the_tree_and_come_back(tmp_path):
    """keep: the packs reachable from HEAD through a merge whose tree is HEAD's (a checkout, and
    a device call, carries none of them; the index and uncommitted changes stay); restore, in a
    clone with no .voice/, files them as collect does."""
    from recipes.voice.keep import KeepError, keep, restore

    def git(repo, *args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "README").write_text("x\n")
    git(repo, "add", "README")
    git(repo, "commit", "-q", "-m", "first")
    (repo / "README").write_text("uncommitted\n")
    src = tmp_path / "lm-state"
    src.mkdir()
    (src / "state.pt").write_bytes(np.random.default_rng(1).bytes(5000))
    (src / "recipe.json").write_text('{"stage": "lm"}')
    voice = repo / ".voice"
    checkpoint.pack(src, voice / "lm", "lm", part_bytes=2000)
    with pytest.raises(KeepError, match="no codec.sha256"):
        keep(["codec"], voice, repo)
    first = git(repo, "rev-parse", "HEAD")

    merge = keep(["lm"], voice, repo, note="lm step 3")
    assert git(repo, "rev-parse", "HEAD") == merge and git(repo, "rev-parse", "main") == merge
    assert git(repo, "rev-parse", f"{merge}^1") == first
    assert git(repo, "rev-parse", f"{merge}^{{tree}}") == git(repo, "rev-parse", f"{first}^{{tree}}")
    assert git(repo, "log", "-1", "--format=%s") == "voice: keep lm (lm step 3)"
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == "M README"  # untouched
    assert (repo / "README").read_text() == "uncommitted\n"

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    assert not (clone / "voice-kept").exists() and not (clone / ".voice").exists()
    assert restore(clone / ".voice", clone) == ["lm"]
    back = clone / ".voice" / "unpacked" / "lm"
    assert (back / "state.pt").read_bytes() == (src / "state.pt").read_bytes()
    assert sorted(p.name for p in (clone / ".voice" / "lm").iterdir()) == sorted(p.name for p in (voice / "lm").iterdir())

    # a later keep of another pack: restore files the newest of each name (the LM from the older
    # merge), or with a commit only that merge's
    (src / "state.pt").write_bytes(np.random.default_rng(2).bytes(3000))
    checkpoint.pack(src, voice / "extra", "extra", part_bytes=2000)
    later = keep(["extra"], voice, repo, note="another pack")
    clone2 = tmp_path / "clone2"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone2)], check=True)
    assert sorted(restore(clone2 / ".voice", clone2)) == ["extra", "lm"]
    assert (clone2 / ".voice" / "unpacked" / "lm" / "state.pt").read_bytes() == (back / "state.pt").read_bytes()
    assert (clone2 / ".voice" / "unpacked" / "extra" / "state.pt").read_bytes() == (src / "state.pt").read_bytes()
    assert restore(tmp_path / "only", clone2, commit=later) == ["extra"]
    merge = later

    # a damaged part is refused before anything is committed
    part = voice / "lm" / "lm.tar.part01"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(checkpoint.CheckpointError):
        keep(["lm"], voice, repo)
    assert git(repo, "rev-parse", "HEAD") == merge


# -- LM: batches, logits, export ----------------------------------------------------------------------


def fake_codes(path: Path, K: int, C: int, items: list[tuple[str, int]], seed: int = 0, phonemes: bool = False) -> str:
    """A codes directory (what codes.extract writes) of random codes, the same in both splits
    (``phonemes``: with the texts' phonemes, as the data records them)."""
    from recipes.voice.codes import write_split
    from speechctl.phonemes import phonemize

    path.mkdir(parents=True, exist_ok=True)
    for name in ("train", "heldout"):
        rng = np.random.default_rng(seed)
        codes = [rng.integers(0, C, (K, frames)) for _, frames in items]
        write_split(path, name, np.concatenate(codes, axis=1), [t for t, _ in items], [c.shape[1] for c in codes],
                    phonemes=[phonemize(t) for t, _ in items] if phonemes else None)
    return "c" * 64


def fake_codec_model(path: Path, recipe) -> Path:
    import transformers

    torch.manual_seed(0)
    model = transformers.DacModel(recipe.codec.dac_config()).eval()
    model.to(torch.float16).save_pretrained(path)
    checkpoint.write_record(path, {"stage": "codec", "recipe": recipe.to_dict()})
    return path


ITEMS = [("Hi.", 5), ("Hello world, again!", 9), ("Ünïcödé ✓", 3), ("A", 1)]


@pytest.fixture(scope="module")
def lm_parts(tmp_path_factory):
    """A tiny LM trainer on random codes, its checkpoint and its export (float32 weights)."""
    from recipes.voice.lm import LMTrainer
    from recipes.voice.stages import run_export

    tmp = tmp_path_factory.mktemp("lm")
    recipe = tiny_recipe(delays=[0, 2, 3, 5])
    recipe.lm_train = replace(recipe.lm_train, bare_text_share=0.5)
    K, C = recipe.codec.n_codebooks, recipe.codec.codebook_size
    sha = fake_codes(tmp / "codes", K, C, ITEMS)
    trainer = LMTrainer(recipe, tmp / "codes", tmp / "work", "cpu", sha, log=lambda line: None)
    trainer.train(1e12, max_steps=2)
    trainer.save(tmp / "lm")
    codec_model = fake_codec_model(tmp / "codec-model", recipe)
    model_dir = run_export(tmp / "lm", codec_model, tmp / "model")
    return trainer, model_dir


def test_compare_reading_trains_the_same_lm_on_letters_and_on_phonemes(tmp_path):
    """``compare-reading``: one set of speech and codes, two LMs from the same seed, one reading
    the text's bytes and one its phonemes; the JSON holds both curves and what they trained on."""
    from recipes.voice.compare_reading import compare

    codec_model = fake_codec_model(tmp_path / "codec-model", tiny_recipe())
    lines = []
    record = compare(codec_model, tmp_path / "work", tmp_path / "out", hours=0.01, steps=2, batch_tokens=2048,
                     threads=1, command="test", log=lines.append)
    assert json.loads((tmp_path / "out" / "compare-reading.json").read_text()) == json.loads(json.dumps(record))
    text, phonemes = record["runs"]["text"], record["runs"]["phonemes"]
    assert text["train_utterances"] == phonemes["train_utterances"] > 0
    for run in (text, phonemes):
        assert run["heldout"][-1]["step"] == 2 and math.isfinite(run["heldout"][-1]["heldout_loss"])
    assert text["heldout"] != phonemes["heldout"]  # the same codes, read from other text
    assert record["recipe"]["lm_train"]["text_input"] == "phonemes" and record["lm"]["hidden_size"] == 128
    assert "| 2 |" in lines[-1]  # the table's last row


def test_attention_dropout_acts_in_training_only(tmp_path):
    """``lm_train.attention_dropout`` reaches the model's attention while it trains (two forward
    passes differ) and not its evaluation (they agree), nor the checkpoint it exports."""
    from recipes.voice.lm import LMTrainer, stream_loss

    recipe = tiny_recipe()
    recipe.lm_train = replace(recipe.lm_train, attention_dropout=0.5)
    K, C = recipe.codec.n_codebooks, recipe.codec.codebook_size
    sha = fake_codes(tmp_path / "codes", K, C, ITEMS)
    trainer = LMTrainer(recipe, tmp_path / "codes", tmp_path / "work", "cpu", sha, log=lambda line: None)
    assert trainer.model.config.attention_dropout == 0.5
    ids, length = next(iter(trainer.heldout.epoch(10**6, 0, 0)))
    batch = trainer.heldout.batch(torch.from_numpy(ids), length)

    def loss() -> float:
        with torch.no_grad():
            return float(stream_loss(trainer.model, batch, trainer.allowed, trainer.stream_weights)[0])

    assert loss() != loss()
    trainer.model.eval()
    assert loss() == loss()
    assert json.loads((trainer.skeleton / "config.json").read_text()).get("attention_dropout", 0.0) == 0.0


def test_an_lm_log_line_is_the_mean_of_the_steps_its_window_had(tmp_path):
    """As the codec's: a resumed run's first window is shorter than log_every, and its line is the
    mean loss of the steps it had, not their sum over log_every."""
    from recipes.voice.lm import LMTrainer

    recipe = tiny_recipe()
    recipe.lm_train = replace(recipe.lm_train, log_every=4, eval_every=10**6)
    K, C = recipe.codec.n_codebooks, recipe.codec.codebook_size
    sha = fake_codes(tmp_path / "codes", K, C, ITEMS)
    trainer = LMTrainer(recipe, tmp_path / "codes", tmp_path / "work", "cpu", sha, log=lambda line: None)
    trainer.step = 2  # as if resumed at step 2: the first window holds steps 3 and 4
    losses, forward = [], trainer.forward

    def recorded(*args, **kwargs):
        out = forward(*args, **kwargs)
        losses.append(float(out[0]))
        return out

    trainer.forward = recorded
    trainer.evaluate = lambda: {}
    trainer.train(1e12, max_steps=2)
    (row,) = [h for h in trainer.history if "loss" in h]
    assert row["step"] == 4 and len(losses) == 2
    assert row["loss"] == pytest.approx(sum(losses) / 2, abs=1e-4)


def test_lm_batch_is_what_the_engine_feeds(lm_parts):
    """Inputs and targets against speechctl's own prompt builder, tokenizer and DelayPattern."""
    from transformers import AutoTokenizer

    from speechctl.engine.streams import StreamSpec
    from speechctl.models.generic.prompts import MultiStreamPrompts

    trainer, model_dir = lm_parts
    config = json.loads((model_dir / "config.json").read_text())
    spec = StreamSpec.from_dict(config["speechctl"])
    prompts = MultiStreamPrompts(spec, AutoTokenizer.from_pretrained(model_dir))
    pattern = spec.pattern
    examples = trainer.train_set
    L = 64
    batch = examples.batch(torch.arange(len(ITEMS)), L)
    K, lead = pattern.num_streams, pattern.lead
    assert examples.text != [t for t, _ in ITEMS]  # some are read bare ("hi" for "Hi.")
    for i, (sentence, frames) in enumerate(ITEMS):
        sentence = examples.text[i]
        ids = prompts.tts(sentence).prompt_ids
        P = len(ids)
        steps = pattern.build(examples.codes[:, int(examples.code_start[i]):][:, :frames].numpy())  # [K, S]
        S = steps.shape[1]
        end = P + S - 1
        assert batch["primary"][i, :P].tolist() == ids
        assert batch["primary"][i, P:end].tolist() == [spec.audio_id] * (S - 1)
        assert (batch["aux"][i, :P] == pattern.pad).all()
        assert batch["aux"][i, P:end].T.tolist() == steps[:, : S - 1].tolist()
        assert batch["target"][i, P - 1:end].T.tolist() == steps.tolist()
        weight = batch["weight"][i].numpy()
        expected = np.zeros((L, K), bool)
        expected[P - 1:end] = pattern.code_mask(frames).T
        expected[P - 1 + frames + pattern.delays[lead], lead] = True  # the lead stream's EOS
        assert (weight == expected).all()
        assert not batch["weight"][i, end:].any()


def test_a_dropped_text_is_the_engines_unconditional_prompt(lm_parts):
    """text_dropout trains rows whose prompt is what speechctl's CFG pair gives the
    unconditional member (MultiStreamPrompts.unconditional), with the same audio targets and no
    text for the guided attention to read; the rows dropped are a function of (seed, step)."""
    from dataclasses import replace as replaced

    from transformers import AutoTokenizer

    from speechctl.engine.params import Guidance
    from speechctl.engine.streams import StreamSpec
    from speechctl.models.generic.prompts import MultiStreamPrompts

    trainer, model_dir = lm_parts
    spec = StreamSpec.from_dict(json.loads((model_dir / "config.json").read_text())["speechctl"])
    prompts = MultiStreamPrompts(spec, AutoTokenizer.from_pretrained(model_dir))
    examples, L = trainer.train_set, 64
    ids = torch.arange(len(ITEMS))
    dropped = torch.tensor([i % 2 == 1 for i in range(len(ITEMS))])
    plain, batch = examples.batch(ids, L), examples.batch(ids, L, dropped)
    for i in range(len(ITEMS)):
        request = prompts.tts(examples.text[i], guidance=Guidance(scale=2.0))
        P = len(request.prompt_ids)
        expected = request.uncond_prompt_ids if dropped[i] else request.prompt_ids
        assert batch["primary"][i, :P].tolist() == expected
        assert batch["primary"][i, P:].tolist() == plain["primary"][i, P:].tolist()
    for name in ("aux", "target", "weight"):
        assert torch.equal(batch[name], plain[name]), name
    if "gold" in batch:
        assert (batch["gold"][dropped] < 0).all() and torch.equal(batch["gold"][~dropped], plain["gold"][~dropped])

    assert trainer._dropped(8) is None  # off by default
    saved = trainer.cfg, trainer.step  # (the trainer is the module's)
    try:
        trainer.cfg = replaced(trainer.cfg, text_dropout=0.5)
        trainer.step = 7
        first = trainer._dropped(64)
        assert torch.equal(first, trainer._dropped(64)) and 8 < int(first.sum()) < 56
        trainer.step = 8
        assert not torch.equal(first, trainer._dropped(64))
    finally:
        trainer.cfg, trainer.step = saved


def test_lm_logits_match_the_reference_on_the_exported_checkpoint(lm_parts):
    """Teacher-forced logits of the training model = tests/reference.py's model reading the
    exported checkpoint, position by position; the reference accepts the target layout as the
    engine's own (forced rule tokens must match its rules)."""
    from reference import ReferenceModel, RefRequest

    trainer, model_dir = lm_parts
    ref = ReferenceModel(model_dir)
    lay = trainer.layout
    model = trainer.model.eval()
    for i, (_, frames) in enumerate(ITEMS[:2]):
        sentence = trainer.train_set.text[i]
        length = lay.length(len(sentence.encode()), frames)
        batch = trainer.train_set.batch(torch.tensor([i]), length)
        with torch.no_grad():
            logits = model.aux_logits(model.hidden(batch["primary"], batch["aux"]))[0]  # [L, K, Va]
        primary, aux = batch["primary"][0].tolist(), batch["aux"][0].tolist()
        P = len(sentence.encode()) + 3
        for pos in range(P - 1, length):
            _, ref_aux = ref._logits(primary[: pos + 1], aux[: pos + 1])
            assert torch.allclose(logits[pos], ref_aux, atol=2e-4), f"position {pos}"
        target = batch["target"][0, P - 1:].tolist()
        forced_ids = [ref.audio] * len(target) + [ref.audio_eos]
        forced_aux = np.array(target + [[ref.PAD] * ref.K])
        req = RefRequest(prompt_ids=primary[:P], audio_items=[], max_tokens=len(forced_ids) + 1,
                         stop_ids=(ref.audio_eos,), starts_in_audio=True)
        ids, _ = ref.generate(req, forced=(forced_ids, forced_aux))  # raises if a rule token differs
        assert ids[-1] == ref.audio_eos and len(ids) == len(forced_ids)


def test_export_is_speechctls_layout(lm_parts):
    from safetensors.torch import load_file

    from speechctl.models.catalog import resolve_checkpoint, resolve_model

    trainer, model_dir = lm_parts
    assert resolve_model(str(model_dir)) == model_dir
    weights = load_file(str(model_dir / "model.safetensors"))
    K, Va, H = trainer.layout.K, trainer.layout.Va, trainer.model.config.hidden_size
    assert weights["audio_embed.weight"].shape == (K * Va, H) == weights["audio_head.weight"].shape
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(weights[k], v.float()), k
    checkpoint = resolve_checkpoint(str(model_dir))
    assert (checkpoint.codec_dir / "model.safetensors").is_file()
    # the voice's own longest piece of text (export.MAX_PIECE_CHARS), which Speech cuts text to
    from recipes.voice.export import MAX_PIECE_CHARS
    from speechctl.api import Speech

    assert checkpoint.defaults.max_piece_chars == MAX_PIECE_CHARS
    assert Speech.max_piece_chars.fget(types.SimpleNamespace(checkpoint=checkpoint)) == MAX_PIECE_CHARS
    # readable by every user (safetensors writes 0600), as anything pip installs
    assert all(f.stat().st_mode & 0o444 == 0o444 for f in model_dir.rglob("*") if f.is_file())
    # the committed voice prompt's codes are the shipped codec's, not this one's: left out
    assert "voice_prompt" not in json.loads((model_dir / "config.json").read_text())["speechctl"]


def test_a_checkpoints_longest_piece_is_read_from_its_config():
    """speechctl.max_piece_chars in a multi-stream checkpoint's config.json (what export writes)
    is its default longest piece; a value that is not a positive integer is refused by name."""
    from speechctl.errors import ModelError
    from speechctl.models.catalog import describe_defaults
    from speechctl.models.generic.family import FAMILY

    assert FAMILY.defaults(None, {"speechctl": {}}).max_piece_chars is None
    assert "pieces of at most 80 characters" in describe_defaults(FAMILY.defaults(None, {"speechctl": {"max_piece_chars": 80}}))
    assert FAMILY.defaults({"do_sample": True, "top_k": 7}, {"speechctl": {"max_piece_chars": 80}}).max_piece_chars == 80
    for bad in (0, "80", 1.5, True):
        with pytest.raises(ModelError, match="max_piece_chars"):
            FAMILY.defaults(None, {"speechctl": {"max_piece_chars": bad}})


def test_a_voice_samples_repetition_aware_where_its_generation_config_says():
    """The voice's generation_config.json may set Higgs' repetition-aware fields (the export's
    sampling does): the multi-stream family reads them as Higgs' does; absent, none."""
    from speechctl.models.generic.family import FAMILY
    from speechctl.models.higgs.family import FAMILY as HIGGS

    generation = {"do_sample": True, "temperature": 0.3, "top_k": 10, "ras_win_len": 5, "ras_win_max_num_repeat": 1}
    defaults = FAMILY.defaults(generation, {"speechctl": {"max_piece_chars": 80}})
    assert defaults.repetition == (5, 1) and defaults.max_piece_chars == 80 and defaults.audio.top_k == 10
    assert HIGGS.defaults(generation).repetition == defaults.repetition
    assert FAMILY.defaults({"do_sample": True}, {}).repetition is None and FAMILY.defaults(None, {}).repetition is None


@pytest.mark.engine
@needs_espeak
def test_round_trip_table_hears_the_synthesizer_and_runs_the_voice(lm_parts, tmp_path):
    """``eval-voice`` (issue 20's table) on a tiny exported voice: espeak-ng's own held-out audio
    is transcribed well by Whisper (the table measures something), its codec reconstruction and
    the (random) voice get rows of their own, one per sampling setting (one with classifier-free
    guidance: pairs through the engine; at scale 0 the unconditional member's logits alone, which
    differ from the text's even for a random voice); the files are written."""
    from recipes.voice.evaluate import eval_voice

    _, model_dir = lm_parts
    report = eval_voice(model_dir, tmp_path / "data", tmp_path / "out", limit=2, samplings=((0.8, 5), (0.0, 1), (0.0, 1, 0.0)),
                        keep_wavs=1, command="python -m recipes.voice eval-voice ...")
    rows = report["rows"]
    assert [r["audio"].split(",")[0] for r in rows] == [
        "espeak-ng (the training synthesizer)", "espeak-ng through the voice's codec"] + ["speechctl's voice"] * 3
    assert rows[4]["audio"].endswith(", CFG 0") and rows[4]["cfg_scale"] == 0.0 and rows[3]["cfg_scale"] == 1.0
    # "The quick brown fox ..." and "Hello world." as espeak-ng says them: tiny.en hears the fox
    # and may hear "Hello world." as "The Lord World." (2-3 errors of 11 words; a table that
    # measured nothing would read most words wrong)
    assert rows[0]["wer"] <= 0.5 and rows[0]["wer"] < min(r["wer"] for r in rows[2:])  # (the voice: random)
    assert all(r["wer"] >= 0 for r in rows) and rows[2]["seconds_of_audio"] > 0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| speechctl's voice, temperature 0, top-k 1 |" in table and "eval-voice" in table
    greedy, guided = ((tmp_path / "out" / f"000-voice-t0-k1{name}.wav").read_bytes() for name in ("", "-cfg0"))
    assert (tmp_path / "out" / "000-voice-t0.8-k5.wav").is_file() and greedy != guided  # the guidance was applied

    # settings are chosen on sentences past the reported ones: --first; repetition-aware sampling
    # rows beside each sampling row (off, and a window of 3 with 2 repeats)
    later = eval_voice(model_dir, tmp_path / "data", tmp_path / "later", limit=1, samplings=((0.0, 1),), keep_wavs=0,
                       first=1, repetitions=((0, 0), (3, 2)))
    assert later["first"] == 1 and later["utterances"] == 1
    assert [r["repetition"] for r in later["rows"][2:]] == [[0, 0], [3, 2]]
    assert later["rows"][3]["audio"].endswith("repetition-aware 3/2")
    heard = json.loads((tmp_path / "later" / "transcripts.json").read_text())
    assert [h["text"] for h in heard] == [json.loads((tmp_path / "out" / "transcripts.json").read_text())[1]["text"]]
    with pytest.raises(ValueError, match="first sentence 99"):
        eval_voice(model_dir, tmp_path / "data", tmp_path / "bad", limit=1, first=99)


def test_eval_voice_reads_its_repetition_rows():
    from recipes.voice.__main__ import repetition_row

    assert repetition_row("7:2") == (7, 2) and repetition_row("off") == (0, 0) and repetition_row("voice") is None
    for bad in ("7", "0:2", "x:y", "7:2:1"):
        with pytest.raises(SystemExit, match=f"--repetition '{bad}'"):
            repetition_row(bad)


def test_the_lm_learns_to_read_its_text(tmp_path):
    """A copy task: each character of the text is two frames of codes fixed by (character,
    codebook, frame), so the first codebook of a frame is unknown without reading the text (the
    codes heard so far give at most the second frame of a character: ~0.55 of them). On strings
    never trained on, a 2-layer LM must reach 0.85 in 300 steps (0.93 measured): the text reaches
    the model where the engine puts it, and the recipe's model learns to align audio to it."""
    from copy_task import write_copy_task
    from recipes.voice.lm import LMTrainer

    recipe = tiny_recipe()
    recipe.lm_train = replace(recipe.lm_train, batch_tokens=4096, lr=2e-3, warmup_steps=50, decay_share=0.0,
                              bare_text_share=0.0, log_every=50, eval_every=300)
    path = tmp_path / "codes"
    write_copy_task(path, recipe.codec.n_codebooks, recipe.codec.codebook_size, {"train": 1500, "heldout": 64})
    trainer = LMTrainer(recipe, path, tmp_path / "work", "cpu", "c" * 64, log=lambda line: None)
    trainer.train(1e12, max_steps=300)
    first = trainer.history[-1]["heldout_stream_acc"][0]
    assert first >= 0.85, f"first codebook {first:.3f} on unseen strings: the LM does not read its text"


@pytest.mark.parametrize("text_input", ["text", pytest.param("phonemes", marks=needs_espeak)])
def test_an_overfitted_lm_says_its_utterance_through_speechctl(tmp_path, text_input):
    """Train on one utterance until it is memorized; speechctl's engine (vLLM, greedy) must then
    give back exactly its codes and stop there: teacher forcing and decoding agree, EOS included.
    Then `speechctl tts --model EXPORTED` runs as a user would. A voice that reads phonemes
    (``lm_train.text_input=phonemes``) is given the text, and the engine phonemizes it as the
    data recorded it."""
    from recipes.voice.lm import LMTrainer
    from recipes.voice.stages import run_export
    from speechctl.api import Speech
    from speechctl.engine.engine import EngineConfig
    from speechctl.engine.params import GREEDY

    recipe = tiny_recipe()
    recipe.lm_train = replace(recipe.lm_train, lr=3e-3, warmup_steps=10, decay_share=0.0, bare_text_share=0.0,
                              text_input=text_input)
    K, C = recipe.codec.n_codebooks, recipe.codec.codebook_size
    sentence, frames = "Hello world.", 12
    sha = fake_codes(tmp_path / "codes", K, C, [(sentence, frames)], seed=5,
                     phonemes=text_input == "phonemes")
    trainer = LMTrainer(recipe, tmp_path / "codes", tmp_path / "work", "cpu", sha, log=lambda line: None)
    for _ in range(8):
        trainer.train(1e12, max_steps=50)
        if trainer.history[-1].get("heldout_stream_acc") == [1.0] * K:
            break
    assert trainer.history[-1]["heldout_stream_acc"] == [1.0] * K
    trainer.save(tmp_path / "lm")
    model = run_export(tmp_path / "lm", fake_codec_model(tmp_path / "codec-model", recipe), tmp_path / "model")
    truth = np.load(tmp_path / "codes" / "train.npy").astype(np.int64)

    config = json.loads((model / "config.json").read_text())["speechctl"]
    assert config.get("text_input", "text") == text_input
    from speechctl.models.catalog import describe_model

    assert ("espeak-ng" in describe_model(str(model)).get("reads", "")) == (text_input == "phonemes")  # `speechctl models`
    speech = Speech(model, engine_config=EngineConfig(max_num_seqs=4, max_model_len=256, dtype="float32"))
    try:
        result = speech.tts(sentence, audio_sampling=GREEDY, max_seconds=4.0)
    finally:
        speech.close()
    assert result.codes.tolist() == truth.tolist()

    out = tmp_path / "hello.wav"
    proc = subprocess.run([sys.executable, "-m", "speechctl.cli", "tts", sentence, "--model", str(model), "-o", str(out),
                           "--audio-temperature", "0"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import soundfile as sf

    assert len(sf.read(out)[0]) == frames * recipe.codec.hop_length


@needs_espeak
def test_espeak_data_with_english_alone_speaks_the_corpus_as_the_full_data(tmp_path):
    """The device calls carry espeak-ng's data with English's dictionary alone (the LM's first
    call must fit the vLLM bundle beside it): the recipe's sentences come out byte for byte as
    with the full data, so the training data and its hash stay."""
    from recipes.voice import espeak_bundle

    system = Path(subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout.split("Data at:")[1].strip())
    shutil.copytree(system, tmp_path / "espeak-ng-data")
    removed = espeak_bundle.english_only(tmp_path / "espeak-ng-data")
    assert removed > 2_000_000 and [p.name for p in (tmp_path / "espeak-ng-data").glob("*_dict")] == ["en_dict"]
    corpus = text.make_corpus(replace(DataConfig(), hours=0.05))
    espeak_bundle.same_speech(tmp_path, None, corpus.heldout[:10] + corpus.train[-10:])


def test_the_espeak_bundle_is_rebuilt_with_english_alone_and_the_check_tells_speech_apart(tmp_path, monkeypatch):
    from recipes.voice import espeak_bundle

    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    tree = tmp_path / "tree"
    data = tree / espeak_bundle.DATA_DIR
    data.mkdir(parents=True)
    for name in ("en_dict", "ru_dict", "cmn_dict", "phondata"):
        (data / name).write_bytes(name.encode() * 100)
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN" / "control").write_text("Package: espeak-ng-data\nVersion: 1.51\nArchitecture: amd64\n"
                                             "Maintainer: test <t@example.org>\nDescription: test\n")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    package = bundle / "espeak-ng-data_1.51_amd64.deb"
    subprocess.run(["dpkg-deb", "-b", str(tree), str(package)], check=True, capture_output=True)
    espeak_bundle.trim(bundle)
    listing = subprocess.run(["dpkg-deb", "-c", str(package)], capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1].rsplit("/", 1)[-1] for line in listing.splitlines()}
    assert {"en_dict", "phondata"} <= names and not {"ru_dict", "cmn_dict"} & names
    # the check compares bytes: speech that differs with the two data directories is named
    monkeypatch.setattr(espeak_bundle, "synthesize", lambda sentence, config, data: (np.array([len(str(data))]), 16000))
    with pytest.raises(AssertionError, match="'Hello there.' differently"):
        espeak_bundle.same_speech(tmp_path, None, ["Hello there."])


@needs_espeak
def test_the_voice_prompt_ends_in_a_pause_and_belongs_to_its_codec(tmp_path):
    """``voice-prompt``: espeak-ng's said sentence cut where the next begins, through a codec:
    codes of every codebook, ending in whole frames of pause that lead into the new speech, none
    of the held-out sentences; config.json gets it only for the codec that made it."""
    from recipes.voice.text import make_corpus
    from recipes.voice.voice_prompt import SAID, codec_hash, config_entry, make_voice_prompt
    from speechctl.models.tiny import ensure_tiny

    codec_dir = ensure_tiny() / "codec"
    entry = make_voice_prompt(codec_dir)
    codes = np.asarray(entry["codes"])
    assert codes.shape[0] == json.loads((codec_dir / "config.json").read_text())["n_codebooks"]
    assert 1 <= entry["lead_frames"] < codes.shape[1] and entry["text"] == SAID
    assert entry["made_with"]["seconds"] * 16000 / codes.shape[1] == pytest.approx(320, abs=1)  # whole frames
    assert all(SAID.rstrip(",") not in s for s in make_corpus(DataConfig()).heldout)
    assert config_entry(entry, codec_dir) == {"text": SAID, "codes": entry["codes"], "lead_frames": entry["lead_frames"]}
    other = tmp_path / "other"
    shutil.copytree(codec_dir, other)
    (other / "model.safetensors").write_bytes(b"x" + (other / "model.safetensors").read_bytes())
    assert codec_hash(other) != entry["codec_sha256"] and config_entry(entry, other) is None
