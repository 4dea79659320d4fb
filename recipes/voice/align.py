"""Teaching the LM where in its text each frame is (``lm_train.align_weight``).

The voice's LM learns to say the first word of a sentence and then drifts (docs/voice/lm-progress.md):
it has not learnt which part of its text each audio frame reads. espeak-ng says where every word
starts (``espeak_lib.py``), so the data knows: frame f of an utterance reads the word whose start
is the last one at or before f (the first word before it starts). The alignment loss asks a few
attention heads of one layer to put their weight there: for the query that predicts frame f of the
lead stream, minus the log of the attention mass the head gives the word's text bytes, averaged
over frames and heads (guided attention, as DC-TTS trained its text-to-mel attention). Inference
does not change: the model is the same, its heads have learnt to look where the audio is.

``word_spans`` turns a split's word starts into per-frame spans; ``AttentionProbe`` recomputes the
chosen heads' attention from the layer's own inputs (captured by a forward pre-hook: the backbone
runs SDPA, which returns no weights) with transformers' own rotary embedding.
"""

from __future__ import annotations

import numpy as np
import torch


def word_spans(words: np.ndarray, word_counts: np.ndarray, offset: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """[W, 3] (character start, length, first frame) of utterances back to back, each utterance's
    word count, frame offset and frame count -> [F, 2] int16: the characters [start, end) that
    frame f of all utterances back to back reads; (0, 0) in an utterance without words. (espeak-ng
    counts characters, the LM reads bytes: the corpus is ASCII, ``text._ALLOWED``, so they agree.)"""
    total = int(frames.sum())
    spans = np.zeros((total, 2), np.int16)
    if not len(words):
        return spans
    utt = np.repeat(np.arange(len(word_counts)), word_counts)
    first = np.concatenate([[0], np.cumsum(word_counts)[:-1]])
    # Each word marks its first frame; a frame reads the newest mark of its utterance (the first
    # word also covers the frames before it starts).
    at = offset[utt] + np.minimum(words[:, 2], np.maximum(frames[utt] - 1, 0))
    marks = np.full(total, -1, np.int64)
    np.maximum.at(marks, at[frames[utt] > 0], np.flatnonzero(frames[utt] > 0))
    has = (word_counts > 0) & (frames > 0)
    np.maximum.at(marks, offset[has], first[has])
    marks = np.maximum.accumulate(marks)
    inside = np.repeat(word_counts > 0, frames)  # frames of utterances that have words
    chosen = words[np.clip(marks, 0, len(words) - 1)]
    spans[inside, 0] = chosen[inside, 0]
    spans[inside, 1] = chosen[inside, 0] + chosen[inside, 1]
    return spans


def usable(gold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(which queries have a span, the spans with [0, 1) where none): a query without one must
    still have a finite log-mass, or its gradient is NaN even when masked out."""
    valid = gold[..., 0] >= 0
    return valid, torch.where(valid[..., None], gold, torch.tensor([0, 1], device=gold.device))


class AttentionProbe:
    """The attention of heads ``0 .. heads-1`` of one layer of a transformers Llama/Qwen backbone,
    recomputed from what the layer's attention received in the last forward."""

    def __init__(self, backbone, layer: int, heads: int):
        self.attn = backbone.layers[layer].self_attn
        self.heads = heads
        self._inputs = None
        self._hook = self.attn.register_forward_pre_hook(self._capture, with_kwargs=True)

    def _capture(self, module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        self._inputs = (hidden, kwargs["position_embeddings"])

    def log_mass(self, gold: torch.Tensor) -> torch.Tensor:
        """gold [B, L, 2]: key positions [start, end) for each query (end > start) -> [B, heads, L]
        the log of the attention weight each head gives them (causal, as the layer attends)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        hidden, (cos, sin) = self._inputs
        attn, h = self.attn, self.heads
        B, L, _ = hidden.shape
        D = attn.head_dim
        q = attn.q_proj(hidden).view(B, L, -1, D)[:, :, :h]
        k = attn.k_proj(hidden).view(B, L, -1, D)[:, :, [i // attn.num_key_value_groups for i in range(h)]]
        if hasattr(attn, "q_norm"):  # Qwen3 normalizes each head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        scores = (q @ k.transpose(-1, -2)).float() * attn.scaling  # [B, h, L(query), L(key)]
        pos = torch.arange(L, device=hidden.device)
        causal = pos[None, :] <= pos[:, None]
        in_gold = (pos >= gold[..., :1]) & (pos < gold[..., 1:])  # [B, L, L]
        everything = torch.logsumexp(scores.masked_fill(~causal, float("-inf")), dim=-1)
        return torch.logsumexp(scores.masked_fill(~in_gold[:, None], float("-inf")), dim=-1) - everything

    def loss(self, gold: torch.Tensor) -> torch.Tensor:
        """Minus the mean log attention mass on the gold spans, over the queries that have one
        (gold start < 0: none)."""
        valid, safe = usable(gold)
        log_mass = self.log_mass(safe)  # [B, h, L]
        return -(log_mass * valid[:, None]).sum() / (valid.sum() * self.heads).clamp(min=1)

    def close(self) -> None:
        self._hook.remove()


@torch.no_grad()
def attention_table(trainer) -> tuple[np.ndarray, float]:
    """Of every head of a trained LM (an ``LMTrainer`` holding it): the mean attention mass it
    gives the word each frame reads, over the held-out frames (teacher-forced); and what
    attention spread evenly over the causal window would give. A head that has learnt to read
    along puts most of its weight there; ``python -m recipes.voice lm-attention``."""
    model, examples = trainer.model.eval(), trainer.heldout
    config = model.config
    probes = [AttentionProbe(model.model, layer, config.num_attention_heads) for layer in range(config.num_hidden_layers)]
    total, uniform, count = torch.zeros(len(probes), config.num_attention_heads), 0.0, 0
    try:
        for ids, length in examples.epoch(trainer.cfg.batch_tokens // 8, 0, 0):
            batch = examples.batch(torch.from_numpy(ids).to(trainer.device), length)
            model.hidden(batch["primary"], batch["aux"])
            valid, safe = usable(batch["gold"])
            gold = batch["gold"]
            for layer, probe in enumerate(probes):
                total[layer] += (probe.log_mass(safe).exp() * valid[:, None]).sum(dim=(0, 2)).cpu()
            query = torch.arange(length, device=gold.device)[None]
            uniform += float(((safe[..., 1] - safe[..., 0]) / (query + 1) * valid).sum())
            count += int(valid.sum())
    finally:
        for probe in probes:
            probe.close()
    return (total / max(count, 1)).numpy(), uniform / max(count, 1)
