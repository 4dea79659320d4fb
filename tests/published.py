"""Tiny checkpoints laid out file for file as the published repositories are, and a local
Hugging Face hub cache laid out as the hub lays it out.

* ``sesame_like(path)``: sesame/csm-1b — the transformers copy of the weights in
  ``transformers-0000N-of-00002.safetensors`` with ``transformers.safetensors.index.json``, named
  by config.json's ``transformers_weights``; a decoy ``model.safetensors`` in Sesame's original
  names (other values: loading it would change every token) and a decoy ``ckpt.pt``; Mimi
  (``codec_model.*``) inside the shards; ``generation_config.json``; ``prompts/``.
* ``bosonai_like(path, hub_cache)``: bosonai/higgs-audio-v2-generation-3B-base after its rewrite
  to transformers' format — ``model.safetensors`` beside an older ``model.safetensors.index.json``
  whose shards (original names) are gone; no ``audio_tokenizer/``: ``processor_config.json``
  names the codec by hub id, and the codec lives in ``hub_cache``.
* ``into_hub_cache(cache, repo_id, src)``: ``models--org--name/{blobs,snapshots/<rev>,refs/main}``.

The models themselves are written by transformers' own classes (``save_pretrained``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HIGGS_CODEC_REPO = "bosonai/higgs-audio-v2-tokenizer"
GREEDY_CONFIG = {"do_sample": False}


def _reshard(path: Path, prefix: str, shards: int = 2) -> str:
    """Split ``path/model.safetensors`` into ``{prefix}-0000N-of-0000M.safetensors`` with
    ``{prefix}.safetensors.index.json``; returns the index's name."""
    tensors = load_file(str(path / "model.safetensors"))
    names = sorted(tensors)
    weight_map, total = {}, 0
    for i in range(shards):
        part = names[i::shards]
        file = f"{prefix}-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
        total += sum(tensors[n].numel() * tensors[n].element_size() for n in part)
    index = f"{prefix}.safetensors.index.json"
    (path / index).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (path / "model.safetensors").unlink()
    return index


def _sesame_name(name: str) -> str:
    """transformers' CSM name -> Sesame's original one (the inverse of transformers' converter)."""
    for new, old in (("backbone_model.layers.", "backbone.layers."), ("depth_decoder.model.layers.", "decoder.layers."),
                     ("self_attn", "attn"), ("o_proj", "output_proj"), ("gate_proj", "w1"), ("down_proj", "w2"),
                     ("up_proj", "w3"), ("input_layernorm.weight", "sa_norm.scale"),
                     ("post_attention_layernorm.weight", "mlp_norm.scale"),
                     ("backbone_model.embed_tokens.embed_audio_tokens", "audio_embeddings"),
                     ("embed_text_tokens", "text_embeddings"), ("lm_head", "codebook0_head"),
                     ("depth_decoder.codebooks_head.weight", "audio_head"),
                     ("depth_decoder.model.inputs_embeds_projector", "projection"),
                     ("backbone_model.norm.weight", "backbone.norm.scale"), ("depth_decoder.model.norm.weight", "decoder.norm.scale")):
        name = name.replace(new, old)
    return name


def sesame_like(path: Path, generation: dict | None = None) -> Path:
    """A save_pretrained CSM directory rewritten as sesame/csm-1b is published (module doc)."""
    path = Path(path)
    tensors = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(99)
    decoy = {_sesame_name(n): torch.randn(t.shape, generator=gen).to(t.dtype) for n, t in tensors.items()
             if not n.startswith("codec_model.")}  # Sesame's file has no Mimi
    index = _reshard(path, "transformers")
    save_file(decoy, str(path / "model.safetensors"), metadata={"format": "pt"})
    torch.save({"model": {n: t[:1].clone() for n, t in decoy.items()}}, path / "ckpt.pt")
    config = json.loads((path / "config.json").read_text())
    config["transformers_weights"] = index
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps(generation or {
        "do_sample": True, "temperature": 0.9, "top_k": 50, "depth_decoder_do_sample": True,
        "depth_decoder_temperature": 0.9, "depth_decoder_top_k": 50, "max_new_tokens": 125}, indent=2))
    (path / "prompts").mkdir(exist_ok=True)
    (path / "prompts" / "read_speech_a.wav").write_bytes(b"RIFF")  # present, never read
    return path


def bosonai_like(path: Path, hub_cache: Path, generation: dict | None = None) -> Path:
    """A save_pretrained Higgs directory (with ``audio_tokenizer/``) rewritten as bosonai's repo
    is published (module doc); its codec moves into ``hub_cache`` as ``HIGGS_CODEC_REPO``."""
    path = Path(path)
    into_hub_cache(hub_cache, HIGGS_CODEC_REPO, path / "audio_tokenizer")
    shutil.rmtree(path / "audio_tokenizer")
    tensors = load_file(str(path / "model.safetensors"))
    stale = {n: f"model-0000{1 + i % 3}-of-00003.safetensors" for i, n in enumerate(sorted(tensors))}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        n.replace("model.layers.", "layers.").replace("audio_mlp", "audio_mlp_old"): f for n, f in stale.items()}}, indent=2))
    (path / "processor_config.json").write_text(json.dumps({
        "processor_class": "HiggsAudioV2Processor",
        "audio_tokenizer": {"audio_tokenizer_class": "HiggsAudioV2TokenizerModel",
                            "audio_tokenizer_name_or_path": HIGGS_CODEC_REPO}}, indent=2))
    (path / "generation_config.json").write_text(json.dumps(generation or {
        "do_sample": True, "temperature": 1.0, "top_k": 50, "top_p": 0.95, "ras_win_len": 7,
        "ras_win_max_num_repeat": 2}, indent=2))
    return path


def into_hub_cache(cache: Path, repo_id: str, src: Path, revision: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """Copy ``src`` into ``cache`` as the hub lays out a downloaded repo: files as blobs named by
    their hash, the snapshot of ``revision`` as links to them, ``refs/main`` naming it. Returns
    the snapshot directory."""
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in Path(src).rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(Path("../" * (len(link.relative_to(repo).parts) - 1)) / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
