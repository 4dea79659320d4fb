"""Whisper's decoding rules inside vLLM's step, as one custom logits processor.

vLLM runs the model; :class:`WhisperDecoding` (vLLM's public ``LogitsProcessor`` interface) sees
each step's logits [rows, vocab] and chooses every row's next token itself, writing it back as a
one-hot row that vLLM's greedy sampler takes (requests run at temperature 0). Each request is a
*lane* with a slot in device buffers (``extra_args["whisper_slot"]``); the driver
(:mod:`speechctl.asr.whisper`) describes it with a :class:`LaneSpec` before adding it.

Per step, for all rows at once on the device (OpenAI's ``decoding.py`` order)::

    at a lane's first step (the <|startoftranscript|> position, the decoder prompt ends there)
        no-speech probability = softmax(raw logits)[<|nospeech|>]; detected language = the
        most likely language token (when the lane forces "the detected language")
    forced steps        the language / task / <|notimestamps|> tokens, one per step
    free steps          suppress_tokens; " " and <|endoftext|> at the first; the timestamp rules
                        (pairs, no decrease, first token a timestamp <= max_initial_timestamp,
                        a timestamp when their total probability beats any text token); then
                        log-softmax (the log-probabilities that fallback and ranking use)
    choice              greedy: argmax; sampling: Gumbel-max at the lane's temperature (noise
                        hashed from the lane's key and step: reproducible whatever the batch);
                        beam: top B+1 per lane -> host (:mod:`speechctl.asr.beam`) -> tokens,
                        and KV-cache copies for lanes that continue another lane's history

State that the rules need (tokens so far, last timestamp, sums of log-probabilities) lives in
device buffers indexed by slot and is updated from the chosen tokens, so a step without beam
lanes has no host round trip and no Python loop over rows. With beam lanes there is one small
device->host copy per step (the candidates) and one back (the choices).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from speechctl.asr.beam import BeamGroup, beam_step
from speechctl.asr.vocab import load_vocab

logger = logging.getLogger(__name__)

GREEDY, SAMPLE, BEAM = 0, 1, 2
DETECT = -2  # in LaneSpec.forced: the language detected at the first step
MAX_FORCED = 3  # language, task, <|notimestamps|>
SLOT_KEY = "whisper_slot"


@dataclass
class LaneSpec:
    """One request's decoding settings (set by the driver before the request is added)."""

    mode: int = GREEDY
    forced: tuple[int, ...] = ()  # tokens after <|startoftranscript|>
    prompt_len: int = 1
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    key: int = 0  # sampling noise seed
    timestamps: bool = False
    suppress_blank: bool = True
    max_initial: int = -1  # largest first timestamp index; -1: none
    group: BeamGroup | None = None
    lane: int = 0
    lane0_slot: int = -1  # beam lanes: the slot of the group's lane 0

    def __post_init__(self):
        if len(self.forced) > MAX_FORCED:
            raise ValueError(f"at most {MAX_FORCED} forced tokens")


@dataclass
class _GroupRows:
    """A beam group's lanes in this step's batch."""

    group: BeamGroup
    slots: list[int]
    rows: list[int] = field(default_factory=list)


