"""Published checkpoints exactly as downloaded (issue 19): tiny repos laid out file for file as
sesame/csm-1b and bosonai/higgs-audio-v2-generation-3B-base are (``tests/published.py``), run
through ``speechctl tts --model`` with no flags, equal transformers' greedy tokens
(``from_pretrained(dir)`` + ``generate``); ``--model ORG/NAME`` offline from a hub cache laid out
as the hub lays it out; ``speechctl models`` says what it uses and what is missing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from published import GREEDY_CONFIG, bosonai_like, into_hub_cache, sesame_like
from speechctl.engine.requests import StreamOutput

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("hf-hub")


@pytest.fixture(autouse=True)
def offline_hub(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def sesame_dir(tmp_path_factory):
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    path = create_csm_checkpoint(tmp_path_factory.mktemp("sesame") / "csm-1b", CsmRecipe(seed=2))
    return sesame_like(path, generation=GREEDY_CONFIG)


@pytest.fixture(scope="module")
def bosonai_dir(tmp_path_factory, hub_cache):
    from speechctl.models.higgs.checkpoint import HiggsRecipe, create_higgs_checkpoint

    path = create_higgs_checkpoint(tmp_path_factory.mktemp("bosonai") / "higgs-3b", HiggsRecipe(seed=1))
    return bosonai_like(path, hub_cache, generation=GREEDY_CONFIG)


@pytest.fixture(autouse=True, scope="module")
def _close_engines():
    yield
    from speechctl import api

    api.close_shared()


def run_cli(*args):
    from speechctl.cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return result


def tts_codes(tmp_path, model, text) -> np.ndarray:
    """``speechctl tts TEXT --model MODEL`` with no sampling flags: the codes it wrote [K, T]."""
    codes = tmp_path / f"{abs(hash((str(model), text)))}.npy"
    result = run_cli("tts", text, "--model", model, "-o", tmp_path / "out.wav", "--codes-out", codes)
    assert result.exit_code == 0, result.output
    return np.load(codes)


def prompt_of(path, text):
    """(checkpoint, its prompt builder, the request ``tts`` makes with no flags: the default
    length, 20 s at the codec's frame rate)."""
    from transformers import AutoTokenizer

    from speechctl.codecs import load_codec
    from speechctl.models.families import open_checkpoint
    from speechctl.models.family import DEFAULT_MAX_SECONDS

    checkpoint = open_checkpoint(path)
    builder = checkpoint.prompt_builder(AutoTokenizer.from_pretrained(checkpoint.engine_dir))
    frames = int(np.ceil(DEFAULT_MAX_SECONDS * load_codec(checkpoint.codec_dir).frame_rate))
    return checkpoint, builder, builder.tts(text, max_frames=frames, tag="t")


def test_sesame_layout_runs_as_downloaded_and_equals_transformers(sesame_dir, tmp_path):
    from transformers import CsmForConditionalGeneration

    from test_csm import ended_at, hf_generate

    checkpoint, builder, request = prompt_of(sesame_dir, "Hello there.")
    weights = checkpoint.weights
    assert weights.chosen == ("transformers-00001-of-00002.safetensors", "transformers-00002-of-00002.safetensors")
    assert set(weights.ignored) == {"model.safetensors", "ckpt.pt"}
    codes = tts_codes(tmp_path, sesame_dir, "Hello there.")
    model = CsmForConditionalGeneration.from_pretrained(sesame_dir).eval().float()  # transformers' own choice of files
    frames = hf_generate(model, checkpoint.spec, [request], [[]], request.max_tokens)["t"]
    end = ended_at(frames, checkpoint.spec.rules.eos_frame)
    frames = frames[: request.max_tokens if end is None else end + 1]  # what transformers generated, end frame included
    (expected,) = builder.audio_segments(StreamOutput("t", [], frames, "stop"))
    np.testing.assert_array_equal(codes, expected)


def test_bosonai_layout_with_its_codec_in_the_hub_cache_equals_transformers(bosonai_dir, tmp_path):
    from transformers import HiggsAudioV2ForConditionalGeneration

    from test_higgs_audio_v2 import hf_generate

    checkpoint, builder, request = prompt_of(bosonai_dir, "Hello there.")
    assert checkpoint.weights.chosen == ("model.safetensors",)
    assert checkpoint.weights.ignored == ("model.safetensors.index.json",)  # the stale index
    assert "hub id bosonai/higgs-audio-v2-tokenizer" in checkpoint.codec.found
    assert not (bosonai_dir / "audio_tokenizer").exists()
    codes = tts_codes(tmp_path, bosonai_dir, "Hello there.")
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(bosonai_dir).eval().float()
    ids, aux = hf_generate(model, checkpoint.spec, [request])["t"]
    (expected,) = builder.audio_segments(StreamOutput("t", ids, aux, "stop"))
    np.testing.assert_array_equal(codes, expected)


def test_model_by_hub_id_offline_and_what_is_missing(sesame_dir, hub_cache, tmp_path):
    into_hub_cache(hub_cache, "sesame/csm-1b", sesame_dir)
    by_dir = tts_codes(tmp_path, sesame_dir, "Same text.")
    by_id = tts_codes(tmp_path, "sesame/csm-1b", "Same text.")
    np.testing.assert_array_equal(by_id, by_dir)

    described = run_cli("models", "sesame/csm-1b")
    assert described.exit_code == 0, described.output
    text = " ".join(described.output.split())
    for expected in ("csm", "transformers-00001-of-00002.safetensors", "ckpt.pt, model.safetensors",
                     "context_limit 2048", "missing nothing"):
        assert expected in text, (expected, described.output)

    result = run_cli("tts", "Hi", "--model", "sesame/not-downloaded", "-o", tmp_path / "x.wav")
    assert result.exit_code != 0
    assert "not in the Hugging Face cache" in result.output and "huggingface-cli download sesame/not-downloaded" in result.output


def test_a_missing_shard_or_only_original_weights_is_one_line(sesame_dir, tmp_path):
    from speechctl.errors import ModelError
    from speechctl.models.families import open_checkpoint

    broken = tmp_path / "broken"
    shutil.copytree(sesame_dir, broken)
    (broken / "transformers-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelError, match="transformers-00002-of-00002.safetensors"):
        open_checkpoint(broken).weights
    described = run_cli("models", broken)
    assert described.exit_code == 0 and "transformers-00002-of-00002.safetensors" in " ".join(described.output.split())

    original = tmp_path / "original"
    shutil.copytree(sesame_dir, original)
    config = json.loads((original / "config.json").read_text())
    del config["transformers_weights"]
    (original / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="Sesame's original weight names"):
        open_checkpoint(original).weights


def test_generation_defaults_come_from_the_checkpoint(tmp_path):
    from speechctl.engine.params import Sampling
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint
    from speechctl.models.families import open_checkpoint
    from speechctl.models.higgs.checkpoint import HiggsRecipe, create_higgs_checkpoint

    csm = open_checkpoint(sesame_like(create_csm_checkpoint(tmp_path / "csm", CsmRecipe())))  # sesame's own config
    assert csm.defaults.audio == Sampling(0.9, 50) and csm.defaults.depth == Sampling(0.9, 50)
    assert csm.defaults.max_frames == 125
    higgs = open_checkpoint(bosonai_like(create_higgs_checkpoint(tmp_path / "higgs", HiggsRecipe()), tmp_path / "hub"))
    assert higgs.defaults.repetition == (7, 2) and higgs.defaults.audio == Sampling(1.0, 50, 0.95)
    assert higgs.context_limit == 2048


def test_transformers_defaults_are_transformers_own():
    from transformers import GenerationConfig

    from speechctl.models.family import TRANSFORMERS_DEFAULTS

    own = GenerationConfig._get_default_generation_params()
    assert {k: own[k] for k in TRANSFORMERS_DEFAULTS} == TRANSFORMERS_DEFAULTS


def test_context_limit_is_the_checkpoints():
    from speechctl.engine.config import EngineConfig
    from speechctl.errors import EngineError

    assert EngineConfig().for_checkpoint(2048).max_model_len == 2048
    assert EngineConfig().for_checkpoint(131072).max_model_len == 4096
    assert EngineConfig(max_model_len=512).for_checkpoint(2048).max_model_len == 512
    with pytest.raises(EngineError, match="exceeds the checkpoint's 2048 positions"):
        EngineConfig(max_model_len=4096).for_checkpoint(2048)


def test_dia_and_musicgen_defaults_are_their_generation_configs(tmp_path):
    """The published generation configs (nari-labs/Dia-1.6B-0626: sampling at 1.2 / top-k 45 /
    top-p 0.95 with guidance 3; facebook/musicgen-small: sampling, guidance 3, max_length 1500)
    as speechctl's defaults; lengths as each family's ``generate`` counts them; ``--cfg`` in
    the family's own convention."""
    from speechctl.engine.params import Guidance, Sampling
    from speechctl.errors import InputError
    from speechctl.models.dia.family import FAMILY as DIA
    from speechctl.models.family import Checkpoint
    from speechctl.models.musicgen.family import FAMILY as MUSICGEN

    dia_config = {"delay_pattern": [0, 8, 9, 10, 11, 12, 13, 14, 15]}
    published = {"do_sample": True, "temperature": 1.2, "top_k": 45, "top_p": 0.95, "guidance_scale": 3.0}
    dia = DIA.defaults(published, dia_config)
    assert dia.audio == Sampling(1.2, 45, 0.95) and dia.guidance == Guidance(3.0, "audio", 45) and dia.max_frames is None
    assert DIA.defaults({**published, "max_new_tokens": 42}, dia_config).max_frames == 26
    assert DIA.defaults({**published, "max_length": 40}, dia_config).max_frames == 39
    assert DIA.defaults({"do_sample": True, "temperature": 0.5}, dia_config).audio.temperature == 1.0  # raised to 1
    musicgen = MUSICGEN.defaults({"do_sample": True, "guidance_scale": 3.0, "max_length": 1500}, {"decoder": {"num_codebooks": 4}})
    assert musicgen.audio == Sampling(1.0, 50) and musicgen.guidance == Guidance(3.0, "audio") and musicgen.max_frames == 1497

    (tmp_path / "generation_config.json").write_text(json.dumps(published))
    dia = Checkpoint(tmp_path, dia_config, DIA)
    assert dia.guidance() == Guidance(4.0, "audio", 45)  # l_c + 3·(l_c − l_u) = l_u + 4·(l_c − l_u)
    assert dia.guidance(Guidance(2.0, "audio"), Sampling(1.0, 20)) == Guidance(3.0, "audio", 20)
    assert not dia.guidance(Guidance(1.0)).enabled
    musicgen = Checkpoint(tmp_path, {"decoder": {"num_codebooks": 4}}, MUSICGEN)
    assert musicgen.guidance() == Guidance(3.0, "audio") and musicgen.guidance(Guidance(1.5, "audio")).scale == 1.5
    with pytest.raises(InputError, match="above 1"):
        musicgen.guidance(Guidance(0.5, "audio"))


def test_a_hub_model_is_looked_up_once_per_process(sesame_dir, hub_cache, monkeypatch):
    """A command asks about its model several times (is it Whisper? its checkpoint, its
    files): the hub is asked once (online each ask is a round trip), and a failed ask is not
    kept (a download in between counts)."""
    import huggingface_hub

    from speechctl.asr.checkpoint import is_whisper
    from speechctl.errors import ModelError
    from speechctl.models import hub
    from speechctl.models.catalog import resolve_checkpoint

    into_hub_cache(hub_cache, "sesame/csm-1b", sesame_dir)
    monkeypatch.setattr(hub, "_resolved", {})
    calls, real = [], huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **kw: calls.append(repo) or real(repo, **kw))
    for _ in range(2):
        assert not is_whisper("sesame/csm-1b")
        assert resolve_checkpoint("sesame/csm-1b").family.name == "csm"
    assert calls == ["sesame/csm-1b"]
    for _ in range(2):
        with pytest.raises(ModelError, match="not in the Hugging Face cache"):
            hub.snapshot("sesame/not-yet")
    assert calls.count("sesame/not-yet") == 2
