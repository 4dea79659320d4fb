"""Repetition-aware sampling (Higgs Audio v2's RAS), on the device, for every row of a step.

transformers' Higgs ``generate``: after the step's tokens are chosen, a codebook's token that
already appears at least ``max_repeat`` times among that codebook's last ``window`` audio steps
(the prompt's audio included; BOS and EOS never counted) is replaced by a draw from the raw,
unfiltered distribution of that codebook (the model's logits, no temperature, no top-k/top-p)
— in greedy decoding too. Here the draw uses the runtime's counter-based noise under its own
salt, so it does not depend on the batch either.

One difference, on purpose: the draw keeps the rules' masks (``FrameRules.restrict``: a code
where only a code may stand, EOS only where the audio may end, never PAD). transformers draws
from the logits before its processors, so a redraw there may pick a special token its delay
pattern forbids; speechctl's layout refuses such a frame, and the request failed ("a special
token where a code belongs"): speechctl's own voice, near the end of its audio (repeated silence
codes, EOS likely in every codebook), met it once in 80 sentences. For Higgs, whose codebooks
may all take BOS and EOS (an open vocabulary), the masks change nothing past ``min_frames``.
"""

from __future__ import annotations

import torch

from speechctl.engine.runtime.sampling import sample_streams
from speechctl.engine.runtime.slots import HISTORY, SlotTable

RAS_SEED_SALT = 0x2545F491  # redraws independent of the first draws


def window_tokens(table: SlotTable, slots: torch.Tensor, g_next: torch.Tensor) -> torch.Tensor:
    """[R, HISTORY, K] the tokens of each row's last HISTORY steps before generated index
    ``g_next`` (step j holds index g_next - HISTORY + j): recorded ones, else the prompt's audio."""
    j = torch.arange(HISTORY, device=slots.device)
    idx = g_next[:, None] - HISTORY + j[None, :]  # [R, H]
    generated = table.gen_aux[slots[:, None], idx.clamp(min=0, max=table.max_len)].to(torch.int64)
    prompt = table.history[slots[:, None], (idx + HISTORY).clamp(min=0, max=HISTORY - 1)].to(torch.int64)
    return torch.where((idx >= 0)[..., None], generated, prompt)


def redraw_repeats(table: SlotTable, slots, g_next, tokens: torch.Tensor, raw_logits: torch.Tensor, codebook_size: int):
    """tokens [R, K] with RAS applied for the rows that use it (``table.ras_window`` > 0);
    ``raw_logits`` [R, K, Va] as the model gave them."""
    window = table.ras_window[slots]  # [R], 0 = off
    recent = torch.arange(HISTORY, device=slots.device)[None, :] >= HISTORY - window[:, None]  # [R, H]
    past = window_tokens(table, slots, g_next)
    counted = recent[..., None] & (past < codebook_size) & (past == tokens[:, None, :])  # BOS/EOS never count
    repeats = counted.sum(dim=1)  # [R, K]
    replace = (window[:, None] > 0) & (repeats >= table.ras_max[slots][:, None])
    ones = torch.ones_like(g_next, dtype=torch.float32)
    redraw = sample_streams(raw_logits, ones, torch.zeros_like(g_next), ones, table.seed[slots] ^ RAS_SEED_SALT, g_next,
                            any_random=True, all_random=True, any_filter=False)
    return torch.where(replace, redraw, tokens)
