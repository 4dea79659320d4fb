"""Any Whisper checkpoint in Hugging Face format: tiny random checkpoints of each kind
(``test_asr_reference.make_checkpoint``: multilingual, large-v3's 128 mel bins and 100 languages,
turbo's and distil's few decoder layers) against transformers' ``generate`` (detected language,
given language, translate) and against the OpenAI-semantics reference (timestamps, beams).

A random model never ends a transcript by itself, so every window runs to ``max_tokens``: that
exercises the length limits too (greedy: transformers' ``max_new_tokens``; beams: OpenAI's
finalisation with the unfinished beams)."""

import pytest

from speechctl.api import AsrJob
from speechctl.asr.options import PLAIN_GREEDY
from test_asr_reference import RATE, Reference, hf_generate, make_checkpoint, noise_audio

pytestmark = pytest.mark.engine
LENGTH = 12
GREEDY = PLAIN_GREEDY
_ENGINES = []  # kept until the process ends: freeing a vLLM engine tears down state other engines use


@pytest.fixture(scope="module", params=["multilingual", "v3", "turbo", "distil"])
def model(request, tmp_path_factory):
    from speechctl.asr import WhisperAsr, WhisperConfig

    path = make_checkpoint(tmp_path_factory.mktemp("whisper") / request.param, request.param, seed=5)
    asr = WhisperAsr(path, WhisperConfig(max_num_seqs=16, max_group=4))
    _ENGINES.append(asr)
    return request.param, asr, Reference(path)


@pytest.fixture(scope="module")
def audios():
    return {f"a{i}": noise_audio(1.5 + i / 2, 20 + i) for i in range(3)}


def run(asr, audios, options, **job):
    return {r.id: r for r in asr.run(AsrJob(id=n, audio=a, whisper=options, max_tokens=LENGTH, **job) for n, a in audios.items())}


def test_greedy_with_a_detected_language_is_transformers_generate(model, audios):
    kind, asr, ref = model
    ours = run(asr, audios, GREEDY)
    for name, audio in audios.items():
        feats = ref.features(audio, sampling_rate=RATE, return_tensors="pt").input_features
        detected = int(ref.model.detect_language(input_features=feats)[0])
        assert ours[name].language == {v: k for k, v in ref.languages.items()}[detected], kind
        # (transformers adds the transcribe token to a detected language only when asked)
        assert ours[name].tokens == [hf_generate(ref, audio, max_new_tokens=LENGTH, task="transcribe")], (kind, name)
        assert ours[name].error is None and len(ours[name].tokens[0]) == LENGTH


def test_given_language_and_translation_are_transformers_generate(model, audios):
    kind, asr, ref = model
    for language, task in (("de", "transcribe"), ("fr", "translate")):
        ours = run(asr, audios, GREEDY.with_(language=language, task=task))
        for name, audio in audios.items():
            assert ours[name].language == language
            theirs = hf_generate(ref, audio, max_new_tokens=LENGTH, language=language, task=task)
            assert ours[name].tokens == [theirs], (kind, language, task, name)


def test_timestamps_and_beams_are_the_reference(model, audios):
    kind, asr, ref = model
    stamped = run(asr, audios, GREEDY.with_(timestamps=True, language="en"))
    beams = run(asr, audios, GREEDY.with_(beam_size=3, language="en"))
    for name, audio in audios.items():
        assert stamped[name].tokens == [ref.decode(audio, beam_size=1, timestamps=True, language="en", sample_len=LENGTH)["tokens"]]
        assert beams[name].tokens == [ref.decode(audio, beam_size=3, language="en", sample_len=LENGTH)["tokens"]], (kind, name)


def test_bad_options_are_one_line_errors_naming_the_item(model):
    kind, asr, _ = model
    audio = noise_audio(1.0, 1)
    results = {r.id: r for r in asr.run([
        AsrJob(id="klingon", audio=audio, whisper=GREEDY.with_(language="tlh")),
        AsrJob(id="wide", audio=audio, whisper=GREEDY.with_(beam_size=7)),
        AsrJob(id="fine", audio=audio, whisper=GREEDY, max_tokens=3),
    ])}
    assert results["klingon"].error.startswith("klingon: unknown language 'tlh'")
    assert results["wide"].error.startswith("wide: beam size / best-of 7 is more than this engine takes")
    assert all("\n" not in r.error for r in results.values() if r.error)
    assert results["fine"].error is None and len(results["fine"].tokens[0]) == 3


def test_a_whisper_checkpoint_by_hub_id_from_the_hugging_face_cache(tmp_path, monkeypatch):
    """``--model openai/whisper-tiny.en`` offline from a hub cache laid out as the hub lays it out
    (``tests/published.py`` ``into_hub_cache``: blobs, a snapshot of links, refs/main), holding a
    tiny English-only checkpoint written by transformers' classes beside the repository's other
    weight copy (``pytorch_model.bin``, as openai's repos have): transformers' greedy tokens
    through the API and the CLI, ``speechctl models`` names the snapshot and the weights chosen,
    and an id the cache lacks is one line naming the download command."""
    import json

    import soundfile as sf
    import torch
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from published import into_hub_cache
    from speechctl.asr.checkpoint import resolve_whisper
    from speechctl.cli import cli
    from speechctl.cli.options import EngineChoice

    path = make_checkpoint(tmp_path / "whisper-tiny.en", "en", seed=7)
    torch.save(load_file(str(path / "model.safetensors")), path / "pytorch_model.bin")
    snapshot = into_hub_cache(tmp_path / "hub", "openai/whisper-tiny.en", path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COLUMNS", "500")  # `speechctl models` prints the snapshot's path on one line
    assert resolve_whisper("openai/whisper-tiny.en") == snapshot
    assert resolve_whisper("openai/whisper-tiny.en@main") == snapshot

    audio = noise_audio(1.5, 4)
    theirs = hf_generate(Reference(path), audio, max_new_tokens=LENGTH)
    asr = EngineChoice("openai/whisper-tiny.en", 64, 4096, "auto").whisper()  # the engine the CLI below uses
    _ENGINES.append(asr)
    (ours,) = asr.run([AsrJob(id="a", audio=audio, whisper=GREEDY, max_tokens=LENGTH)])
    assert ours.tokens == [theirs] and asr.model_dir == snapshot

    wav = tmp_path / "a.wav"
    sf.write(wav, audio, RATE, subtype="FLOAT")
    run = lambda *args: CliRunner().invoke(cli, [str(a) for a in args])  # noqa: E731
    result = run("asr", wav, "--model", "openai/whisper-tiny.en", "--format", "json", "--max-tokens", LENGTH, "--beam-size", 1,
                 "--without-timestamps", "--no-condition-on-previous-text", "--temperature-increment-on-fallback", "none",
                 "--no-speech-threshold", "none")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["text"] == ours.text

    described = " ".join(run("models", "openai/whisper-tiny.en").output.split())
    for expected in (str(snapshot), "model.safetensors (by model.safetensors)", "pytorch_model.bin"):
        assert expected in described, (expected, described)
    missing = run("asr", wav, "--model", "openai/whisper-small")
    assert missing.exit_code == 1 and len(missing.output.strip().splitlines()) == 1
    assert "not in the Hugging Face cache" in missing.output and "huggingface-cli download openai/whisper-small" in missing.output
