"""The input side of a step: the auxiliary tokens of every scheduled position.

A generated position's input is its primary token (vLLM's) plus the auxiliary tokens recorded
at the same generated index; a prompt position carries PAD on the auxiliary streams (audio in
prompts arrives as multimodal embeddings instead). The newest generated token of a request also
switches its mode: ``<|audio_bos|>`` opens audio at the next step, ``<|audio_eos|>`` closes it.
"""

from __future__ import annotations

import torch

from speechctl.engine.runtime.slots import NEVER, SlotTable
from speechctl.engine.streams import StreamSpec


def inputs_at(table: SlotTable, spec: StreamSpec, input_ids: torch.Tensor, pos: torch.Tensor, tok_slot: torch.Tensor) -> torch.Tensor:
    """[n] primary ids at positions ``pos`` of slots ``tok_slot`` -> [n, K] auxiliary ids."""
    g = pos - table.prompt_len[tok_slot]  # generated index (negative in the prompt)
    is_gen = g >= 0
    aux = table.gen_aux[tok_slot, g.clamp(0, table.max_len)].to(torch.int64)
    aux = torch.where(is_gen[:, None], aux, spec.pattern.pad)

    newest = is_gen & (g == table.n_gen[tok_slot] - 1)
    opens = torch.where(newest & (input_ids == spec.audio_bos_id), tok_slot, table.scratch)
    table.audio_start.index_put_((opens,), g + 1)
    table.frames.index_put_((opens,), torch.full_like(g, -1))
    closes = torch.where(newest & (input_ids == spec.audio_eos_id), tok_slot, table.scratch)
    table.audio_start.index_put_((closes,), torch.full_like(g, NEVER))
    return aux


def scheduled_inputs(table: SlotTable, spec: StreamSpec, input_ids, query_start_loc, pos, num_rows: int):
    """A step's inputs from vLLM's flattened batch: ``input_ids``/``pos`` [n] of every scheduled
    token, ``query_start_loc`` [R + 1] where each row's tokens start -> ([n, K] auxiliary ids,
    [R] position of each row's last token)."""
    n = input_ids.shape[0]
    qsl = query_start_loc.to(torch.int64)
    tok_slot = torch.repeat_interleave(table.row_slots[:num_rows], qsl[1:] - qsl[:-1], output_size=n)
    return inputs_at(table, spec, input_ids, pos, tok_slot), pos[qsl[1:] - 1]
