"""Classifier-free guidance inside a step: the two members of a pair (conditional and
unconditional request, scheduled side by side by ``engine/pairs.py``) merge their logits on the
device and take one token, sampled once per pair.

Each stream that is guided takes ``l = l_u + s·(l_c − l_u)`` on the conditional row (Dia's
optional "CFG filter" then keeps the conditional logits on the top-k of the guided ones); the
unconditional row takes its partner's tokens; the primary stream's token is sampled here from the
conditional row's guided logits and handed to vLLM as a one-hot row for both members, so that no
runner's seeding can split a pair (DESIGN.md §3a).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from speechctl.engine.runtime.sampling import sample_streams
from speechctl.engine.runtime.slots import SlotTable

TEXT_SEED_SALT = 0x5DEECE66D  # a pair's text draws, independent of its audio draws


class Pairing(NamedTuple):
    guided: torch.Tensor  # [R] conditional rows whose partner is in the step, at the same position
    source: torch.Tensor  # [R] the row whose tokens a row takes (its partner for unconditional rows)
    partner_row: torch.Tensor  # [R] the partner's row (0 where there is none; masked by ``guided``)


def find_pairs(table: SlotTable, slots: torch.Tensor, g_next: torch.Tensor, real: torch.Tensor) -> Pairing:
    """Each paired row's partner row in this step. A paired row whose partner is absent or at
    another position is marked in ``table.desync`` (the driver fails that request)."""
    R = slots.shape[0]
    rows = torch.arange(R, device=slots.device)
    row_of_slot = torch.full_like(table.partner, -1)
    row_of_slot[slots] = rows
    row_of_slot.narrow(0, table.scratch, 1).fill_(-1)  # not `[i] = -1`: that copies a host scalar
    partner = table.partner[slots]
    paired = partner != table.scratch
    partner_row = row_of_slot[partner]
    present = partner_row >= 0
    partner_row = partner_row.clamp(min=0)
    synced = paired & present & (g_next[partner_row] == g_next)
    broken = paired & real & ~synced
    table.desync.index_put_((torch.where(broken, slots, table.scratch),), torch.ones_like(slots))
    conditional = table.conditional[slots]
    source = torch.where(synced & ~conditional, partner_row, rows)
    return Pairing(synced & conditional, source, partner_row)


def guide(table: SlotTable, pairing: Pairing, slots, logits, aux_logits, cfg_filter: bool):
    """(primary [R, V], auxiliary [R, K, Va]) logits -> the same with the guided streams merged on
    the conditional rows of pairs; ``cfg_filter``: some live pair uses Dia's filter. Primary
    logits None (no text head: the rules set the primary stream) stay None."""
    scale = table.cfg_scale[slots]
    top_k = table.cfg_top_k[slots]
    out = [None] if logits is None else []
    for ls, on in ((logits, table.cfg_text[slots]), (aux_logits, table.cfg_audio[slots])):
        if ls is None:
            continue
        cond = ls.float()
        uncond = cond[pairing.partner_row]
        shape = (-1,) + (1,) * (cond.dim() - 1)
        merged = uncond + scale.view(shape) * (cond - uncond)
        if cfg_filter:
            filtered = (top_k > 0).view(shape)
            k = torch.where(top_k > 0, top_k, 1).view(shape).expand(merged.shape[:-1] + (1,))
            kth = merged.sort(dim=-1, descending=True).values.gather(-1, k - 1)
            kept = torch.where(merged >= kth, cond, float("-inf"))
            merged = torch.where(filtered, kept, merged)
        use = (pairing.guided & on).view(shape)
        out.append(torch.where(use, merged, cond).to(ls.dtype))
    return out[0], out[1]


def pair_primary(table: SlotTable, pairing: Pairing, slots, g_next, logits, any_random: bool):
    """Both members of a pair take one primary token, sampled from the conditional row's (guided,
    rule-constrained) logits; ``any_random``: some pair samples its text at temperature > 0."""
    temperature, top_k, top_p = table.text.at(slots)
    choice = sample_streams(logits.float()[:, None, :], temperature, top_k, top_p, table.seed[slots] ^ TEXT_SEED_SALT,
                            g_next, any_random=any_random, any_filter=any_random)[:, 0]
    choice = choice[pairing.source]
    paired = pairing.guided | (pairing.source != torch.arange(len(slots), device=slots.device))
    onehot = torch.full_like(logits, torch.finfo(logits.dtype).min).scatter_(1, choice[:, None], 0.0)
    return torch.where(paired[:, None], onehot, logits)
