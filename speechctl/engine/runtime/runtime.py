"""StreamRuntime: the per-step work of a multi-stream model, around vLLM's forward.

A model owns one runtime (``StreamModel`` builds it). Each engine step is, in order::

    admit    which request sits in which batch row (``StreamTracker``, before the forward)
    inputs   the auxiliary tokens of every scheduled position -> embeddings (``embed_inputs``)
    forward  vLLM's backbone, in its CUDA graphs
    sample   heads -> auxiliary tokens under the rules, CFG merged, repeats redrawn (``sample``,
             the work itself in ``frame.py``)
    record   the tokens of rows whose sample is real, into the slot table (``frame.py``)

Between ``inputs`` and ``sample`` the runtime holds ``rows``: which slot each row of the step is
and where its last scheduled token lies (vLLM calls the two phases separately). No phase loops
over requests in Python or syncs the device; Python runs only when requests join or leave.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from speechctl.engine.runtime.graphs import compile_per_step_work, compile_step, step_graphs_enabled
from speechctl.engine.runtime.frame import sample_frame
from speechctl.engine.runtime.inputs import inputs_at, scheduled_inputs
from speechctl.engine.runtime.rules import FrameRules
from speechctl.engine.runtime.sampling import frame_sampler
from speechctl.engine.runtime.slots import Admitted, Moved, SlotTable
from speechctl.engine.streams import StreamSpec
from speechctl.graphs import InPlace, StepGraphs


class ScheduledRows(NamedTuple):
    """What the input phase learned about a step's rows, for the sampling phase."""

    num_rows: int
    slots: torch.Tensor  # [R] slot of each row
    last_pos: torch.Tensor  # [R] position of each row's last scheduled token


