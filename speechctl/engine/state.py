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

import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from speechctl.accelerator import has_cuda
from speechctl.engine.graphs import StepGraphs, step_graphs_enabled
from speechctl.engine.params import StreamParams
from speechctl.engine.sampling import frame_sampler, sample_streams
from speechctl.engine.streams import StreamSpec
from speechctl.errors import EngineError

NEVER = 1 << 40  # "no such step yet" for step-valued state


def compile_per_step_work() -> bool:
    """torch.compile the per-step work: the runtime's input and sampling steps, CSM's depth
    decoder. On by default on CUDA, where it fuses launch-bound chains of small kernels (H200:
    CSM 1B 92 -> 102 frames/s at c=1; docs/benchmarks/throughput.md) for a longer start-up
    (``SpeechEngine.warm_up`` compiles there; CSM 1B 114 s vs 32 s with inductor's on-disk cache
    cold); off on the CPU, where compiling would dominate a short run. ``SPEECHCTL_COMPILE=0``
    / ``1`` overrides."""
    setting = os.environ.get("SPEECHCTL_COMPILE", "")
    if setting not in ("", "0", "1"):
        raise EngineError(f"SPEECHCTL_COMPILE={setting!r}: use 1 (compile the per-step work) or 0 (do not)")
    return setting == "1" if setting else has_cuda()


def slot_capacity(max_num_seqs: int) -> int:
    """Requests that may be alive in the engine at once (running or preempted)."""
    return 2 * max_num_seqs + 8


