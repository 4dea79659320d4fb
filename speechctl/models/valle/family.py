"""VALL-E-style decoupled AR + NAR generation in speechctl's own layout (``SpeechctlValleLM``).

Two stages, two places:

* **AR** (vLLM's continuous batch): a decoder-only Llama over text bytes and codebook 1. It is
  speechctl's multi-stream model with one audio stream (codebook 1, no delay): vLLM steps it, the
  stream runtime samples codebook 1 per request (temperature/top-k/top-p, seeded, CFG pairs) and
  rules the primary stream; codebook 1 ends with its own EOS.
* **NAR** (a second stage beside vLLM, ``two_stage.py``): a bidirectional transformer fills
  codebooks 2..K, one pass per codebook over the whole utterance (text, the voice prompt's K
  codebooks, the codebooks so far), conditioned on the codebook by a stage embedding, one head
  per codebook; batched over utterances of many requests.

config.json: the AR backbone's fields at the top level (``model_type: llama``); ``speechctl`` holds
the AR stage's stream layout (delays [0], codebook_size, control tokens) and ``nar``, the NAR stage
(``nar.py``); the NAR weights live in ``nar/model.safetensors``, the codec in ``codec/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from speechctl.engine.streams import DelayPattern, StreamSpec
from speechctl.models.family import CfgConvention, CodecLocation, Family

NAR_DIR = "nar"  # the NAR stage's weights: nar/model.safetensors


def ar_spec(config: Mapping[str, Any]) -> StreamSpec:
    """The AR stage's layout (what vLLM runs): codebook 1 alone, no delay."""
    spec = StreamSpec.from_dict(config.get("speechctl") or {})
    if spec.pattern.delays != (0,):
        raise ValueError(f"an AR+NAR checkpoint's AR stage has one stream without delay, not delays {list(spec.pattern.delays)}")
    return spec


def num_codebooks(config: Mapping[str, Any]) -> int:
    try:
        k = int(((config.get("speechctl") or {}).get("nar") or {})["num_codebooks"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("an AR+NAR checkpoint needs speechctl.nar.num_codebooks in config.json") from None
    if k < 2:
        raise ValueError(f"speechctl.nar.num_codebooks must be at least 2 (codebook 1 is the AR stage's), got {k}")
    return k


def full_spec(config: Mapping[str, Any]) -> StreamSpec:
    """What the pipeline delivers: all K codebooks, frame-aligned (delays 0), the AR's control
    tokens. Outputs of the two-stage engine are laid out with it (codebook 1 from the AR stage,
    the others from the NAR stage)."""
    spec = ar_spec(config)
    return replace(spec, pattern=DelayPattern((0,) * num_codebooks(config), spec.pattern.codebook_size))


class Valle(Family):
    name = "valle"
    title = "the AR+NAR model"
    description = ("VALL-E-style AR+NAR (speechctl's own layout): AR codebook 1 on vLLM, "
                   "then a bidirectional NAR stage fills codebooks 2..K, one pass each")
    architecture = "SpeechctlValleLM"
    model_class = "speechctl.models.valle.model:ValleArForCausalLM"
    prompts = "speechctl.models.valle.prompts:VallePrompts"
    engine_class = "speechctl.models.valle.two_stage:ArNarEngine"  # the AR stage's SpeechEngine and the NAR stage
    # VALL-E's papers generate without guidance; speechctl's own layout offers it on the AR stage
    # (codebook 1) as the generic family does: l_u + s·(l_c − l_u). The NAR stage is unguided.
    cfg = CfgConvention()

    def spec(self, config: Mapping[str, Any]) -> StreamSpec:
        return full_spec(config)

    def codec(self, path: Path, config: Mapping[str, Any]) -> CodecLocation:
        sub = (config.get("speechctl") or {}).get("codec", "codec")
        return CodecLocation(path / sub, f"{sub}/ in the checkpoint")

    def describe(self, config: Mapping[str, Any]) -> dict:
        nar = (config.get("speechctl") or {}).get("nar") or {}
        k = nar.get("num_codebooks")
        layers = "the AR backbone's layers (shared)" if nar.get("shared_layers") else (
            f"{nar.get('num_layers')} layers of its own, hidden {nar.get('hidden_size')}")
        return {
            "stage 1 (AR)": "codebook 1 on vLLM: text bytes + the voice's codebook 1 in, codes until EOS "
                            "(audio sampling flags, seed, CFG)",
            "stage 2 (NAR)": f"codebooks 2..{k} beside vLLM: {int(k or 1) - 1} bidirectional passes per batch of "
                             f"utterances, {layers}; greedy unless --depth-* says otherwise",
            "nar weights": f"{NAR_DIR}/model.safetensors",
        }


FAMILY = Valle()
