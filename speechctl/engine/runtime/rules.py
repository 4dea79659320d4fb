"""The output side's rules: a family's delay pattern and end rules (``StreamSpec.pattern`` and
``StreamSpec.rules``, plain data) applied on the device to every row of a step.

For each row the step knows its generated index and its audio step ``a`` (generated steps since
the audio opened). Per (row, stream), with delays d and ``frames`` the lead stream's code count
once the audio has ended::

    a < d[k]                          BOS   (the stream has not started), or the request's
                                            lead-in (an audio prompt's continuation, Dia)
    a == frames + d[k] + eos_lag      EOS   (its end, once the audio has ended; PAD if the
                                            family has no end token, MusicGen)
    a >  frames + d[k] + eos_lag      PAD   (EOS again where PAD is EOS)
    lead stream, max_frames reached   EOS   (no token, the audio just ends, without end token)
    otherwise                         free: a code, or EOS where ``eos_allowed`` (Dia: only
                                            where EOS is the lead's top choice, and then EOS)

The primary stream follows the audio: ``<|audio|>`` (the flush token once the audio is ending)
per step, ``<|audio_eos|>`` at the first step where every stream has ended (or at the family's
``stop_offset``); at text positions the audio tokens are banned, and so is ``<|audio_bos|>`` for
requests that may not open audio.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from speechctl.engine.runtime.slots import SlotTable
from speechctl.engine.streams import StreamSpec


class RowStep(NamedTuple):
    """Where each row of a step stands ([R] unless noted)."""

    g_next: torch.Tensor  # generated index being sampled
    real: torch.Tensor  # the sample is the request's next token (not a partial prefill or replay)
    a: torch.Tensor  # audio step (negative before the audio opened)
    in_audio: torch.Tensor  # [R, 1]
    frames: torch.Tensor  # [R, 1] the audio's frame count once it ended, else -1
    known: torch.Tensor  # [R, 1] the audio has ended


class FrameRules:
    def __init__(self, spec: StreamSpec, device: torch.device):
        self.spec = spec
        pattern, rules = spec.pattern, spec.rules
        K = pattern.num_streams
        self.delays = torch.tensor(pattern.delays, dtype=torch.int64, device=device)[None, :]  # [1, K]
        self.lead_delay = pattern.delays[pattern.lead]
        self.is_lead = (torch.arange(K, device=device) == pattern.lead)[None, :]
        self.eos_lag = rules.eos_lag
        # Higgs' reference masks nothing where a stream is free (BOS and EOS may come anywhere,
        # any stream's EOS ends the audio); the generic rules let only the lead stream end it.
        self.open_vocab = rules.open_vocab
        self.end_frame = rules.eos_frame  # CSM: the audio ends with a frame of this code, not by EOS
        self.rules = rules
        self.stop_step = None if rules.stop_offset is None else pattern.max_delay + rules.eos_lag + rules.stop_offset
        self.vocab_size = 0  # the primary logits' width where a model has no text head (StreamRuntime.ruled)

    def locate(self, table: SlotTable, slots: torch.Tensor, last_pos: torch.Tensor) -> RowStep:
        g_next = last_pos + 1 - table.prompt_len[slots]
        real = (g_next >= 0) & (g_next == table.n_gen[slots])
        a = g_next - table.audio_start[slots]
        frames = table.frames[slots][:, None]
        return RowStep(g_next, real, a, (a >= 0)[:, None], frames, frames >= 0)

    def forced(self, step: RowStep, max_frames: torch.Tensor, lead_in: torch.Tensor) -> torch.Tensor:
        """[R, K] the token each stream must take, or -1 where it is free. ``lead_in`` [R, K]:
        the rows' forced tokens before a stream's delay (-1: BOS), an audio prompt's
        continuation."""
        pat, d, a = self.spec.pattern, self.delays, step.a[:, None]
        end = step.frames + d + self.eos_lag
        start = torch.where(lead_in >= 0, lead_in.to(torch.int64), pat.bos)
        forced = torch.where(a < d, start, -1)
        forced = torch.where(step.known & (a == end), pat.eos if self.rules.end_token else pat.pad, forced)
        forced = torch.where(step.known & (a > end), pat.pad, forced)
        cap = ~step.known & self.is_lead & (a - self.lead_delay >= max_frames[:, None])
        forced = torch.where(cap, pat.eos if self.rules.end_token else pat.pad, forced)
        return torch.where(step.in_audio, forced, pat.pad)  # text positions carry PAD

    def restrict(self, aux_logits: torch.Tensor, step: RowStep, min_frames: torch.Tensor) -> torch.Tensor:
        """[R, K, Va] logits with the free choices' rules: codes, EOS where it may end the audio
        (past ``min_frames``), BOS too with an open vocabulary; PAD never."""
        pat = self.spec.pattern
        enough = (step.a - self.lead_delay)[:, None] >= min_frames[:, None]
        if self.open_vocab:
            eos_ok = step.known | enough
        else:
            eos_ok = ~step.known & self.is_lead & enough & self.rules.end_token
        C = pat.codebook_size
        special = torch.full(aux_logits.shape[:2] + (pat.vocab_size - C,), float("-inf"), device=aux_logits.device)
        if self.open_vocab:
            special[..., pat.bos - C].fill_(0.0)  # fill_: no host scalar copy (graph capture)
        special[..., pat.eos - C] = torch.where(eos_ok, 0.0, float("-inf"))
        aux_logits[..., C:] += special
        if self.rules.eos_if_top:  # Dia: EOS is taken exactly where it is the top choice
            top_is_eos = (aux_logits.argmax(dim=-1) == pat.eos)[..., None]  # [R, K, 1]
            is_eos = torch.arange(pat.vocab_size, device=aux_logits.device) == pat.eos
            aux_logits = aux_logits.masked_fill(top_is_eos != is_eos, float("-inf"))
        return aux_logits

    def frames_after(self, step: RowStep, tokens: torch.Tensor) -> torch.Tensor:
        """[R] the audio's frame count after this step's tokens [R, K] (-1 while it runs): the
        first EOS of a stream in audio ends it (only the lead's can, unless the vocabulary is
        open); with an end frame (CSM) no token does."""
        frames = step.frames[:, 0]
        if self.end_frame is not None:
            return frames
        pat = self.spec.pattern
        if self.rules.end_token:
            ended = (tokens == pat.eos).any(dim=-1)
        else:  # MusicGen: the lead's PAD at its cap (forced; PAD may be its BOS too) ends it
            ended = (tokens[:, pat.lead] == pat.pad) & (step.a >= self.lead_delay)
        first_eos = step.in_audio[:, 0] & ~step.known[:, 0] & ended
        return torch.where(first_eos, step.a - self.lead_delay, frames)

    def primary_logits(self, step: RowStep, logits: torch.Tensor | None, tokens: torch.Tensor, frames: torch.Tensor,
                       allow_audio: torch.Tensor) -> torch.Tensor:
        """[R, V] primary logits with the primary stream's rules (module doc); ``frames`` from
        ``frames_after``. ``logits`` None: the model has no text head and every row it samples
        is audio (its prompts open the audio), so the logits are the ruled one-hot alone."""
        spec, pat = self.spec, self.spec.pattern
        ending = frames >= 0
        if self.stop_step is not None:  # Dia, MusicGen: a fixed step after the end
            done = ending & (step.a == frames + self.stop_step)
        elif self.end_frame is None:
            done = ending & (tokens == pat.pad).all(dim=-1)
        else:  # CSM: a frame whose codebooks but the last all hold the end code is the last
            done = (tokens[:, :-1] == self.end_frame).all(dim=-1)
        ruled = torch.where(done, spec.audio_eos_id, torch.where(ending, spec.flush_id, spec.audio_id))
        if logits is None:
            neg = torch.finfo(torch.float32).min
            return torch.full((ruled.shape[0], self.vocab_size), neg, device=ruled.device).scatter_(1, ruled[:, None], 0.0)
        in_audio = step.in_audio[:, 0]
        neg = torch.finfo(logits.dtype).min
        onehot = torch.full_like(logits, neg).scatter_(1, ruled[:, None], 0.0)
        logits = torch.where(in_audio[:, None], onehot, logits)
        text = ~in_audio
        logits[:, spec.audio_id] = torch.where(text, neg, logits[:, spec.audio_id])
        logits[:, spec.audio_eos_id] = torch.where(text, neg, logits[:, spec.audio_eos_id])
        ban_open = text & ~allow_audio
        logits[:, spec.audio_bos_id] = torch.where(ban_open, neg, logits[:, spec.audio_bos_id])
        return logits
