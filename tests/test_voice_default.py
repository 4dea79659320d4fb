"""speechctl's own voice as the default model (issue 20, item 5): an exported voice shipped into
the package's place is what `speechctl tts`, `Speech()` and `speechctl models` take when no model
is named; an install without it falls back to the random `tiny` and says so. The voice here is a
toy export of recipes/voice (random codes, two training steps): what is checked is the shipping and
the default, not how it sounds (tests/test_voice_speaks.py listens to the real one)."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import speechctl.voices as voices  # noqa: E402
from speechctl.errors import ModelError  # noqa: E402
from speechctl.models import catalog  # noqa: E402


@pytest.fixture(scope="module")
def voice_parts(tmp_path_factory):
    """A toy voice's LM checkpoint and codec, as recipes/voice trains them (random codes, two
    steps): (lm, codec_model, recipe)."""
    import torch

    from recipes.voice.lm import LMTrainer
    from test_voice_recipe import fake_codec_model, fake_codes, tiny_recipe

    tmp = tmp_path_factory.mktemp("voice")
    recipe = tiny_recipe()
    recipe.lm_train = replace(recipe.lm_train, bare_text_share=0.0)
    K, C = recipe.codec.n_codebooks, recipe.codec.codebook_size
    sha = fake_codes(tmp / "codes", K, C, [("Hello world.", 8), ("A longer sentence here.", 12)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = LMTrainer(recipe, tmp / "codes", tmp / "work", "cpu", sha, log=lambda line: None)
        trainer.train(1e12, max_steps=2)
        trainer.save(tmp / "lm")
    finally:
        torch.set_num_threads(threads)
    return tmp / "lm", fake_codec_model(tmp / "codec-model", recipe), recipe


@pytest.fixture(scope="module")
def exported_voice(voice_parts):
    """A toy voice as `python -m recipes.voice export` writes it."""
    from recipes.voice.stages import run_export

    lm, codec_model, recipe = voice_parts
    return run_export(lm, codec_model, lm.parent / "model",
                      sampling={"do_sample": True, "temperature": 0.7, "top_k": 20}), recipe


@pytest.fixture
def package_voice(tmp_path, monkeypatch):
    """The package's voice directory, moved to a temporary place (README only, as in a checkout
    before the weights are shipped); no SPEECHCTL_MODEL."""
    place = tmp_path / "voices" / "default"
    place.mkdir(parents=True)
    (place / "README.md").write_text("the shipped voice\n")
    monkeypatch.setattr(voices, "voice_dir", lambda: place)
    monkeypatch.delenv("SPEECHCTL_MODEL", raising=False)
    return place


def test_without_a_shipped_voice_the_default_is_tiny_and_voice_says_why(package_voice):
    assert not voices.is_shipped()
    assert catalog.default_model() == "tiny"
    assert catalog.resolve_checkpoint(None).name == "tiny"
    with pytest.raises(ModelError) as e:
        catalog.resolve_checkpoint("voice")
    message = str(e.value)
    assert "\n" not in message and message.startswith("voice:") and "not in this install" in message
    listed = {m["name"]: m["description"] for m in catalog.list_models()}
    assert listed["voice"].endswith("(not in this install)")


def test_environment_names_the_default(package_voice, monkeypatch, exported_voice):
    model, _ = exported_voice
    monkeypatch.setenv("SPEECHCTL_MODEL", str(model))
    assert catalog.resolve_checkpoint(None).path == model


def test_a_shipped_voice_is_the_default_with_its_own_sampling(package_voice, exported_voice):
    from recipes.voice.export import ship

    model, recipe = exported_voice
    assert ship(model) == package_voice
    assert (package_voice / "README.md").read_text() == "the shipped voice\n"  # kept beside the weights
    assert voices.is_shipped() and catalog.default_model() == "voice"
    checkpoint = catalog.resolve_checkpoint(None)
    assert checkpoint.path == package_voice and checkpoint.name == "voice"
    audio = checkpoint.defaults.audio
    assert (audio.temperature, audio.top_k) == (0.7, 20) and checkpoint.defaults.source == "generation_config.json"
    info = catalog.describe_model(None)
    assert info["name"] == "voice" and info["codebooks"] == recipe.codec.n_codebooks and info["missing"] == "nothing"
    assert info["description"] == catalog.BUILTIN["voice"]
    assert voices.provenance()["made_by"].startswith("recipes/voice")
    step = voices.provenance()["lm"]["step"]
    assert info["made_by"].startswith(f"recipes/voice (speechctl issue 20): LM step {step:,}") and "espeak-ng" in info["made_by"]
    # shipping again replaces the old voice whole, never leaving a half-copied one
    (package_voice / "stale.bin").write_bytes(b"old")
    ship(model)
    assert not (package_voice / "stale.bin").exists() and voices.is_shipped()
    assert not any(p.name.endswith((".partial", ".old")) for p in package_voice.parent.iterdir())


def test_ship_refuses_a_directory_that_is_not_a_voice(package_voice, tmp_path):
    from recipes.voice.export import ship

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="not an exported voice"):
        ship(tmp_path / "half")
    assert sorted(p.name for p in package_voice.iterdir()) == ["README.md"]


@pytest.mark.engine
def test_tts_without_a_model_speaks_with_the_shipped_voice(package_voice, exported_voice, tmp_path, engines_of_this_module):
    from recipes.voice.export import ship
    from speechctl.cli import cli

    model, recipe = exported_voice
    ship(model)
    out, codes = tmp_path / "hello.wav", tmp_path / "hello.npy"
    try:
        result = CliRunner().invoke(cli, ["tts", "Hello world.", "-o", str(out), "--codes-out", str(codes),
                                          "--max-seconds", "0.5"], catch_exceptions=False)
    finally:
        from speechctl import api

        api.close_shared()  # the CLI's engine for "no model" is the voice's: not for later tests
    assert result.exit_code == 0, result.stderr
    assert "noise" not in result.stderr  # the voice is no random model
    wave, rate = sf.read(out)
    generated = np.load(codes)
    assert rate == recipe.data.sample_rate and generated.shape[0] == recipe.codec.n_codebooks
    assert len(wave) == generated.shape[1] * recipe.codec.hop_length
    described = CliRunner().invoke(cli, ["models"], catch_exceptions=False)
    assert "voice" in described.stdout and "not in this install" not in described.stdout
    assert json.loads((package_voice / "generation_config.json").read_text())["top_k"] == 20


def test_make_install_ships_the_newest_kept_voice_once(package_voice, voice_parts, monkeypatch, tmp_path):
    """`make install`'s voice step (``ship_kept``): the newest keep merge's LM and codec exported
    into the package, recorded; a no-op while that merge is the newest; again after a new keep;
    without git history a note and the random default, the shipped voice untouched."""
    from recipes.voice import export as export_module, keep
    from recipes.voice.keep import ship_kept

    lm, codec_model, _ = voice_parts
    merges, restored, lines = ["a" * 40], [], []

    def restore(root, repo, commit=None):  # keep.restore itself: test_voice_recipe's keep test
        restored.append(root)
        shutil.copytree(lm, root / "unpacked" / "lm")
        shutil.copytree(codec_model, root / "unpacked" / "codec-model")
        return ["codec", "lm"]

    monkeypatch.setattr(keep, "keep_merges", lambda repo: list(merges))
    monkeypatch.setattr(keep, "restore", restore)
    assert not voices.is_shipped() and catalog.default_model() == "tiny"
    assert ship_kept(tmp_path, log=lines.append) == package_voice
    assert voices.is_shipped() and voices.provenance()["kept"] == "a" * 40 and len(restored) == 1
    assert (package_voice / "README.md").read_text() == "the shipped voice\n"
    assert catalog.default_model() == "voice" and voices.unavailable() is None
    assert lines[-1].startswith("speechctl's voice (keep aaaaaaaaaa)")
    assert ship_kept(tmp_path, log=lines.append) == package_voice and len(restored) == 1  # current: nothing done
    merges.insert(0, "b" * 40)
    ship_kept(tmp_path, log=lines.append)
    assert len(restored) == 2 and voices.provenance()["kept"] == "b" * 40
    # new export defaults (a better sampling found after the keep) ship it again
    monkeypatch.setattr(export_module, "SAMPLING", {**export_module.SAMPLING, "top_k": 7})
    ship_kept(tmp_path, log=lines.append)
    assert len(restored) == 3 and catalog.resolve_checkpoint(None).defaults.audio.top_k == 7
    ship_kept(tmp_path, log=lines.append)
    assert len(restored) == 3

    def no_history(repo):
        raise keep.KeepError("git log --merges: not a git repository")

    monkeypatch.setattr(keep, "keep_merges", no_history)
    assert ship_kept(tmp_path, log=lines.append) is None
    assert lines[-1].startswith("note: ") and "random `tiny`" in lines[-1] and "\n" not in lines[-1]
    assert voices.provenance()["kept"] == "b" * 40  # what was shipped stays


def test_a_voice_that_reads_phonemes_without_espeak_ng_is_not_the_default(package_voice, exported_voice, monkeypatch,
                                                                           engines_of_this_module):
    """A shipped voice that reads espeak-ng's phonemes where libespeak-ng is missing: the default
    falls back to `tiny`, and the CLI's notice says why in one line."""
    from recipes.voice.export import ship
    from speechctl import phonemes
    from speechctl.cli import cli

    model, _ = exported_voice
    ship(model)
    config = json.loads((package_voice / "config.json").read_text())
    config["speechctl"]["text_input"] = "phonemes"
    (package_voice / "config.json").write_text(json.dumps(config))

    def missing():
        raise OSError("libespeak-ng.so.1: cannot open shared object file")

    monkeypatch.setattr(phonemes, "load_library", missing)
    why = voices.unavailable()
    assert why is not None and "install espeak-ng" in why and "\n" not in why
    assert catalog.default_model() == "tiny"
    try:
        result = CliRunner().invoke(cli, ["tts", "Hi.", "-o", str(package_voice.parent / "hi.wav"), "--max-seconds", "0.2"],
                                    catch_exceptions=False)
    finally:
        from speechctl import api

        api.close_shared()
    assert result.exit_code == 0, result.stderr
    notice = [line for line in result.stderr.splitlines() if "noise" in line]
    assert len(notice) == 1 and "install espeak-ng" in notice[0] and "`tiny`" in notice[0]
