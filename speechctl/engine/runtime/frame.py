"""One frame of every row: the sampling phase of a step, as one function of tensors.

``sample_frame`` takes the step's logits and the rows' slots and does, on the device and without
a host sync: locate each row's generated index, force what the rules force (delays' BOS, EOS
lag, the length limits), merge CFG pairs (``guidance.py``), mask what the rules forbid, sample
the auxiliary streams under each row's settings (``sampling.py``), redraw repeats (RAS), record
the frame into the slot table and the step's record for the host (``readback.py``), and return
the primary logits vLLM samples from. ``StreamRuntime`` calls it (compiled on CUDA, replayed in
the per-step graphs); host facts arrive as arguments, so each of their combinations is one
traced variant.
"""

from __future__ import annotations

import torch

from speechctl.engine.runtime.guidance import find_pairs, guide, pair_primary
from speechctl.engine.runtime.repetition import redraw_repeats
from speechctl.engine.runtime.rules import FrameRules
from speechctl.engine.runtime.sampling import sample_streams
from speechctl.engine.runtime.slots import SlotTable


def sample_frame(table: SlotTable, rules: FrameRules, logits, aux_logits, given, slots, last_pos, *, paired: bool,
                 cfg_filter: bool, text_random: bool, repetition: bool, **flags) -> torch.Tensor:
    """[R, V] primary logits (+ [R, K, Va] auxiliary logits to sample, or [R, K] tokens the
    model ``given`` itself) -> the primary logits with the rules applied; the frame recorded.
    ``paired`` ... ``repetition``: whether some live request needs that work
    (``LiveSettings``); ``flags``: ``LiveSettings.sampling_flags``."""
    step = rules.locate(table, slots, last_pos)
    lead_in = table.lead_in[slots, step.a.clamp(0, table.lead_in.shape[1] - 1)]
    forced = rules.forced(step, table.max_frames[slots], lead_in)
    pairing = find_pairs(table, slots, step.g_next, step.real) if paired else None
    if given is None:
        aux_logits = aux_logits.float()
        # RAS redraws from the model's own logits under the rules' masks alone (repetition.py)
        raw = rules.restrict(aux_logits.clone(), step, table.min_frames[slots]) if repetition else None
        if pairing is not None:
            logits, aux_logits = guide(table, pairing, slots, logits, aux_logits, cfg_filter)
        aux_logits = rules.restrict(aux_logits, step, table.min_frames[slots])
        tokens = sample_streams(aux_logits, *table.audio.at(slots), table.seed[slots], step.g_next, **flags)
        if repetition:
            tokens = redraw_repeats(table, slots, step.g_next, tokens, raw, rules.spec.pattern.codebook_size)
        if pairing is not None:
            tokens = tokens[pairing.source]  # the unconditional row takes its partner's tokens
    else:
        tokens = given.to(torch.int64)
    tokens = torch.where(forced >= 0, forced, tokens)
    frames = rules.frames_after(step, tokens)
    record_frame(table, slots, step.g_next, step.real, tokens, frames)
    logits = rules.primary_logits(step, logits, tokens, frames, table.allow_audio[slots])
    if pairing is not None:
        logits = pair_primary(table, pairing, slots, step.g_next, logits, text_random)
    return logits


def record_frame(table: SlotTable, slots, g_next, real, tokens, frames) -> None:
    """Write the tokens [R, K] and the audio's frame count of the rows whose sample is real, and
    the step's record for the host (readback.py)."""
    w_slot = torch.where(real, slots, table.scratch)
    table.gen_aux[w_slot, g_next.clamp(0, table.max_len)] = tokens.to(torch.int32)
    table.n_gen.index_put_((w_slot,), g_next + 1)
    table.frames.index_put_((w_slot,), frames)
    K, R = tokens.shape[1], tokens.shape[0]
    record = table.readback.record
    record[:R, :K] = tokens
    record[:R, K] = slots
    record[:R, K + 1] = g_next
    record[:R, K + 2] = real.to(torch.int64) | (table.desync[slots] << 1)
    record[:R, K + 3] = table.epoch[slots]
