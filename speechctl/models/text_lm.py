"""Text LMs for the response stage of ``speechctl chat``: the embedded ``tiny-lm`` and directories.

``tiny-lm`` is a 2-layer Llama (``transformers.LlamaForCausalLM``) **with random weights from a
fixed seed** and the byte tokenizer, created on first use in the cache like the ``tiny`` speech
model: it makes the chat pipeline run anywhere in seconds, and its replies are gibberish. Any
vLLM text model directory (a Hugging Face checkpoint: config.json, weights, tokenizer) can take
its place.
"""

from __future__ import annotations

import json
from pathlib import Path

from speechctl.errors import ModelError

TINY_LM = "tiny-lm"
TINY_LM_DESCRIPTION = "random weights from a fixed seed: a 2-layer Llama text LM with a byte tokenizer; the default response model of `speechctl chat` (its replies are gibberish)"
TINY_LM_VERSION = 1  # bump when the recipe changes, so caches rebuild
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]
# A minimal chat template, so that the tiny model goes through the same path as real chat models.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def create_tiny_lm(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny random Llama text model (config, safetensors, tokenizer) to ``path``."""
    import torch
    import transformers

    from speechctl.models.tokenizer import byte_tokenizer

    path = Path(path)
    ids = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}
    config = transformers.LlamaConfig(
        vocab_size=256 + len(SPECIAL_TOKENS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: vLLM's CPU attention has no kernels for 16
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=ids["<bos>"],
        eos_token_id=ids["<eos>"],
        pad_token_id=ids["<pad>"],
    )
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a larger spread than the init default, so that replies vary
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        # Output rows of everything but printable ASCII are zero: those logits stay 0 while the
        # printable ones spread widely, so replies are (random) readable characters, not bytes.
        printable = torch.zeros(config.vocab_size, dtype=torch.bool)
        printable[32:127] = True
        model.lm_head.weight[~printable] = 0.0
        model.lm_head.weight[printable] *= 4.0
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)  # (model.save_pretrained would draw a progress bar)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    tok = byte_tokenizer(SPECIAL_TOKENS)
    tok.bos_token, tok.eos_token, tok.pad_token = "<bos>", "<eos>", "<pad>"
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    (path / "speechctl.json").write_text(json.dumps({"recipe": f"tiny-lm v{TINY_LM_VERSION}, seed {seed}"}))
    return path


def ensure_tiny_lm() -> Path:
    """The embedded response LM, created on first use in the cache."""
    from speechctl.models.cache import cached_model

    return cached_model(f"tiny-lm-v{TINY_LM_VERSION}", create_tiny_lm)


def resolve_text_lm(name: str | None) -> Path:
    """``tiny-lm`` (the default; built on first use), a text model directory or a hub id (from
    the Hugging Face cache, as ``speechctl.models.hub`` resolves it) -> its directory."""
    if name is None or name == TINY_LM:
        return ensure_tiny_lm()
    path = Path(name).expanduser()
    if not path.exists():
        from speechctl.models.hub import is_hub_id, snapshot

        if is_hub_id(name):
            path = snapshot(name)
    if not (path / "config.json").is_file():
        raise ModelError(f"{name}: not a text model directory (no config.json) and not {TINY_LM}")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{path / 'config.json'}: unreadable config ({e})") from None
    if "speechctl" in config:
        raise ModelError(f"{name}: a multi-stream speech model, not a text LM (use it with --mode unified or --tts-model)")
    return path


def describe_text_lm(name: str | None) -> dict:
    path = resolve_text_lm(name)
    config = json.loads((path / "config.json").read_text())
    return {
        "name": name or TINY_LM,
        "path": str(path),
        "kind": "text LM (chat response model)",
        "architecture": (config.get("architectures") or ["?"])[0],
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "vocab": config.get("vocab_size"),
        "description": TINY_LM_DESCRIPTION if (name or TINY_LM) == TINY_LM else None,
    }
