"""A finished checkpoint directory in speechctl's layout, loadable by ``speechctl tts --model DIR``:

    config.json            the backbone's config with its ``speechctl`` section (streams, tokens)
    model.safetensors      the LM (``model.*``, ``lm_head``, ``audio_embed``, ``audio_head``), bf16
    tokenizer files        speechctl's byte tokenizer with ``SPECIAL_TOKENS``
    codec/                 the trained DacModel (config.json + model.safetensors, fp16)
    speechctl.json         what made it: recipe, data and code hashes, licences of the text
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from recipes.voice.checkpoint import load_state, read_record
from recipes.voice.config import Recipe


def export(lm_dir: Path, codec_model_dir: Path, out: Path, work: Path | None = None) -> Path:
    """``lm_dir``: an LM checkpoint (state.pt + recipe.json); ``codec_model_dir``: the codec the
    LM was trained on (``codec.save_codec_model``). Writes ``out`` (replaced)."""
    import transformers
    from safetensors.torch import save_file

    from recipes.voice.lm import SpeechLM, skeleton

    lm_dir, codec_model_dir, out = Path(lm_dir), Path(codec_model_dir), Path(out)
    record = read_record(lm_dir)
    if record is None or record.get("stage") != "lm":
        raise FileNotFoundError(f"{lm_dir}: not an LM checkpoint (no recipe.json of stage lm)")
    recipe = Recipe.from_dict(record["recipe"])
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    skeleton(recipe, tmp)
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
    (tmp / "speechctl.json").write_text(json.dumps({
        "recipe": recipe.to_dict(),
        "made_by": "recipes/voice (speechctl issue 20)",
        "lm": {"step": record["step"], "codes_sha256": record.get("codes_sha256"), "runs": record.get("runs"),
               "heldout": record.get("heldout")},
        "codec_dir_source": str(codec_model_dir),
        "text": "The Devil's Dictionary by Ambrose Bierce (1911, public domain) and SCOWL word lists "
                "(Kevin Atkinson et al., permissive licence); see recipes/voice/text/SOURCES.md",
        "speech": "espeak-ng (GPL-3.0-or-later), voice " + recipe.data.voice,
    }, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def sizes(path: Path) -> dict:
    """Bytes of each file of an exported directory, and the total."""
    path = Path(path)
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    return {"files": files, "total_bytes": sum(files.values())}
