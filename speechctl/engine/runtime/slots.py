"""The per-request decode state, on the model's device: one slot per live request.

vLLM knows only the primary token of each position. The slot table keeps, for every request in
the engine (running or preempted), the auxiliary tokens it generated and the settings its
per-step work needs, keyed by (slot, generated index) rather than by batch row: rows move,
requests are preempted and recomputed, prompts are prefilled in chunks, and the state must
survive all of it. Slot ``scratch`` (the last) belongs to no request: rows without a real sample
write there, so the per-step work never branches on the host.

Python runs here only when requests join or leave the batch (``admit``, ``release``), never per
step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from speechctl.engine.params import HISTORY, StreamParams
from speechctl.engine.runtime.readback import Readback
from speechctl.engine.runtime.settings import LiveSettings, SamplingColumns, general_audio_sampling
from speechctl.engine.streams import StreamSpec

NEVER = 1 << 40  # "no such step yet" for step-valued state


def slot_capacity(max_num_seqs: int) -> int:
    """Requests that may be alive in the engine at once (running or preempted)."""
    return 2 * max_num_seqs + 8


@dataclass(frozen=True)
class Admitted:
    """A request vLLM placed in a batch row: its row, its settings and its prompt's length."""

    row: int
    params: StreamParams
    prompt_len: int


@dataclass(frozen=True)
class Moved:
    """vLLM moved the request in row ``src`` to row ``dst`` (``swap``: and the other one back)."""

    src: int
    dst: int
    swap: bool