@dataclass
class _Pairing:
    guided: torch.Tensor  # [R] conditional rows of pairs whose partner is in step
    source: torch.Tensor  # [R] the row whose tokens a row takes (its partner for uncond rows)
    partner_row: torch.Tensor  # [R] the partner's row (0 where there is none; masked by guided)


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
        self.min_frames = full(1)
        self.allow_audio = full(False, torch.bool)
        self.temperature = full(1.0, torch.float32)
        self.top_k = full(0)
        self.top_p = full(1.0, torch.float32)
        self.seed = full(0)
        # Classifier-free guidance: the partner slot (scratch = none) and the merge settings.
        self.partner = full(self.scratch)
        self.conditional = full(True, torch.bool)
        self.cfg_scale = full(1.0, torch.float32)
        self.cfg_text = full(False, torch.bool)
        self.cfg_audio = full(False, torch.bool)
        self.cfg_top_k = full(0)
        self.text_temperature = full(0.0, torch.float32)
        self.text_top_k = full(0)
        self.text_top_p = full(1.0, torch.float32)
        self.depth_temperature = full(1.0, torch.float32)  # a depth decoder's codebooks (CSM)
        self.depth_top_k = full(0)
        self.depth_top_p = full(1.0, torch.float32)
        self.desync = full(0)  # 1 once a paired row had no partner at its position
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
        self.num_paired = 0  # live slots that belong to a CFG pair
        self.num_cfg_filter = 0  # live pairs using Dia's CFG top-k filter
        self.num_text_random = 0  # live paired slots sampling text with temperature > 0
        self.num_depth_random = 0  # live slots sampling depth-decoded codebooks at temperature > 0
        # top-k of the live slots that filter (top-k / top-p): audio, depth-decoded codebooks
        self._top_ks: dict[bool, Counter[int]] = {False: Counter(), True: Counter()}
        self._top_ps: dict[bool, int] = {False: 0, True: 0}  # rows with top_p < 1

        if compile_per_step_work():  # fuse the per-step elementwise work: kernel launches dominate it
            self._input_step = torch.compile(self._input_step, dynamic=True)
            self._sample_step = torch.compile(self._sample_step, dynamic=True)
        # CUDA graphs of the per-step work (engine/graphs.py), set up once vLLM's batch sizes are
        # known (``use_step_graphs``); separate pools: the input graph's output is still read by
        # the forward when the logits graph runs.
        self._graphs: tuple[StepGraphs | None, StepGraphs | None] = (None, None)
        self._input_graphs, self._logits_graphs = self._graphs

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
        self.row_slots[: update.batch_size].copy_(self._staged(rows[: update.batch_size]), non_blocking=True)
        if claimed:
            self._init_slots(claimed)
            self._link_partners([p for _, _, p in claimed if p.partner is not None])

    def _claim(self, params: StreamParams) -> int:
        if not self._free:
            raise RuntimeError(
                f"speechctl: more than {self.capacity} live requests; the engine must admit fewer"
            )
        slot = self._free.pop()
        self.slots[params.key] = slot
        self._params[slot] = params
        self._count(params, +1)
        return slot

    def _count(self, params: StreamParams, sign: int) -> None:
        depth = params.depth or params.audio
        self.num_depth_random += sign * (depth.temperature > 0)
        self.num_random += sign * (params.audio.temperature > 0)
        for deep, sampling in ((False, params.audio), (True, depth)):
            if sampling.filters:
                self._top_ks[deep][sampling.top_k] += sign
            self._top_ps[deep] += sign * (sampling.top_p < 1)
        if params.partner is not None:
            self.num_paired += sign
            self.num_cfg_filter += sign * (params.guidance.top_k > 0)
            self.num_text_random += sign * (params.text.temperature > 0)

    def _link_partners(self, members: list[StreamParams]) -> None:
        """Point both members of a pair at each other once both hold slots."""
        pairs = [(self.slots[p.key], self.slots[p.partner]) for p in members if p.partner in self.slots]
        if pairs:
            a, b = self._to_device(np.array(pairs, dtype=np.int64).T.copy())
            self.partner.index_copy_(0, a, b)
            self.partner.index_copy_(0, b, a)

    def _init_slots(self, claimed: list[tuple[int, int, StreamParams]]) -> None:
        ps = [p for _, _, p in claimed]
        depths = [p.depth or p.audio for p in ps]
        columns = {  # dtype: [(buffer, the claimed requests' values)]
            torch.int64: [
                (self.prompt_len, [c[1] for c in claimed]),
                (self.audio_start, [0 if p.starts_in_audio else NEVER for p in ps]),
                (self.frames, [-1] * len(ps)),
                (self.n_gen, [0] * len(ps)),
                (self.max_frames, [p.max_frames for p in ps]),
                (self.min_frames, [p.min_frames for p in ps]),
                (self.top_k, [p.audio.top_k for p in ps]),
                (self.seed, [p.seed & 0x7FFFFFFFFFFFFFFF for p in ps]),
                (self.partner, [self.scratch] * len(ps)),
                (self.cfg_top_k, [p.guidance.top_k for p in ps]),
                (self.text_top_k, [p.text.top_k for p in ps]),
                (self.depth_top_k, [d.top_k for d in depths]),
                (self.desync, [0] * len(ps)),
            ],
            torch.float32: [
                (self.temperature, [p.audio.temperature for p in ps]),
                (self.top_p, [p.audio.top_p for p in ps]),
                (self.cfg_scale, [p.guidance.scale for p in ps]),
                (self.text_temperature, [p.text.temperature for p in ps]),
                (self.text_top_p, [p.text.top_p for p in ps]),
                (self.depth_temperature, [d.temperature for d in depths]),
                (self.depth_top_p, [d.top_p for d in depths]),
            ],
            torch.bool: [
                (self.allow_audio, [p.allow_audio for p in ps]),
                (self.conditional, [p.conditional for p in ps]),
                (self.cfg_text, [p.guidance.streams in ("text", "both") for p in ps]),
                (self.cfg_audio, [p.guidance.streams in ("audio", "both") for p in ps]),
            ],
        }
        idx = self._to_device(np.array([c[0] for c in claimed], dtype=np.int64))
        for dtype, fields in columns.items():  # one copy per dtype: [fields, claimed]
            values = self._to_device(torch.tensor([v for _, v in fields], dtype=dtype))
            for (buf, _), row in zip(fields, values):
                buf.index_copy_(0, idx, row.to(buf.dtype))

    def _to_device(self, host) -> torch.Tensor:
        """A host array as a tensor on the runtime's device (see ``_staged``)."""
        return self._staged(host).to(self.device, non_blocking=True)

    def _staged(self, host) -> torch.Tensor:
        """A host array as a tensor to copy to the device without waiting for it: a copy from
        pageable memory makes CUDA drain the stream first, which would stall the asynchronously
        scheduled step; from pinned memory it is queued like a kernel (the pinned block stays
        reserved until the copy has run, so later host writes cannot reach it)."""
        t = torch.from_numpy(host) if isinstance(host, np.ndarray) else host
        return t.pin_memory() if self.device.type == "cuda" else t

    def _sampling_flags(self, depth: bool = False) -> dict:
        """Host facts about the live slots' audio sampling settings (``depth``: their depth
        decoder's) that let ``sample_streams`` skip work no row needs: whether some / every slot
        samples at temperature > 0, whether some filters, the largest top-k among those (0 if one
        filters by top-p alone: then candidates need a full sort), whether some filters by top-p.
        Part of every graph key."""
        random = self.num_depth_random if depth else self.num_random
        ks = [k for k, n in self._top_ks[depth].items() if n > 0]
        return {"any_random": random > 0, "all_random": 0 < random == len(self.slots), "any_filter": bool(ks),
                "max_top_k": 0 if not ks or 0 in ks else max(ks), "any_top_p": self._top_ps[depth] > 0}

    def state_digest(self) -> str:
        """A hash of the whole stream state (every slot, stale ones included): equal on every
        tensor-parallel rank when the ranks sampled and recorded the same tokens."""
        import hashlib

        state = (self.gen_aux, self.n_gen, self.frames, self.audio_start, self.desync)
        digest = hashlib.sha256()
        for tensor in state:
            digest.update(tensor.cpu().numpy().tobytes())
        return digest.hexdigest()

    def stats(self) -> dict[str, int]:
        captures = sum(g.captured for g in self._graphs if g is not None)
        return {"live": len(self.slots), "resumed": self.resumed, "paired": self.num_paired, "graph_captures": captures}

    def release(self, keys) -> None:
        """Free the slots of finished or aborted requests (called by the driver)."""
        for key in keys:
            slot = self.slots.pop(key, None)
            if slot is None:
                continue
            self._count(self._params.pop(slot), -1)
            self._free.append(slot)

    # -- phase 2: inputs ----------------------------------------------------------------------

    def use_step_graphs(self, sizes) -> None:
        """Replay the per-step work as CUDA graphs for batches of up to max(sizes) rows."""
        if step_graphs_enabled(self.device) and sizes:
            self._graphs = (StepGraphs(sizes, self.device), StepGraphs(sizes, self.device))
            self._input_graphs, self._logits_graphs = self._graphs

    def set_step_graphs(self, enabled: bool) -> bool:
        """Switch the per-step graphs off (eager, for comparison) or back on; returns whether
        they are on."""
        self._input_graphs, self._logits_graphs = self._graphs if enabled else (None, None)
        return self._logits_graphs is not None

    def embed_inputs(self, embed, input_ids: torch.Tensor, graphable: bool = True) -> torch.Tensor:
        """``embed(input_ids, aux)`` for this step's scheduled tokens (see ``input_streams``).
        A pure decode step (one token per row) replays it with the input gathering as one CUDA
        graph; other steps (prefill chunks, prompt audio: ``graphable=False``) run eagerly."""
        n = input_ids.shape[0]
        graphs = self._input_graphs if graphable else None
        if graphs is not None and self.view is not None and self.view.live() and self.view.num_reqs() == n:
            slots, pos = self.row_slots[:n], self.view.positions(n)

            def step(ids, pos, slots):
                return (embed(ids, self._inputs_at(ids, pos, slots)),)

            out = graphs.run(step, None, n, (input_ids, pos, slots), (0, 0, self.scratch))
            if out is not None:
                self._step = _Step(n, slots, pos)
                return out[0]
        return embed(input_ids, self.input_streams(input_ids))

    @torch.profiler.record_function("speechctl.input_streams")
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
        aux, last_pos = self._input_step(input_ids, self.view.query_start_loc(R), self.view.positions(n), R)
        self._step = _Step(R, self.row_slots[:R], last_pos)
        return aux

    def _input_step(self, input_ids, qsl, pos, R: int):
        """The per-step input work as one function of tensors (compiled on CUDA)."""
        n = input_ids.shape[0]
        qsl = qsl.to(torch.int64)
        row_slots = self.row_slots[:R]
        tok_slot = torch.repeat_interleave(row_slots, qsl[1:] - qsl[:-1], output_size=n)
        return self._inputs_at(input_ids, pos, tok_slot), pos[qsl[1:] - 1]

    def _inputs_at(self, input_ids, pos, tok_slot):
        """[n] ids at positions ``pos`` of slots ``tok_slot`` -> [n, K] auxiliary ids."""
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
        return aux

    # -- phase 3: sampling --------------------------------------------------------------------

    @torch.profiler.record_function("speechctl.sample")
    def sample(self, logits: torch.Tensor, aux_logits: torch.Tensor | None = None, *, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Sample the auxiliary streams; return the primary logits with the stream rules applied.

        logits: [R, V] primary logits (vLLM samples from what this returns).
        aux_logits: [R, K, Va] auxiliary logits, sampled here under the delay rules; or
        tokens: [R, K] auxiliary tokens the model sampled itself, one codebook after another
            (a depth decoder, CSM; see ``sample_codebook``); recorded as they are.
        """
        step, self._step = self._step, None
        if step is None:
            return logits
        if logits.shape[0] != step.num_rows:
            raise RuntimeError(
                f"speechctl: {logits.shape[0]} logit rows for {step.num_rows} scheduled requests"
            )
        if tokens is not None and self.num_paired:
            raise RuntimeError("speechctl: CFG pairs need the auxiliary streams sampled by the runtime")
        return self._sample_step(logits, aux_logits, tokens, step.row_slots, step.last_pos, self.num_paired > 0,
                                 **self._sampling_flags())

    def graphed_logits(self, heads, hidden_states: torch.Tensor) -> torch.Tensor:
        """The body of a model's ``compute_logits``: ``heads(hidden_states)`` runs the output
        heads and ``sample`` (and, for CSM, the depth decoder). On CUDA it is replayed as one
        graph per batch-size bucket and per host-side sampling setting."""
        step, graphs = self._step, self._logits_graphs
        if step is None or graphs is None:
            return heads(hidden_states)

        def run(hidden, slots, last_pos):
            self._step = _Step(slots.shape[0], slots, last_pos)
            return (heads(hidden),)

        inputs = (hidden_states, step.row_slots, step.last_pos)
        out = graphs.run(run, self._graph_key(), step.num_rows, inputs, (None, self.scratch, 0))
        if out is None:  # more rows than the largest bucket
            self._step = step
            return heads(hidden_states)
        self._step = None
        return out[0]

    def _graph_key(self) -> tuple:
        """Every host-side fact that changes which kernels the step runs."""
        return (
            *self._sampling_flags().values(),
            self.num_paired > 0,
            self.num_cfg_filter > 0,
            self.num_text_random > 0,
            *self._sampling_flags(depth=True).values(),
        )

    def sample_codebook(self, logits: torch.Tensor, stream: int, depth: bool = False) -> torch.Tensor:
        """[R, V] logits of codebook ``stream`` for this step's rows -> [R] tokens (see
        ``codebook_sampler``)."""
        return self.codebook_sampler(depth, range(stream, stream + 1))(logits, stream)

    def codebook_sampler(self, depth: bool = False, streams: range | None = None):
        """``sample(logits [R, V], stream) -> [R]`` for this step's rows and codebooks
        ``streams``, for a model whose codebooks depend on each other within a step (CSM's depth
        decoder): each row's audio sampling settings (``depth``: its depth-decoder settings) and
        seed; the draw is keyed by (seed, generated index, stream), so it does not depend on the
        batch either. The rows' settings are gathered once here, not once per codebook."""
        step = self._step
        if step is None:  # profiling and warm-up runs
            return lambda logits, stream: logits.argmax(dim=-1)
        streams = streams or range(self.spec.num_codebooks)
        slots = step.row_slots
        g_next = step.last_pos + 1 - self.prompt_len[slots]
        if depth:
            settings = (self.depth_temperature, self.depth_top_k, self.depth_top_p)
        else:
            settings = (self.temperature, self.top_k, self.top_p)
        temperature, top_k, top_p = (x[slots] for x in settings)
        return frame_sampler(temperature, top_k, top_p, self.seed[slots], g_next, streams,
                             **self._sampling_flags(depth))

    def _sample_step(self, logits, aux_logits, given, slots, last_pos, paired, **flags):
        """The per-step sampling work as one function of tensors (host facts as arguments:
        ``paired``, the ``_sampling_flags``), so that on CUDA it compiles into a few fused kernels."""
        pat, spec = self.pattern, self.spec
        g_next = last_pos + 1 - self.prompt_len[slots]  # generated index being sampled
        real = (g_next >= 0) & (g_next == self.n_gen[slots])  # not a partial prefill or replay
        a = g_next - self.audio_start[slots]  # audio step
        in_audio = (a >= 0)[:, None]
        frames = self.frames[slots][:, None]
        known = frames >= 0
        d = self._delays

        # Delay-pattern rules per (row, stream): forced token or -1 (free). See EndRules.
        rules = spec.rules
        end = frames + d + rules.eos_lag  # [R, K] step of each stream's forced EOS
        forced = torch.where(a[:, None] < d, pat.bos, -1)
        forced = torch.where(known & (a[:, None] == end), pat.eos, forced)
        forced = torch.where(known & (a[:, None] > end), pat.pad, forced)
        cap = ~known & self._is_lead & ((a - d[0, self._lead])[:, None] >= self.max_frames[slots][:, None])
        forced = torch.where(cap, pat.eos, forced)
        forced = torch.where(in_audio, forced, pat.pad)  # text positions carry PAD
        enough = (a - d[0, self._lead])[:, None] >= self.min_frames[slots][:, None]
        eos_ok = (known | enough) if rules.open_vocab else (~known & self._is_lead & enough)

        pairing = self._pairing(slots, g_next, real) if paired else None
        if given is None:
            aux_logits = aux_logits.float()
            if pairing is not None:
                logits, aux_logits = self._guide(pairing, slots, logits, aux_logits)
            # Free choices are codes; EOS where eos_ok; BOS too with an open vocabulary.
            C = pat.codebook_size
            special = torch.full(aux_logits.shape[:2] + (pat.vocab_size - C,), float("-inf"), device=aux_logits.device)
            if rules.open_vocab:
                special[..., pat.bos - C].fill_(0.0)  # fill_: no host scalar copy (graph capture)
            special[..., pat.eos - C] = torch.where(eos_ok, 0.0, float("-inf"))
            aux_logits[..., C:] += special
            tokens = sample_streams(
                aux_logits,
                self.temperature[slots],
                self.top_k[slots],
                self.top_p[slots],
                self.seed[slots],
                g_next,
                **flags,
            )
            if pairing is not None:
                tokens = tokens[pairing.source]  # the unconditional row takes its partner's tokens
        else:
            tokens = given.to(torch.int64)
        tokens = torch.where(forced >= 0, forced, tokens)

        # Record the rows whose sample is real.
        w_slot = torch.where(real, slots, self.scratch)
        w_idx = g_next.clamp(0, self.max_len)
        self.gen_aux[w_slot, w_idx] = tokens.to(torch.int32)
        self.n_gen.index_put_((w_slot,), g_next + 1)
        # The first EOS of any stream ends the audio (only the lead's can, unless open_vocab);
        # with an end frame (CSM) no token ends it.
        first_eos = in_audio[:, 0] & ~known[:, 0] & (tokens == pat.eos).any(dim=-1)
        if rules.eos_frame is not None:
            first_eos = torch.zeros_like(first_eos)
        frames_now = torch.where(first_eos, a - d[0, self._lead], frames[:, 0])
        self.frames.index_put_((torch.where(real & first_eos, slots, self.scratch),), frames_now)

        # Primary stream: audio steps are <|audio|>, the flush token once the audio is ending,
        # and <|audio_eos|> at the first step where every stream carries PAD (EOS, where PAD is
        # EOS). Generic: <|audio|> ... <|audio_eos|>; Higgs: <|AUDIO_OUT|> ... delay ... <|eot_id|>.
        ending = frames_now >= 0
        if rules.eos_frame is None:
            done = ending & (tokens == pat.pad).all(dim=-1)
        else:  # CSM: a frame whose codebooks but the last all hold eos_frame is the last
            done = (tokens[:, :-1] == rules.eos_frame).all(dim=-1)
        forced_primary = torch.where(done, spec.audio_eos_id, torch.where(ending, spec.flush_id, spec.audio_id))
        in_audio = in_audio[:, 0]
        neg = torch.finfo(logits.dtype).min
        onehot = torch.full_like(logits, neg).scatter_(1, forced_primary[:, None], 0.0)
        logits = torch.where(in_audio[:, None], onehot, logits)
        text = ~in_audio
        logits[:, spec.audio_id] = torch.where(text, neg, logits[:, spec.audio_id])
        logits[:, spec.audio_eos_id] = torch.where(text, neg, logits[:, spec.audio_eos_id])
        ban_open = text & ~self.allow_audio[slots]
        logits[:, spec.audio_bos_id] = torch.where(ban_open, neg, logits[:, spec.audio_bos_id])
        if pairing is not None:
            logits = self._pair_primary(pairing, slots, g_next, logits)
        return logits

    # -- classifier-free guidance ---------------------------------------------------------------

    def _pairing(self, slots: torch.Tensor, g_next: torch.Tensor, real: torch.Tensor) -> "_Pairing":
        """Find each paired row's partner row in this step. A paired row whose partner is absent
        or at another position is counted in ``desync`` (the driver fails that request)."""
        R = slots.shape[0]
        rows = torch.arange(R, device=slots.device)
        row_of_slot = torch.full_like(self.partner, -1)
        row_of_slot[slots] = rows
        row_of_slot.narrow(0, self.scratch, 1).fill_(-1)  # not `[i] = -1`: that copies a host scalar
        paired = self.partner[slots] != self.scratch
        partner_row = row_of_slot[self.partner[slots]]
        present = partner_row >= 0
        partner_row = partner_row.clamp(min=0)
        synced = paired & present & (g_next[partner_row] == g_next)
        broken = paired & real & ~synced
        self.desync.index_put_((torch.where(broken, slots, self.scratch),), torch.ones_like(slots))
        guided = synced & self.conditional[slots]  # rows that hold a pair's merged logits
        source = torch.where(synced & ~self.conditional[slots], partner_row, rows)
        return _Pairing(guided, source, partner_row)

    def _guide(self, pairing: "_Pairing", slots, logits, aux_logits):
        """l = l_u + s * (l_c - l_u) on the conditional rows of pairs, per guided stream, with
        Dia's optional filter (top-k of the guided logits, applied to the conditional ones)."""
        scale = self.cfg_scale[slots]
        top_k = self.cfg_top_k[slots]
        out = []
        for ls, on in ((logits, self.cfg_text[slots]), (aux_logits, self.cfg_audio[slots])):
            cond = ls.float()
            uncond = cond[pairing.partner_row]
            shape = (-1,) + (1,) * (cond.dim() - 1)
            merged = uncond + scale.view(shape) * (cond - uncond)
            if self.num_cfg_filter:
                filtered = (top_k > 0).view(shape)
                k = torch.where(top_k > 0, top_k, 1).view(shape).expand(merged.shape[:-1] + (1,))
                kth = merged.sort(dim=-1, descending=True).values.gather(-1, k - 1)
                kept = torch.where(merged >= kth, cond, float("-inf"))
                merged = torch.where(filtered, kept, merged)
            use = (pairing.guided & on).view(shape)
            out.append(torch.where(use, merged, cond).to(ls.dtype))
        return out[0], out[1]

    def _pair_primary(self, pairing: "_Pairing", slots, g_next, logits):
        """Both members of a pair take one primary token, sampled here from the conditional row's
        (guided, rule-constrained) logits; vLLM receives it as a one-hot row for both."""
        choice = sample_streams(
            logits.float()[:, None, :],
            self.text_temperature[slots],
            self.text_top_k[slots],
            self.text_top_p[slots],
            self.seed[slots] ^ 0x5DEECE66D,  # text draws independent of the audio draws
            g_next,
            any_random=self.num_text_random > 0,
            any_filter=self.num_text_random > 0,
        )[:, 0]
        choice = choice[pairing.source]
        paired = pairing.guided | (pairing.source != torch.arange(len(slots), device=slots.device))
        onehot = torch.full_like(logits, torch.finfo(logits.dtype).min).scatter_(1, choice[:, None], 0.0)
        return torch.where(paired[:, None], onehot, logits)

    # -- driver access ------------------------------------------------------------------------

    def collect(self, spans: list[tuple[str, int, int]]) -> list[tuple[np.ndarray, int]]:
        """[(key, start, end)] -> (the [end - start, K] auxiliary tokens of generated positions
        start..end-1, desync flag) of each request, in one copy."""
        if not spans:
            return []
        slots = torch.tensor([self.slots[k] for k, _, _ in spans], device=self.device)
        first = min(start for _, start, _ in spans)
        last = max(end for _, _, end in spans)
        block = self.gen_aux[slots, first:last].cpu().numpy()
        desync = self.desync[slots].cpu().numpy()
        return [
            (block[i, start - first : end - first], int(desync[i]))
            for i, (_, start, end) in enumerate(spans)
        ]


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