class WhisperDecoding(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        self.pin = is_pin_memory and device.type == "cuda"
        self.vocab = v = load_vocab(Path(vllm_config.model_config.model))
        self.V = vllm_config.model_config.get_vocab_size()
        S = vllm_config.scheduler_config.max_num_seqs + 1  # the last slot stands for unknown rows
        self.capacity = S - 1
        self.kv = None  # vllm_compat.SelfAttentionKv, attached by the driver (beam search needs it)
        d = dict(device=device)
        self.n_out = torch.zeros(S, dtype=torch.long, **d)
        self.n_forced = torch.zeros(S, dtype=torch.long, **d)
        self.forced = torch.zeros(S, MAX_FORCED, dtype=torch.long, **d)
        self.ts_on = torch.zeros(S, dtype=torch.bool, **d)
        self.sblank = torch.zeros(S, dtype=torch.bool, **d)
        self.max_init = torch.full((S,), -1, dtype=torch.long, **d)
        self.temp = torch.ones(S, **d)
        self.top_k = torch.zeros(S, dtype=torch.long, **d)
        self.top_p = torch.ones(S, **d)
        self.key = torch.zeros(S, dtype=torch.long, **d)
        self.last_tok = torch.full((S,), -1, dtype=torch.long, **d)  # last timestamp token, -1: none yet
        # is the last free token a timestamp (True before the first: then the "penultimate" of the
        # first token is True, as OpenAI's rule has it; read as False at the first step)
        self.last_ts = torch.ones(S, dtype=torch.bool, **d)
        self.pen_ts = torch.ones(S, dtype=torch.bool, **d)
        self.sum_lp = torch.zeros(S, **d)
        self.no_speech = torch.zeros(S, **d)
        self.suppress_idx = torch.tensor([t for t in v.suppress if t < self.V], dtype=torch.long, **d)
        self.begin_idx = torch.tensor([t for t in v.begin_suppress if t < self.V], dtype=torch.long, **d)
        self.lang_ids = torch.tensor(sorted(v.languages.values()), dtype=torch.long, **d)
        self.ts_index = torch.arange(v.timestamp_begin, self.V, **d)
        self.specs: dict[int, LaneSpec] = {}
        self._opening: dict[int, LaneSpec] = {}  # opened, not yet written to the device buffers
        self.slot_of_row: dict[int, int] = {}
        self._changed = True
        self._probe_rows: list[int] = []
        # counts, and the host's seconds in ``apply`` (on a GPU: launching its kernels, plus the
        # beam steps' wait for their candidates) and in the beam steps alone
        self.stats = {"steps": 0, "beam_steps": 0, "kv_copies": 0, "unknown_rows": 0, "broken_groups": 0,
                      "apply_s": 0.0, "beam_s": 0.0}

    # -- the driver's side --------------------------------------------------------------------

    def open_lanes(self, lanes: dict[int, LaneSpec]) -> None:
        """Describe requests about to be added (slot -> spec). Their device state is written at
        the next step (``update_state``, which vLLM calls before every ``apply``) or by
        ``close_lanes``, for every lane opened since in one host->device copy:
        each small synchronous copy waits for the device, and an admission opens many groups."""
        self.specs.update(lanes)
        self._opening.update(lanes)

    def _write_opened(self) -> None:
        """The opened lanes' settings and fresh state into the device buffers: one int64 and one
        float32 table, copied without a wait, then scattered by slot on the device."""
        if not self._opening:
            return
        opening, self._opening = self._opening, {}
        ints = [[slot, len(s.forced), *s.forced, *[0] * (MAX_FORCED - len(s.forced)), s.timestamps,
                 s.suppress_blank, s.max_initial, s.top_k, s.key & 0x7FFFFFFFFFFFFFFF] for slot, s in opening.items()]
        floats = [[max(s.temperature, 1e-6), s.top_p] for s in opening.values()]
        i = self._to_device(torch.tensor(ints, dtype=torch.long))
        f = self._to_device(torch.tensor(floats, dtype=torch.float32))
        slots = i[:, 0]
        self.n_out[slots] = 0
        self.n_forced[slots] = i[:, 1]
        self.forced[slots] = i[:, 2 : 2 + MAX_FORCED]
        k = 2 + MAX_FORCED
        self.ts_on[slots] = i[:, k].bool()
        self.sblank[slots] = i[:, k + 1].bool()
        self.max_init[slots] = i[:, k + 2]
        self.top_k[slots] = i[:, k + 3]
        self.key[slots] = i[:, k + 4]
        self.temp[slots] = f[:, 0]
        self.top_p[slots] = f[:, 1]
        self.last_tok[slots] = -1
        self.last_ts[slots] = True
        self.pen_ts[slots] = True
        self.sum_lp[slots] = 0.0
        self.no_speech[slots] = float("nan")

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device; on a GPU from pinned memory without waiting (a pageable
        copy would wait for every kernel queued before it)."""
        if self.pin:
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def close_lanes(self, slots) -> dict[str, list]:
        """Forget finished requests; returns their per-lane results (sum of log-probabilities,
        no-speech probability, steps taken) in one device->host copy."""
        slots = list(slots)
        if not slots:
            return {"sum_logprob": [], "no_speech": [], "steps": []}
        self._write_opened()
        index = self._to_device(torch.tensor(slots, dtype=torch.long))
        values = torch.stack([self.sum_lp[index].double(), self.no_speech[index].double(), self.n_out[index].double()]).cpu()
        for s in slots:
            self.specs.pop(s, None)
        return {"sum_logprob": values[0].tolist(), "no_speech": values[1].tolist(), "steps": [int(x) for x in values[2]]}

    # -- vLLM's side --------------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self._write_opened()
        self._probe_rows = []
        if batch_update is None:
            return
        rows = self.slot_of_row
        for row in batch_update.removed:
            rows.pop(row, None)
        for added in batch_update.added:  # (row, params, prompt ids, output ids)
            row, params, output = added[0], added[1], added[-1]
            slot = (getattr(params, "extra_args", None) or {}).get(SLOT_KEY)
            if slot is None:
                rows.pop(row, None)
                continue
            rows[row] = slot
            if len(output) == 0:
                self._probe_rows.append(row)
            elif slot in self.specs and self.specs[slot].mode == BEAM:
                # Re-added after preemption: vLLM recomputes the lane from its own token list,
                # which is not the beam's history. (The KV cache is sized so that this does not
                # happen; if it does, the group starts again.)
                self.specs[slot].group.broken = True
        for src, dst, how in batch_update.moved:
            a, b = rows.pop(src, None), rows.pop(dst, None)
            if a is not None:
                rows[dst] = a
            if b is not None and how == MoveDirectionality.SWAP:
                rows[src] = b
        self._changed = True

    def _layout(self, R: int) -> None:
        """Row arrays for the current batch (recomputed when its make-up changes)."""
        slots = np.full(R, self.capacity, np.int64)
        sample, beam_groups = [], {}
        for row, slot in self.slot_of_row.items():
            if row >= R or slot not in self.specs:
                continue
            slots[row] = slot
            spec = self.specs[slot]
            if spec.mode == SAMPLE:
                sample.append(row)
            elif spec.mode == BEAM:
                entry = beam_groups.setdefault(id(spec.group), _GroupRows(spec.group, [-1] * spec.group.size))
                entry.slots[spec.lane] = slot
                entry.rows.append(row)
        self._R = R
        self._slots_np = slots
        self._slots = self._to_device(torch.from_numpy(slots))
        self._known = int((slots < self.capacity).sum())
        self._sample = self._to_device(torch.tensor(sample, dtype=torch.long)) if sample else None
        self._groups = list(beam_groups.values())
        row_of_slot = {s: r for r, s in enumerate(slots.tolist()) if s < self.capacity}
        self._row_of_slot = row_of_slot
        for g in self._groups:
            g.rows = [row_of_slot.get(s, -1) for s in g.slots]
        live = [self.specs[s] for s in slots.tolist() if s < self.capacity]
        self._ts_any = any(s.timestamps for s in live)
        # the sampling filters' shapes, from the host's specs (not from the device's buffers: that
        # would make the host wait for the device at every step)
        sampled = [s for s in live if s.mode == SAMPLE]
        self._max_top_k = max((s.top_k for s in sampled), default=0)
        self._any_top_p = any(s.top_p < 1 for s in sampled)
        self._changed = False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        out = self._apply(logits)
        self.stats["apply_s"] += time.perf_counter() - started
        return out

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        R = logits.shape[0]
        if self._changed or R != getattr(self, "_R", None):
            self._layout(R)
        if self._known == 0:
            return logits
        if self._known != R:
            self.stats["unknown_rows"] += R - self._known
        self.stats["steps"] += 1
        v = self.vocab
        slot = self._slots
        x = logits.float()
        n = self.n_out[slot]
        forced_row = n < self.n_forced[slot]
        first = ~forced_row & (n == self.n_forced[slot])

        # The first step of a lane: the <|startoftranscript|> position, raw logits.
        if self._probe_rows:
            self._probe(x, [r for r in self._probe_rows if r < R])
        ftok = self.forced[slot, n.clamp(max=MAX_FORCED - 1)]
        if self._probe_detect is not None:
            ftok = torch.where(ftok == DETECT, self._probe_detect, ftok)
        self._probe_detect = None

        self._filter(x, slot, forced_row, first)
        lp = torch.log_softmax(x, dim=-1)
        chosen = x.argmax(dim=-1)
        if self._sample is not None:
            chosen[self._sample] = self._draw(x[self._sample], slot[self._sample], n[self._sample])
        source = slot.clone()  # whose state a row's new state continues (beam: the parent lane)
        beam_free = torch.zeros(R, dtype=torch.bool, device=self.device)
        eot_rows: list[int] = []
        if self._groups:
            began = time.perf_counter()
            self._beam(lp, chosen, source, beam_free, eot_rows)
            self.stats["beam_s"] += time.perf_counter() - began
        chosen = torch.where(forced_row, ftok, chosen)
        if eot_rows:
            chosen[self._to_device(torch.tensor(eot_rows, dtype=torch.long))] = v.eot

        # State: log-probabilities of free (non-beam) choices, the timestamp state, the step.
        free = ~forced_row
        picked = lp.gather(1, chosen[:, None])[:, 0]
        self.sum_lp.index_add_(0, slot, torch.where(free & ~beam_free, picked, torch.zeros_like(picked)))
        is_ts = chosen >= v.timestamp_begin
        last_tok = torch.where(is_ts, chosen, self.last_tok[source])
        pen_ts = self.last_ts[source]
        self.last_tok[slot] = torch.where(free, last_tok, self.last_tok[slot])
        self.pen_ts[slot] = torch.where(free, pen_ts, self.pen_ts[slot])
        self.last_ts[slot] = torch.where(free, is_ts, self.last_ts[slot])
        self.n_out[slot] = n + 1

        logits.fill_(float("-inf"))
        logits.scatter_(1, chosen[:, None], 0.0)
        return logits

    _probe_detect = None

    def _probe(self, x: torch.Tensor, rows: list[int]) -> None:
        """No-speech probability and detected language at a lane's first step (beam lanes take
        their lane 0's, so that identical lanes stay identical)."""
        v = self.vocab
        src = []
        for r in rows:
            spec = self.specs.get(int(self._slots_np[r]))
            lane0 = spec.lane0_slot if spec is not None and spec.mode == BEAM else -1
            src.append(self._row_of_slot.get(lane0, r))
        idx, sidx = self._to_device(torch.tensor([rows, src], dtype=torch.long))
        raw = x[sidx]
        if v.no_speech is not None:
            self.no_speech[self._slots[idx]] = torch.softmax(raw, dim=-1)[:, v.no_speech]
        if self.lang_ids.numel():
            detect = torch.full((x.shape[0],), DETECT, dtype=torch.long, device=self.device)
            detect[idx] = self.lang_ids[raw[:, self.lang_ids].argmax(dim=-1)]
            self._probe_detect = detect

    def _filter(self, x: torch.Tensor, slot, forced_row, first) -> None:
        """OpenAI's logit filters, in place, for all rows (forced rows are overwritten later)."""
        v = self.vocab
        inf = float("-inf")
        if self.suppress_idx.numel():
            x.index_fill_(1, self.suppress_idx, inf)
        if self.begin_idx.numel():
            blank = (first & self.sblank[slot])[:, None]
            x[:, self.begin_idx] = torch.where(blank, inf, x[:, self.begin_idx])
        if not self._ts_any:
            return
        tsb, eot = v.timestamp_begin, v.eot
        ts = self.ts_on[slot] & ~forced_row
        x[:, v.no_timestamps] = torch.where(ts, inf, x[:, v.no_timestamps])
        last, pen, ltok = self.last_ts[slot] & ~first, self.pen_ts[slot], self.last_tok[slot]
        floor = torch.where(ltok < 0, tsb, torch.where(last & ~pen, ltok, ltok + 1))
        mask = ts[:, None] & (self.ts_index[None] < floor[:, None])
        mask |= (ts & last & pen)[:, None]  # two timestamps in a row: text next
        start = ts & first
        limit = self.max_init[slot]
        mask |= (start & (limit >= 0))[:, None] & (self.ts_index[None] > (tsb + limit)[:, None])
        x[:, tsb:].masked_fill_(mask, inf)
        x[:, :eot].masked_fill_((ts & last & ~pen)[:, None], inf)  # an opening timestamp: no text
        x[:, :tsb].masked_fill_(start[:, None], inf)  # the first token is a timestamp
        lp = torch.log_softmax(x, dim=-1)
        rule = ts & (torch.logsumexp(lp[:, tsb:], dim=-1) > lp[:, :tsb].max(dim=-1).values)
        x[:, :tsb].masked_fill_(rule[:, None], inf)

    def _draw(self, x: torch.Tensor, slot, n) -> torch.Tensor:
        """Sampled tokens: argmax(logits / T + Gumbel noise), the noise a hash of (key, step,
        token), after top-k / top-p."""
        z = x / self.temp[slot][:, None]
        k = self.top_k[slot]
        if self._max_top_k > 0:
            kth = z.topk(min(self._max_top_k, z.shape[1]), dim=-1).values.gather(1, (k.clamp(min=1) - 1).clamp(max=z.shape[1] - 1)[:, None])
            z = torch.where((k > 0)[:, None] & (z < kth), float("-inf"), z)
        p = self.top_p[slot]
        if self._any_top_p:
            sorted_z, order = z.sort(dim=-1, descending=True)
            probs = sorted_z.softmax(dim=-1)
            drop = (probs.cumsum(dim=-1) - probs) > p[:, None]
            z = z.scatter(1, order, sorted_z.masked_fill(drop, float("-inf")))
        u = hash_uniform(self.key[slot], n, z.shape[1])
        return (z - torch.log(-torch.log(u))).argmax(dim=-1)

    def _beam(self, lp, chosen, source, beam_free, eot_rows) -> None:
        """The beam groups' step: candidates to the host, choices and KV copies back."""
        stepping, by_size = [], {}
        for g in self._groups:
            group = g.group
            if group.done or group.broken or -1 in g.rows:
                if not group.done and not group.broken:
                    group.broken = True  # a lane is missing from this step: the beam cannot go on
                    self.stats["broken_groups"] += 1
                eot_rows.extend(r for r in g.rows if r >= 0)
                continue
            spec = self.specs[g.slots[0]]
            group.seen += 1
            if group.seen <= len(spec.forced):
                continue  # still in the forced prefix (the device forces it)
            stepping.append(g)
            by_size.setdefault(group.size, []).append(g)
        if not stepping:
            return
        self.stats["beam_steps"] += 1
        rows = [r for g in stepping for r in g.rows]
        ridx = self._to_device(torch.tensor(rows, dtype=torch.long))
        K = max(g.group.size for g in stepping) + 1
        top = lp[ridx].topk(K, dim=-1)
        # one device->host copy for both (token ids < 2**24 are exact in float32)
        both = torch.cat([top.values, top.indices.float()], dim=1).cpu().numpy()
        values, tokens = both[:, :K], both[:, K:].astype(np.int64)
        at = {r: i for i, r in enumerate(rows)}
        new_tok, new_src, copies = [], [], []
        for size, groups in by_size.items():
            pick = np.array([[at[r] for r in g.rows] for g in groups])
            choices = beam_step([g.group for g in groups], values[pick][:, :, : size + 1], tokens[pick][:, :, : size + 1])
            for g, choice in zip(groups, choices):
                if g.group.done:
                    eot_rows.extend(g.rows)  # finished: every lane ends now
                    continue
                prompt_len = self.specs[g.slots[0]].prompt_len
                kv_len = prompt_len + len(self.specs[g.slots[0]].forced) + g.group.step - 1
                for dest, parent, token in zip(choice.dest, choice.parent, choice.token):
                    new_tok.append((g.rows[dest], int(token)))
                    new_src.append((g.rows[dest], g.slots[parent]))
                    if dest != parent:
                        copies.append((g.rows[parent], g.rows[dest], kv_len))
        beam_free[ridx] = True
        if new_tok:
            r_idx, tok, src = self._to_device(torch.tensor([[r for r, _ in new_tok], [t for _, t in new_tok],
                                                           [s for _, s in new_src]], dtype=torch.long))
            chosen[r_idx] = tok
            source[r_idx] = src
        if copies:
            if self.kv is None:
                raise RuntimeError("beam search needs the KV copier (WhisperAsr attaches it)")
            self.kv.copy([c[0] for c in copies], [c[1] for c in copies], [c[2] for c in copies])
            self.stats["kv_copies"] += len(copies)


_M1 = -4658895280553007687  # 0xbf58476d1ce4e5b9 as int64
_M2 = -7723592293110705685  # 0x94d049bb133111eb
_G = -7046029254386353131  # 0x9e3779b97f4a7c15


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 (wrapping arithmetic; logical shifts by masking)."""
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _M1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _M2
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def hash_uniform(key: torch.Tensor, step: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, width] uniform numbers in (0, 1), a pure function of (key, step, column)."""
    base = _mix(_mix(key * _G + step) + 1)
    z = _mix(base[:, None] + torch.arange(width, device=key.device, dtype=torch.long)[None] * _G)
    return (((z >> 11) & ((1 << 53) - 1)).double() + 0.5).mul_(2.0**-53).float().clamp_(1e-12, 1 - 1e-7)