class StreamRuntime:
    def __init__(self, spec: StreamSpec, *, max_rows: int, max_len: int, device: torch.device,
                 depth_decoder: bool = False, graph_rows: int = 0):
        """``graph_rows``: the most rows vLLM's CUDA graphs run (``vllm_compat.cudagraph_capture_rows``),
        past ``max_rows`` by default. The row slots have that size from the start: vLLM captures
        an encoder-decoder model's decode forward, which reads them, before the runtime is
        attached, and growing them then (``use_step_graphs``) would make a new tensor that the
        captured forward never reads."""
        self.spec = spec
        self.pattern = spec.pattern
        self.device = device
        self.max_rows = max_rows
        self.table = SlotTable(spec, max_rows=max_rows, max_len=max_len, device=device, depth_decoder=depth_decoder)
        self.table.reserve_rows(graph_rows)
        self.rules = FrameRules(spec, device)
        self.capacity = self.table.capacity
        self.view = None  # vllm_compat.StepView over the runner's buffers, once the engine is built
        self.rows: ScheduledRows | None = None
        # The sampling step's variants met while starting (compiled on first use), until
        # ``freeze_variants``; a variant first met later runs the plain function.
        self._plain_sample_step = self._sample_step
        self._compiled_variants: set = set()
        self._starting = True
        self.start_up_graphs_s = 0.0  # recording the per-step graphs at start-up, compiles included
        if compile_per_step_work():  # fuse the per-step elementwise work: kernel launches dominate it
            self._input_step = compile_step(self._input_step)
            self._sample_step = compile_step(self._sample_step)
        # CUDA graphs of the per-step work, set up once vLLM's batch sizes are known
        # (``use_step_graphs``); separate pools: the input graph's output is still read by the
        # forward when the logits graph runs.
        self._graphs: tuple[StepGraphs | None, StepGraphs | None] = (None, None)
        self.input_graphs, self.logits_graphs = self._graphs

    # -- admit ---------------------------------------------------------------------------------

    def admit(self, batch_size: int, removed: list[int], added: list[Admitted], moved: list[Moved]) -> None:
        self.table.admit(batch_size, removed, added, moved)

    def release(self, keys) -> None:
        """Free the slots of finished or aborted requests (called by the driver)."""
        self.table.release(keys)

    # -- inputs --------------------------------------------------------------------------------

    def embed_inputs(self, embed, input_ids: torch.Tensor, graphable: bool = True) -> torch.Tensor:
        """``embed(input_ids, aux)`` for this step's scheduled tokens. A pure decode step (one
        token per row) replays it with the input gathering as one CUDA graph; other steps
        (prefill chunks, prompt audio: ``graphable=False``) run eagerly."""
        n = input_ids.shape[0]
        if (graphable and self.input_graphs is not None and self.view is not None and self.view.num_reqs() == n
                and input_ids.data_ptr() == self.view.input_ids().data_ptr()):
            out = self.graphed_embed(embed, n)
            if out is not None:
                self.rows = ScheduledRows(n, self.table.row_slots[:n], self.view.positions(n))
                return out
        return embed(input_ids, self.input_streams(input_ids))

    def graphed_embed(self, embed, n: int):
        """``embed`` of one token per row for the first ``n`` rows, replayed from the input graph
        of its bucket (None: no bucket holds this many rows). The graph reads the step where it
        lies: vLLM's token ids and positions, the runtime's row slots (padding rows: vLLM's
        leftovers, in the scratch slot)."""
        def step(ids, pos, slots):
            return (embed(ids, inputs_at(self.table, self.spec, ids, pos, slots)),)

        buffers = (self.view.input_ids(), self.view.positions(None), self.table.row_slots)
        out = self.input_graphs.run(step, None, n, tuple(map(InPlace, buffers)), (None, None, None))
        return None if out is None else out[0]

    @torch.profiler.record_function("speechctl.input_streams")
    def input_streams(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[n] scheduled primary ids -> [n, K] auxiliary ids of the same positions
        (``inputs.inputs_at``)."""
        n = input_ids.shape[0]
        if self.view is None:  # vLLM's profiling and warm-up runs, before the engine attached
            self.rows = None
            return torch.full((n, self.spec.num_codebooks), self.pattern.pad, dtype=torch.int64, device=input_ids.device)
        R = self.view.num_reqs()
        aux, last_pos = self._input_step(input_ids, self.view.query_start_loc(R), self.view.positions(n), R)
        self.rows = ScheduledRows(R, self.table.row_slots[:R], last_pos)
        return aux

    def _input_step(self, input_ids, query_start_loc, pos, num_rows: int):
        """The input work as one function of tensors (compiled on CUDA)."""
        return scheduled_inputs(self.table, self.spec, input_ids, query_start_loc, pos, num_rows)

    def decoder_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor, one_per_row: bool) -> torch.Tensor:
        """[n] primary ids -> [n, K] auxiliary ids, from inside a model's forward (an
        encoder-decoder family: vLLM hands its forward token ids and captures the forward whole
        in a CUDA graph on pure decode steps, where Python does not run again). There the step is
        one token per row (``one_per_row``: token i is row i) and only persistent buffers are
        read; the sampling phase finds its rows itself (``locate_rows``). vLLM captures those
        graphs at start-up, before the runtime is attached (every row then sits in the scratch
        slot): the graph must gather from the table even then, or its replays would embed the
        capture's constant."""
        if one_per_row:
            return inputs_at(self.table, self.spec, input_ids, positions, self.table.row_slots[: input_ids.shape[0]])
        if self.view is None:  # vLLM's profiling and warm-up runs
            return torch.full((input_ids.shape[0], self.spec.num_codebooks), self.pattern.pad, dtype=torch.int64,
                              device=input_ids.device)
        return self.input_streams(input_ids)

    def locate_rows(self) -> None:
        """Each row's slot and last position for this step's sampling, from the runner's buffers
        (for ``decoder_inputs``, whose forward may have been a graph replay)."""
        if self.view is None:
            self.rows = None
            return
        R = self.view.num_reqs()
        qsl = self.view.query_start_loc(R).to(torch.int64)
        self.rows = ScheduledRows(R, self.table.row_slots[:R], self.view.positions(None)[qsl[1:] - 1])

    # -- sample and record ---------------------------------------------------------------------

    @torch.profiler.record_function("speechctl.sample")
    def sample(self, logits: torch.Tensor | None, aux_logits: torch.Tensor | None = None, *,
               tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Sample the auxiliary streams and record them; return the primary logits with the
        stream rules applied (vLLM samples from what this returns).

        logits: [R, V] primary logits; None for a model without a text head (``ruled``).
        aux_logits: [R, K, Va] auxiliary logits, sampled here under the rules; or
        tokens: [R, K] auxiliary tokens the model sampled itself, one codebook after another
            (a depth decoder, CSM; see ``codebook_sampler``); recorded as they are.
        """
        rows, self.rows = self.rows, None
        n = (logits if logits is not None else aux_logits if aux_logits is not None else tokens).shape[0]
        if rows is None:
            return logits if logits is not None else torch.zeros(n, self.rules.vocab_size, device=self.table.device)
        if n != rows.num_rows:
            raise RuntimeError(f"speechctl: {n} logit rows for {rows.num_rows} scheduled requests")
        settings = self.table.settings
        if tokens is not None and settings.paired:
            raise RuntimeError("speechctl: CFG pairs need the auxiliary streams sampled by the runtime")
        key = settings.graph_key()
        if self._starting:
            self._compiled_variants.add(key)
        # A variant first met mid-run (a rare setting: a CFG pair sampling its text, Dia's filter
        # in another family) is recorded from the plain function: a compile here would stall
        # every live request for seconds, a capture takes milliseconds.
        step = self._sample_step if key in self._compiled_variants else self._plain_sample_step
        return step(logits, aux_logits, tokens, rows.slots, rows.last_pos, settings.paired > 0, settings.cfg_filter > 0,
                    settings.text_random > 0, settings.repetition > 0, **settings.sampling_flags())

    def ruled(self, vocab_size: int, aux_logits: torch.Tensor | None = None, *, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """``sample`` for a model without a text head (Higgs, CSM, Dia, MusicGen): the primary
        stream is the rules' alone, so its [R, ``vocab_size``] logits are made one-hot on the
        ruled token in one write (``FrameRules.primary_logits``), never filled and then
        re-masked: at Higgs' 128,256 ids that was 140 us of a 4.3 ms step at 64 rows (H100)."""
        self.rules.vocab_size = vocab_size
        return self.sample(None, aux_logits, tokens=tokens)

    def freeze_variants(self) -> None:
        """End of start-up: the sampling step's variants met so far are the compiled ones."""
        self._starting = False

    def _sample_step(self, logits, aux_logits, given, slots, last_pos, paired, cfg_filter, text_random, repetition, **flags):
        """The sampling work as one function of tensors (``frame.sample_frame``), host facts as
        arguments, so that on CUDA it compiles into a few fused kernels."""
        return sample_frame(self.table, self.rules, logits, aux_logits, given, slots, last_pos, paired=paired,
                            cfg_filter=cfg_filter, text_random=text_random, repetition=repetition, **flags)

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
        rows = self.rows
        if rows is None:  # profiling and warm-up runs
            return lambda logits, stream: logits.argmax(dim=-1)
        table = self.table
        g_next = rows.last_pos + 1 - table.prompt_len[rows.slots]
        temperature, top_k, top_p = (table.depth if depth else table.audio).at(rows.slots)
        return frame_sampler(temperature, top_k, top_p, table.seed[rows.slots], g_next,
                             streams or range(self.spec.num_codebooks), **table.settings.sampling_flags(depth))

    # -- per-step graphs -----------------------------------------------------------------------

    def graphed_logits(self, heads, hidden_states: torch.Tensor) -> torch.Tensor:
        """The body of a model's ``compute_logits``: ``heads(hidden_states)`` runs the output
        heads and ``sample`` (and, for CSM, the depth decoder). On CUDA it is replayed as one
        graph per batch-size bucket and per host-side sampling setting."""
        rows, graphs = self.rows, self.logits_graphs
        if rows is None:  # vLLM's profiling and warm-up runs
            return heads(hidden_states)
        out = None
        if graphs is not None:

            def run(hidden, slots, last_pos):
                self.rows = ScheduledRows(slots.shape[0], slots, last_pos)
                return (heads(hidden),)

            # (The slots are copied too, though they lie in the row slots already: read in place,
            # as a view of that buffer, the compiled sampling step recompiled for every bucket.)
            inputs = (hidden_states, rows.slots, rows.last_pos)
            out = graphs.run(run, self.table.settings.graph_key(), rows.num_rows, inputs, (None, self.table.scratch, 0))
        if out is None:  # no graphs, or more rows than the largest bucket
            self.rows = rows
            logits = heads(hidden_states)
        else:
            self.rows, logits = None, out[0]
        self.table.readback.after_step(rows.num_rows)  # the step's tokens on their way to the host
        return logits

    def use_step_graphs(self, sizes) -> None:
        """Replay the per-step work as CUDA graphs for batches of up to max(sizes) rows."""
        # No one-row graph: one row replays the two-row graph beside a padding row. A compiled
        # step specializes a size it first sees as 1 (torch's 0/1 specialization; its
        # size-oblivious tracing fails to lower the sampling step), so recording that bucket
        # would compile every variant twice (docs/families.md, Dia's start-up).
        sizes = [s for s in sizes if s > 1] or list(sizes)
        # Up to the first size that holds max_rows: a step has a row per request, while vLLM's
        # sizes count a step's tokens (up to twice the most requests by default, more with
        # EngineConfig.max_graph_tokens); larger graphs would be recorded and never replayed.
        sizes = [s for s in sizes if s < self.max_rows] + [s for s in sizes if s >= self.max_rows][:1]
        if step_graphs_enabled(self.device) and sizes:
            self._graphs = (StepGraphs(sizes, self.device), StepGraphs(sizes, self.device))
            self.input_graphs, self.logits_graphs = self._graphs
            self.table.reserve_rows(max(sizes))

    def set_step_graphs(self, enabled: bool) -> bool:
        """Switch the per-step graphs off (eager, for comparison) or back on; returns whether
        they are on."""
        self.input_graphs, self.logits_graphs = self._graphs if enabled else (None, None)
        return self.logits_graphs is not None

    # -- driver access -------------------------------------------------------------------------

    def collect(self, spans: list[tuple[str, int, int]]) -> list[tuple[np.ndarray, int]]:
        return self.table.collect(spans)

    def state_digest(self) -> str:
        return self.table.digest()

    def stats(self) -> dict[str, float]:
        captures = sum(g.captured for g in self._graphs if g is not None)
        return {"live": len(self.table.slots), "resumed": self.table.resumed, "paired": self.table.settings.paired,
                "graph_captures": captures, "start_up_graphs_s": self.start_up_graphs_s}
