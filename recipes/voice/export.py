"""A finished checkpoint directory in speechctl's layout, loadable by ``speechctl tts --model DIR``:

    config.json            the backbone's config with its ``speechctl`` section (streams, tokens)
    model.safetensors      the LM (``model.*``, ``lm_head``, ``audio_embed``, ``audio_head``), bf16
    tokenizer files        speechctl's byte tokenizer with ``SPECIAL_TOKENS``
    codec/                 the trained DacModel (config.json + model.safetensors, fp16, quantizer float32)
    speechctl.json         what made it: recipe, data and code hashes, licences of the text
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from recipes.voice.checkpoint import load_state, read_record
from recipes.voice.config import NATURAL_TEXT, Recipe


# How the voice samples unless a user says otherwise (generation_config.json, which speechctl reads
# as the checkpoint's defaults): a small LM said greedily loops and stalls; sampled from its top
# codes it speaks. The values are chosen by the held-out WER after training: the step-15,206 LM
# on 40 held-out sentences read at 0.387 / 0.395 / 0.407 / 0.407 / 0.415 / 0.432 / 0.446 with
# temperature / top-k 0.5 / 10, 0.5 / 20, 0.6 / 10, 0.4 / 20, 0.6 / 20, 0.3 / 20, 0.7 / 20
# (one run each, docs/voice/lm-progress.md): best around 0.5 with a narrow top-k. The step-17,320 LM
# at 0.2 / 10 against 0.5 / 10 (forty-second session): held-out sentences 40-119 at 0.427 / 0.447
# against 0.463 / 0.433 (seeds 1234 / 99), the fox within one word at 21 of 64 seeds against 9,
# "Hello world" exactly at 26 of 64 against 23; greedy (0 / 1) says both wrong at every seed.
SAMPLING = {"do_sample": True, "temperature": 0.2, "top_k": 10}
# The longest piece of text it speaks in one request (speechctl cuts longer text at sentences, then
# clauses): the LM drifts in the second half of long sentences. On 40 held-out sentences (0.5 /
# 10, two seeds each) the step-15,206 LM read pieces of at most 60 / 80 / 120 characters at
# Whisper WER 0.404 / 0.384 / 0.399 on average, and 0.449 at 160 (one seed); the step-13,096 LM
# 0.605 / 0.544 / 0.538 / 0.615 at 50 / 80 / 120 / 200 (docs/voice/lm-progress.md).
MAX_PIECE_CHARS = 80


def export_settings(sampling: dict | None = None, max_piece_chars: int | None = None) -> dict:
    """What an export chose beyond the checkpoints (None: the voice's defaults; the voice prompt
    committed beside this file, ``voice_prompt.py``), as its speechctl.json records them;
    ``keep.ship_kept`` ships again when today's defaults differ."""
    from recipes.voice.voice_prompt import read_voice_prompt

    prompt = read_voice_prompt()
    return {"sampling": sampling or SAMPLING, "max_piece_chars": max_piece_chars or MAX_PIECE_CHARS,
            **({"voice_prompt": prompt} if prompt else {})}


def export(lm_dir: Path, codec_model_dir: Path, out: Path, sampling: dict | None = None,
           max_piece_chars: int | None = None, kept: str | None = None) -> Path:
    """``lm_dir``: an LM checkpoint (state.pt + recipe.json); ``codec_model_dir``: the codec the
    LM was trained on (``codec.save_codec_model``); ``sampling``: the generation_config fields of
    the voice's default sampling (default ``SAMPLING``); ``max_piece_chars``: the longest piece of
    text the voice speaks in one request (default ``MAX_PIECE_CHARS``); ``kept``: the keep merge
    its packs came from (``keep.ship_kept``), recorded. Writes ``out`` (replaced)."""
    import transformers
    from safetensors.torch import save_file

    from recipes.voice.lm import SpeechLM, skeleton
    from recipes.voice.voice_prompt import config_entry

    lm_dir, codec_model_dir, out = Path(lm_dir), Path(codec_model_dir), Path(out)
    record = read_record(lm_dir)
    if record is None or record.get("stage") != "lm":
        raise FileNotFoundError(f"{lm_dir}: not an LM checkpoint (no recipe.json of stage lm)")
    recipe = Recipe.from_dict(record["recipe"])
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    settings = export_settings(sampling, max_piece_chars)
    sampling, max_piece_chars = settings["sampling"], settings["max_piece_chars"]
    skeleton(recipe, tmp, max_piece_chars)
    prompt = config_entry(settings["voice_prompt"], codec_model_dir) if "voice_prompt" in settings else None
    if prompt is not None:  # speech follows on from it (speechctl's generic family reads it)
        written = json.loads((tmp / "config.json").read_text())
        written["speechctl"]["voice_prompt"] = prompt
        (tmp / "config.json").write_text(json.dumps(written, indent=2) + "\n")
    config = transformers.AutoConfig.from_pretrained(tmp)
    model = SpeechLM(config)
    load_state(lm_dir, {"lm": model}, {})
    state = model.export_state(getattr(torch, recipe.lm.dtype))
    expected = {f"model.{k}" for k in model.model.state_dict()} | {"lm_head.weight", "audio_embed.weight",
                                                                    "audio_head.weight"}
    if set(state) != expected:
        raise RuntimeError(f"state dict keys differ from speechctl's layout: {sorted(set(state) ^ expected)}")
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(tmp / "codec")
    shutil.copytree(codec_model_dir, tmp / "codec")
    codec_config = json.loads((tmp / "codec" / "config.json").read_text())
    if codec_config["n_codebooks"] != len(config.speechctl["delays"]) or \
            codec_config["codebook_size"] != config.speechctl["codebook_size"]:
        raise RuntimeError("the codec's codebooks are not the LM's")
    (tmp / "generation_config.json").write_text(json.dumps(sampling, indent=2) + "\n")
    (tmp / "speechctl.json").write_text(json.dumps({
        "recipe": recipe.to_dict(),
        "made_by": "recipes/voice (speechctl issue 20)",
        "lm": {"step": record["step"], "codes_sha256": record.get("codes_sha256"), "runs": record.get("runs"),
               "heldout": record.get("heldout")},
        "codec_dir_source": str(codec_model_dir),
        "export": settings,
        "voice_prompt": prompt is not None,  # (a prompt made with another codec is left out)
        **({"kept": kept} if kept else {}),
        "text": "; ".join(NATURAL_TEXT[name] for name in recipe.data.natural)
                + "; SCOWL word lists (Kevin Atkinson et al., permissive licence); see recipes/voice/text/SOURCES.md",
        "speech": "espeak-ng (GPL-3.0-or-later), voice " + recipe.data.voice,
    }, indent=2))
    for f in tmp.rglob("*"):  # safetensors writes 0600; a voice is read by whoever runs speechctl
        if f.is_file():
            f.chmod(0o644)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def ship(model_dir: Path, dest: Path | None = None) -> Path:
    """Install an exported voice as the package's default (``speechctl/voices/default/``, kept
    beside its README), replacing the one there; checked complete first."""
    from speechctl.voices import is_shipped, voice_dir

    model_dir, dest = Path(model_dir), Path(dest or voice_dir())
    if not is_shipped(model_dir):
        raise FileNotFoundError(f"{model_dir}: not an exported voice (config.json, model.safetensors, codec/)")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_dir, tmp)
    readme = dest / "README.md"
    if readme.is_file():
        shutil.copy2(readme, tmp / "README.md")
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def sizes(path: Path) -> dict:
    """Bytes of each file of an exported directory, and the total."""
    path = Path(path)
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    return {"files": files, "total_bytes": sum(files.values())}
