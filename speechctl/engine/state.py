"""Per-request decode state of the auxiliary streams, kept on the model's device.

The model owns one ``StreamRuntime``. vLLM only knows the primary token of each position, so
the runtime keeps, for every live request, the auxiliary tokens it sampled, keyed by
(request slot, generated-token index) rather than by batch row: rows move, requests are
preempted and recomputed, prompts are prefilled in chunks, and the state must survive all of it.

Each step runs in three eager phases around vLLM's (possibly CUDA-graphed) forward:

1. ``apply_batch_update`` (from the ``StreamTracker`` logits processor, before the forward):
   which request sits in which batch row; claims a slot for a new request.
2. ``input_streams`` (from ``embed_input_ids``, before the forward): the auxiliary tokens of every
   scheduled position, gathered on the device from the slot table.
3. ``sample`` (from ``compute_logits``, after the forward): samples the auxiliary streams for
   every row, applies the delay-pattern rules, records the tokens of rows whose sample is real
   and constrains the primary logits that vLLM will sample from.

No phase loops over requests in Python per step or syncs the device; Python work happens only
when requests join the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from speechctl.engine.params import StreamParams
from speechctl.engine.sampling import sample_streams
from speechctl.engine.streams import StreamSpec

NEVER = 1 << 40  # "no such step yet" for step-valued state


def slot_capacity(max_num_seqs: int) -> int:
    """Requests that may be alive in the engine at once (running or preempted)."""
    return 2 * max_num_seqs + 8


@dataclass
class _Step:
    num_rows: int
    row_slots: torch.Tensor  # [R] slot of each row
    last_pos: torch.Tensor  # [R] position of each row's last scheduled token


class StreamRuntime:
    def __init__(self, spec: StreamSpec, *, max_rows: int, max_len: int, device: torch.device):
        self.spec = spec
        self.pattern = spec.pattern
        self.device = device
        self.capacity = slot_capacity(max_rows)
        self.max_len = max_len
        self.scratch = self.capacity  # writes of rows without a real sample land here
        n = self.capacity + 1
        K = spec.num_codebooks

        def full(value, dtype=torch.int64):
            return torch.full((n,), value, dtype=dtype, device=device)

        self.prompt_len = full(0)
        self.audio_start = full(NEVER)  # generated index of the first audio step
        self.frames = full(-1)  # frames of the current audio once the lead stream ended it
        self.n_gen = full(0)  # generated tokens whose auxiliary tokens are recorded
        self.max_frames = full(NEVER)
        self.allow_audio = full(False, torch.bool)
        self.temperature = full(1.0, torch.float32)
        self.top_k = full(0)
        self.top_p = full(1.0, torch.float32)
        self.seed = full(0)
        # [slot, generated index, stream] auxiliary tokens; one spare index for clamped writes.
        self.gen_aux = torch.full((n, max_len + 1, K), self.pattern.pad, dtype=torch.int32, device=device)

        self.row_slots_host = np.full(max_rows, self.scratch, dtype=np.int64)
        self.row_slots = torch.full((max_rows,), self.scratch, dtype=torch.int64, device=device)
        self.slots: dict[str, int] = {}
        self._params: dict[int, StreamParams] = {}
        self._free = list(range(self.capacity - 1, -1, -1))
        self.view = None  # vllm_compat.StepView, attached once the engine is built
        self._step: _Step | None = None
        self.resumed = 0  # requests that came back after preemption (kept their slot)
        self.num_random = 0  # live slots with audio temperature > 0
        self.num_filtered = 0  # live slots with top-k / top-p on audio

        d = torch.tensor(self.pattern.delays, dtype=torch.int64, device=device)
        self._delays = d[None, :]  # [1, K]
        self._lead = self.pattern.lead
        self._is_lead = (torch.arange(K, device=device) == self._lead)[None, :]

    # -- phase 1: batch membership -------------------------------------------------------------

    def apply_batch_update(self, update: BatchUpdate | None) -> None:
        if update is None:
            return
        rows = self.row_slots_host
        for row in update.removed:
            rows[row] = self.scratch
        claimed = []
        for row, sampling_params, prompt_ids, _ in update.added:
            params = StreamParams.from_extra_args(sampling_params.extra_args)
            slot = self.slots.get(params.key)
            if slot is None:  # new request; a resumed (preempted) one keeps its slot and state
                slot = self._claim(params)
                claimed.append((slot, len(prompt_ids), params))
            else:
                self.resumed += 1
            rows[row] = slot
        for src, dst, how in update.moved:
            if how == MoveDirectionality.SWAP:
                rows[src], rows[dst] = rows[dst], rows[src]
            else:
                rows[dst], rows[src] = rows[src], self.scratch
        self.row_slots[: update.batch_size].copy_(torch.from_numpy(rows[: update.batch_size]), non_blocking=True)
        if claimed:
            self._init_slots(claimed)

    def _claim(self, params: StreamParams) -> int:
        if not self._free:
            raise RuntimeError(
                f"speechctl: more than {self.capacity} live requests; the engine must admit fewer"
            )
        slot = self._free.pop()
        self.slots[params.key] = slot
        self._params[slot] = params
        self.num_random += params.audio.temperature > 0
        self.num_filtered += params.audio.filters
        return slot

    def _init_slots(self, claimed: list[tuple[int, int, StreamParams]]) -> None:
        idx = torch.tensor([c[0] for c in claimed], dtype=torch.int64)

        def put(buf: torch.Tensor, values, dtype=torch.int64):
            buf.index_copy_(0, idx.to(buf.device), torch.tensor(values, dtype=dtype).to(buf.device))

        put(self.prompt_len, [c[1] for c in claimed])
        put(self.audio_start, [0 if p.starts_in_audio else NEVER for _, _, p in claimed])
        put(self.frames, [-1] * len(claimed))
        put(self.n_gen, [0] * len(claimed))
        put(self.max_frames, [p.max_frames for _, _, p in claimed])
        put(self.allow_audio, [p.allow_audio for _, _, p in claimed], torch.bool)
        put(self.temperature, [p.audio.temperature for _, _, p in claimed], torch.float32)
        put(self.top_k, [p.audio.top_k for _, _, p in claimed])
        put(self.top_p, [p.audio.top_p for _, _, p in claimed], torch.float32)
        put(self.seed, [p.seed & 0x7FFFFFFFFFFFFFFF for _, _, p in claimed])

    def stats(self) -> dict[str, int]:
        return {"live": len(self.slots), "resumed": self.resumed}

    def release(self, keys) -> None:
        """Free the slots of finished or aborted requests (called by the driver)."""
        for key in keys:
            slot = self.slots.pop(key, None)
            if slot is None:
                continue
            params = self._params.pop(slot)
            self.num_random -= params.audio.temperature > 0
            self.num_filtered -= params.audio.filters
            self._free.append(slot)

    # -- phase 2: inputs ----------------------------------------------------------------------

    def input_streams(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[n] scheduled primary ids -> [n, K] auxiliary ids of the same positions.

        Positions of generated tokens read the recorded auxiliary tokens; prompt positions get
        PAD (audio in prompts arrives as multimodal embeddings instead). Also applies the mode
        switches (<|audio_bos|>, <|audio_eos|>) of a request's newest generated token.
        """
        n = input_ids.shape[0]
        K = self.spec.num_codebooks
        if self.view is None or not self.view.live():  # profiling and warm-up runs
            self._step = None
            return torch.full((n, K), self.pattern.pad, dtype=torch.int64, device=input_ids.device)
        R = self.view.num_reqs()
        qsl = self.view.query_start_loc(R).to(torch.int64)
        pos = self.view.positions(n)
        row_slots = self.row_slots[:R]
        tok_slot = torch.repeat_interleave(row_slots, qsl[1:] - qsl[:-1], output_size=n)
        g = pos - self.prompt_len[tok_slot]
        is_gen = g >= 0
        aux = self.gen_aux[tok_slot, g.clamp(0, self.max_len)].to(torch.int64)
        aux = torch.where(is_gen[:, None], aux, self.pattern.pad)

        newest = is_gen & (g == self.n_gen[tok_slot] - 1)
        opens = torch.where(newest & (input_ids == self.spec.audio_bos_id), tok_slot, self.scratch)
        self.audio_start.index_put_((opens,), g + 1)
        self.frames.index_put_((opens,), torch.full_like(g, -1))
        closes = torch.where(newest & (input_ids == self.spec.audio_eos_id), tok_slot, self.scratch)
        self.audio_start.index_put_((closes,), torch.full_like(g, NEVER))

        self._step = _Step(R, row_slots, pos[qsl[1:] - 1])
        return aux

    # -- phase 3: sampling --------------------------------------------------------------------

    def sample(self, logits: torch.Tensor, aux_logits: torch.Tensor) -> torch.Tensor:
        """Sample the auxiliary streams; return the primary logits with the stream rules applied.

        logits: [R, V] primary logits (vLLM samples from what this returns).
        aux_logits: [R, K, Va] auxiliary logits.
        """
        step, self._step = self._step, None
        if step is None:
            return logits
        if logits.shape[0] != step.num_rows:
            raise RuntimeError(
                f"speechctl: {logits.shape[0]} logit rows for {step.num_rows} scheduled requests"
            )
        pat, spec = self.pattern, self.spec
        slots = step.row_slots
        g_next = step.last_pos + 1 - self.prompt_len[slots]  # generated index being sampled
        real = (g_next >= 0) & (g_next == self.n_gen[slots])  # not a partial prefill or replay
        a = g_next - self.audio_start[slots]  # audio step
        in_audio = (a >= 0)[:, None]
        frames = self.frames[slots][:, None]
        known = frames >= 0
        d = self._delays

        # Delay-pattern rules per (row, stream): forced token or -1 (free).
        forced = torch.where(a[:, None] < d, pat.bos, -1)
        forced = torch.where(known & (a[:, None] == frames + d), pat.eos, forced)
        forced = torch.where(known & (a[:, None] > frames + d), pat.pad, forced)
        cap = ~known & self._is_lead & ((a - d[0, self._lead])[:, None] >= self.max_frames[slots][:, None])
        forced = torch.where(cap, pat.eos, forced)
        forced = torch.where(in_audio, forced, pat.pad)  # text positions carry PAD
        eos_ok = ~known & self._is_lead & ((a - d[0, self._lead])[:, None] >= 1)

        # Free choices are codes; the lead stream may also end the audio (EOS).
        aux_logits = aux_logits.float()
        special = torch.full(aux_logits.shape[:2] + (3,), float("-inf"), device=aux_logits.device)
        special[..., pat.eos - pat.codebook_size] = torch.where(eos_ok, 0.0, float("-inf"))
        aux_logits[..., pat.codebook_size :] += special
        tokens = sample_streams(
            aux_logits,
            self.temperature[slots],
            self.top_k[slots],
            self.top_p[slots],
            self.seed[slots],
            g_next,
            any_random=self.num_random > 0,
            any_filter=self.num_filtered > 0,
        )
        tokens = torch.where(forced >= 0, forced, tokens)

        # Record the rows whose sample is real.
        w_slot = torch.where(real, slots, self.scratch)
        w_idx = g_next.clamp(0, self.max_len)
        self.gen_aux[w_slot, w_idx] = tokens.to(torch.int32)
        self.n_gen.index_put_((w_slot,), g_next + 1)
        ended = real & in_audio[:, 0] & ~known[:, 0] & (tokens[:, self._lead] == pat.eos)
        frames_now = torch.where(ended, a - d[0, self._lead], frames[:, 0])
        self.frames.index_put_((torch.where(ended, slots, self.scratch),), frames_now)

        # Primary stream: audio steps are <|audio|> until the flush ends, then <|audio_eos|>.
        done = (frames_now >= 0) & (a >= frames_now + pat.max_delay + 1)
        forced_primary = torch.where(done, spec.audio_eos_id, spec.audio_id)
        in_audio = in_audio[:, 0]
        neg = torch.finfo(logits.dtype).min
        onehot = torch.full_like(logits, neg).scatter_(1, forced_primary[:, None], 0.0)
        logits = torch.where(in_audio[:, None], onehot, logits)
        text = ~in_audio
        logits[:, spec.audio_id] = torch.where(text, neg, logits[:, spec.audio_id])
        logits[:, spec.audio_eos_id] = torch.where(text, neg, logits[:, spec.audio_eos_id])
        ban_open = text & ~self.allow_audio[slots]
        logits[:, spec.audio_bos_id] = torch.where(ban_open, neg, logits[:, spec.audio_bos_id])
        return logits

    # -- driver access ------------------------------------------------------------------------

    def collect(self, requests: list[tuple[str, int]]) -> list[np.ndarray]:
        """[(key, num generated tokens)] -> the [n, K] auxiliary tokens of each, in one copy."""
        if not requests:
            return []
        slots = torch.tensor([self.slots[k] for k, _ in requests], device=self.device)
        n = max(length for _, length in requests)
        block = self.gen_aux[slots, :n].cpu().numpy()
        return [block[i, :length] for i, (_, length) in enumerate(requests)]


class StreamTracker(LogitsProcessor):
    """A logits processor that changes no logits: vLLM's public hook that reports, before each
    forward, which request sits in which batch row. It forwards that to the model's runtime."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.runtime: StreamRuntime | None = None

    @classmethod
    def validate_params(cls, sampling_params):
        StreamParams.from_extra_args(sampling_params.extra_args)

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.runtime is not None:
            self.runtime.apply_batch_update(batch_update)
        elif batch_update is not None and batch_update.added:
            raise RuntimeError("speechctl: requests reached the model before the engine attached")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