class SlotTable:
    """Device columns indexed by slot, and which slot each batch row holds."""

    def __init__(self, spec: StreamSpec, *, max_rows: int, max_len: int, device: torch.device,
                 depth_decoder: bool = False):
        self.device = device
        self.capacity = slot_capacity(max_rows)
        self.max_len = max_len
        self.scratch = self.capacity
        n = self.capacity + 1

        def full(value, dtype=torch.int64):
            return torch.full((n,), value, dtype=dtype, device=device)

        self.prompt_len = full(0)
        self.audio_start = full(NEVER)  # generated index of the first audio step
        self.frames = full(-1)  # frames of the current audio once the lead stream ended it
        self.n_gen = full(0)  # generated tokens whose auxiliary tokens are recorded
        self.max_frames = full(NEVER)
        self.min_frames = full(1)
        self.allow_audio = full(False, torch.bool)
        self.seed = full(0)
        self.audio = SamplingColumns(n, device, 1.0)
        self.depth = SamplingColumns(n, device, 1.0)  # a depth decoder's codebooks (CSM)
        self.text = SamplingColumns(n, device, 0.0)  # sampled here for CFG pairs only
        # Classifier-free guidance: the partner slot (scratch = none) and the merge settings.
        self.partner = full(self.scratch)
        self.conditional = full(True, torch.bool)
        self.cfg_scale = full(1.0, torch.float32)
        self.cfg_text = full(False, torch.bool)
        self.cfg_audio = full(False, torch.bool)
        self.cfg_top_k = full(0)
        self.desync = full(0)  # 1 once a paired row had no partner at its position
        self.epoch = full(0)  # which claim of the slot this is (readback.py)
        self.ras_window = full(0)  # repetition-aware sampling: window (0 = off) and limit
        self.ras_max = full(0)
        K, pad = spec.num_codebooks, spec.pattern.pad
        self.history = torch.full((n, HISTORY, K), pad, dtype=torch.int32, device=device)  # prompt audio's last steps
        # [slot, generated index, stream] auxiliary tokens; one spare index for clamped writes.
        self.gen_aux = torch.full((n, max_len + 1, K), pad, dtype=torch.int32, device=device)
        self._pad = pad
        # [slot, generated index < max delay, stream] forced first tokens (-1: by rule): an audio
        # prompt's continuation (encoder-decoder families' decoder prompts, continued speech).
        self.lead_in = torch.full((n, max(1, spec.pattern.max_delay), K), -1, dtype=torch.int32, device=device)
        self._leads_in = np.zeros(n, dtype=bool)  # (host) slots whose last claim wrote a lead-in
        # Encoder-decoder families: [slot, prompt position, stream] the decoder prompt's tokens.
        self.prompt_aux = None
        if spec.prompt_streams:
            self.prompt_aux = torch.full((n, max_len + 1, K), pad, dtype=torch.int32, device=device)
        self.readback = Readback(slots=n, max_rows=max_rows, max_len=max_len, num_codebooks=K, pad=pad, device=device)
        self._claims = 0

        self.row_slots_host = np.full(max_rows, self.scratch, dtype=np.int64)
        self.row_slots = torch.full((max_rows,), self.scratch, dtype=torch.int64, device=device)
        self.slots: dict[str, int] = {}  # request key -> slot
        self._params: dict[int, StreamParams] = {}
        self._free = list(range(self.capacity - 1, -1, -1))
        self.settings = LiveSettings(general_audio=general_audio_sampling(device), depth_decoder=depth_decoder,
                                     vocab=spec.pattern.vocab_size)
        self.resumed = 0  # requests that came back after preemption (kept their slot)

    # -- membership ----------------------------------------------------------------------------

    def admit(self, batch_size: int, removed: list[int], added: list[Admitted], moved: list[Moved]) -> None:
        """Apply a batch update: rows freed, requests placed (a new one claims a slot; one resumed
        after preemption keeps its slot and state), rows moved."""
        rows = self.row_slots_host
        for row in removed:
            rows[row] = self.scratch
        claimed = []
        for a in added:
            slot = self.slots.get(a.params.key)
            if slot is None:
                slot = self._claim(a.params)
                claimed.append((slot, a))
            else:
                self.resumed += 1
            rows[a.row] = slot
        for m in moved:
            if m.swap:
                rows[m.src], rows[m.dst] = rows[m.dst], rows[m.src]
            else:
                rows[m.dst], rows[m.src] = rows[m.src], self.scratch
        # All rows, not the batch's alone: the per-step graphs read the rows past the batch too
        # (a bucket's padding, ``InPlace``), and there they must name the scratch slot.
        self.row_slots.copy_(self._staged(rows), non_blocking=True)
        if claimed:
            self._initialise(claimed)
            self._link_partners([a.params for _, a in claimed if a.params.partner is not None])

    def reserve_rows(self, rows: int) -> None:
        """Row slots for batches of ``rows`` rows: a per-step graph reads its whole bucket of
        them, and vLLM's largest bucket goes past ``max_num_seqs``. Before the first request,
        and before any graph reads them: growing makes a new tensor."""
        if rows > self.row_slots_host.shape[0]:
            assert not self.slots, "the row slots grow only before the first request"
            self.row_slots_host = np.full(rows, self.scratch, dtype=np.int64)
            self.row_slots = torch.full((rows,), self.scratch, dtype=torch.int64, device=self.device)
        self.readback.reserve_rows(rows)

    def _claim(self, params: StreamParams) -> int:
        if not self._free:
            raise RuntimeError(f"speechctl: more than {self.capacity} live requests; the engine must admit fewer")
        slot = self._free.pop()
        self.slots[params.key] = slot
        self._params[slot] = params
        self.settings.count(params, +1)
        return slot

    def rows_of_tags(self, tags: list[int], tag_of) -> list[int]:
        """The batch row of each live request named by ``tag_of(key)`` in ``tags`` (a large
        number for one not in the batch)."""
        slot_of = {tag_of(key): slot for key, slot in self.slots.items()}
        row_of = {int(slot): row for row, slot in enumerate(self.row_slots_host)}
        return [row_of.get(slot_of.get(tag, -1), 1 << 30) for tag in tags]

    def release(self, keys) -> None:
        """Free the slots of finished or aborted requests."""
        for key in keys:
            slot = self.slots.pop(key, None)
            if slot is not None:
                self.settings.count(self._params.pop(slot), -1)
                self._free.append(slot)

    def _link_partners(self, members: list[StreamParams]) -> None:
        """Point both members of a CFG pair at each other once both hold slots."""
        pairs = [(self.slots[p.key], self.slots[p.partner]) for p in members if p.partner in self.slots]
        if pairs:
            a, b = self._to_device(np.array(pairs, dtype=np.int64).T.copy())
            self.partner.index_copy_(0, a, b)
            self.partner.index_copy_(0, b, a)

    def _initialise(self, claimed: list[tuple[int, Admitted]]) -> None:
        """Write the claimed slots' columns: one host-to-device copy per dtype."""
        ps = [a.params for _, a in claimed]
        epochs = list(range(self._claims + 1, self._claims + 1 + len(ps)))
        self._claims += len(ps)
        self.readback.claimed([slot for slot, _ in claimed], epochs)
        columns = [
            (self.prompt_len, [a.prompt_len for _, a in claimed]),
            (self.audio_start, [0 if p.starts_in_audio else NEVER for p in ps]),
            (self.frames, [-1] * len(ps)),
            (self.n_gen, [0] * len(ps)),
            (self.max_frames, [p.max_frames for p in ps]),
            (self.min_frames, [p.min_frames for p in ps]),
            (self.seed, [p.seed & 0x7FFFFFFFFFFFFFFF for p in ps]),
            (self.partner, [self.scratch] * len(ps)),
            (self.cfg_top_k, [p.guidance.top_k for p in ps]),
            (self.desync, [0] * len(ps)),
            (self.epoch, epochs),
            (self.ras_window, [p.repetition[0] if p.repetition else 0 for p in ps]),
            (self.ras_max, [p.repetition[1] if p.repetition else 0 for p in ps]),
            (self.cfg_scale, [p.guidance.scale for p in ps]),
            (self.allow_audio, [p.allow_audio for p in ps]),
            (self.conditional, [p.conditional for p in ps]),
            (self.cfg_text, [p.guidance.streams in ("text", "both") for p in ps]),
            (self.cfg_audio, [p.guidance.streams in ("audio", "both") for p in ps]),
            *self.audio.columns([p.audio for p in ps]),
            *self.depth.columns([p.depth or p.audio for p in ps]),
            *self.text.columns([p.text for p in ps]),
        ]
        claimed_slots = np.array([slot for slot, _ in claimed], dtype=np.int64)
        idx = self._to_device(claimed_slots)
        for dtype in (torch.int64, torch.float32, torch.bool):
            fields = [(buf, values) for buf, values in columns if buf.dtype == dtype]
            rows = self._to_device(torch.tensor([v for _, v in fields], dtype=dtype, device="cpu"))  # [fields, claimed]
            for (buf, _), row in zip(fields, rows):
                buf.index_copy_(0, idx, row)
        if any(p.repetition for p in ps):  # the prompt audio's last steps, right-aligned
            history = np.full((len(ps), HISTORY, self.history.shape[2]), self._pad, dtype=np.int32)
            for i, p in enumerate(ps):
                if p.history:
                    steps = np.asarray(p.history, dtype=np.int32)[-HISTORY:]
                    history[i, HISTORY - len(steps):] = steps
            self.history.index_copy_(0, idx, self._to_device(history))
        if any(p.lead_in for p in ps) or self._leads_in[claimed_slots].any():
            self._write_lead_in(idx, claimed_slots, ps)
        if self.prompt_aux is not None:
            self._write_prompt_streams(idx, ps)

    def _write_lead_in(self, idx: torch.Tensor, slots: np.ndarray, ps: list[StreamParams]) -> None:
        """The claimed slots' forced first tokens (a slot's earlier claim's reset), in one copy."""
        lead = np.full((len(ps),) + tuple(self.lead_in.shape[1:]), -1, dtype=np.int32)
        for i, p in enumerate(ps):
            if p.lead_in:
                lead[i, : len(p.lead_in)] = np.asarray(p.lead_in)[: lead.shape[1]]
        self.lead_in.index_copy_(0, idx, self._to_device(lead))
        self._leads_in[slots] = [bool(p.lead_in) for p in ps]

    def _write_prompt_streams(self, idx: torch.Tensor, ps: list[StreamParams]) -> None:
        """The claimed slots' decoder-prompt tokens, in one copy."""
        prompt = np.full((len(ps),) + tuple(self.prompt_aux.shape[1:]), self._pad, dtype=np.int32)
        for i, p in enumerate(ps):
            if len(p.prompt_steps) > prompt.shape[1]:
                raise RuntimeError(f"speechctl: a decoder prompt of {len(p.prompt_steps)} positions is past max_len")
            if p.prompt_steps:
                prompt[i, : len(p.prompt_steps)] = p.prompt_steps
        self.prompt_aux.index_copy_(0, idx, self._to_device(prompt))

    def _to_device(self, host) -> torch.Tensor:
        """A host array as a tensor on the table's device (see ``_staged``)."""
        return self._staged(host).to(self.device, non_blocking=True)

    def _staged(self, host) -> torch.Tensor:
        """A host array as a tensor to copy to the device without waiting for it: a copy from
        pageable memory makes CUDA drain the stream first, which would stall the asynchronously
        scheduled step; from pinned memory it is queued like a kernel (the pinned block stays
        reserved until the copy has run, so later host writes cannot reach it)."""
        t = torch.from_numpy(host) if isinstance(host, np.ndarray) else host
        return t.pin_memory() if self.device.type == "cuda" else t

    # -- reading it back -----------------------------------------------------------------------

    def collect(self, spans: list[tuple[str, int, int]]) -> list[tuple[np.ndarray, int]]:
        """[(key, start, end)] -> (the [end - start, K] auxiliary tokens of generated positions
        start..end-1, desync flag) of each request, read from the host's mirror (readback.py)."""
        return self.readback.collect([(self.slots[k], start, end) for k, start, end in spans]) if spans else []

    def digest(self) -> str:
        """A hash of the whole state (every slot, stale ones included): equal on every
        tensor-parallel rank when the ranks sampled and recorded the same tokens."""
        digest = hashlib.sha256()
        for tensor in (self.gen_aux, self.n_gen, self.frames, self.audio_start, self.desync):
            digest.update(tensor.cpu().numpy().tobytes())
        return digest.hexdigest()
