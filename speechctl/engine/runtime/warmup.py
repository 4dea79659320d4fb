"""Every per-step CUDA graph a model's workload can meet, recorded at start-up.

``StepGraphs`` records a graph the first time a step needs it; a graph recorded mid-run stalls
that step for the capture (a varied workload met them one by one: issue 21). At start-up the
runtime records them all, one per batch-size bucket and host-side variant, with dummy rows in
the scratch slot, whose writes go nowhere.
"""

from __future__ import annotations

import torch

from speechctl.engine.params import Sampling, StreamParams
from speechctl.engine.runtime.runtime import ScheduledRows, StreamRuntime
from speechctl.engine.runtime.settings import CANDIDATE_SETS, LiveSettings


@torch.no_grad()  # as vLLM runs its steps: grad mode is part of every compiled variant's guards
def record_step_graphs(runtime: StreamRuntime, heads, embed, hidden_size: int, dtype: torch.dtype, *, guidance: bool,
                       repetition: bool, cfg_filter: bool = False) -> int:
    """Record ``runtime``'s graphs of every bucket: the input graph (none where ``embed`` is
    None: an encoder-decoder model gathers its inputs inside vLLM's graph of its forward), and
    the logits graph for each host-side variant (CFG pairs live or not where ``guidance``, with
    Dia's CFG filter or not where ``cfg_filter``; repetition-aware sampling where
    ``repetition``; the general sampling path's candidate sets; a depth decoder's codebooks,
    CSM's, greedy or on each candidate set). Returns the graphs recorded (0 without graphs).

    Two rarer variants are left to their first use, a one-time capture of the plain (not
    compiled) sampling step: a pair whose text is sampled at a temperature (chat with CFG), and
    Dia's CFG filter (``--cfg-top-k``) in another guided family. Compiled at start-up, each would
    be one more compile per guided engine (recording all of them quadrupled the compiled CPU
    test's start-up: 38 -> 148 s); compiled on first use, a stall of seconds mid-run."""
    graphs = runtime.logits_graphs
    if graphs is None:
        return 0
    before = runtime.stats()["graph_captures"]
    table, device = runtime.table, runtime.device
    live = table.settings
    pairings = [(False, False)] + ([(True, False)] if guidance else []) + ([(True, True)] if guidance and cfg_filter else [])
    if table.slots:
        raise RuntimeError("speechctl: per-step graphs are recorded before the first request")
    for size in graphs.sizes:
        slots = table.row_slots[:size]  # all in the scratch slot: no request is live yet
        zeros = torch.zeros(size, dtype=torch.int64, device=device)
        if embed is not None:
            runtime.graphed_embed(embed, size)
        hidden = torch.zeros(size, hidden_size, dtype=dtype, device=device)
        for paired, filtered in pairings:
            for ras in (False, True) if repetition else (False,):
                for candidates in CANDIDATE_SETS:
                    for depth in (None, *CANDIDATE_SETS) if live.depth_decoder else (candidates,):
                        table.settings = _variant(live, paired, filtered, ras, candidates, depth)
                        runtime.rows = ScheduledRows(size, slots, zeros)
                        try:
                            runtime.graphed_logits(heads, hidden)
                        finally:
                            table.settings, runtime.rows = live, None
    runtime.freeze_variants()  # what a workload meets later is captured without compiling
    return runtime.stats()["graph_captures"] - before


def _variant(live: LiveSettings, paired: bool, filtered: bool, ras: bool, candidates: int, depth: int | None) -> LiveSettings:
    """Settings whose graph key is one variant's: counted from a stand-in request whose audio
    sampling needs ``candidates`` (0: no top-k, every token) and its depth decoder's ``depth``
    (None: greedy), as a live one would be."""
    settings = LiveSettings(general_audio=live.general_audio, depth_decoder=live.depth_decoder, vocab=live.vocab)
    depth_sampling = Sampling(temperature=0.0) if depth is None else Sampling(temperature=1.0, top_k=depth)
    settings.count(StreamParams("warm-up", 0, audio=Sampling(temperature=1.0, top_k=candidates),
                                depth=depth_sampling), 1)
    settings.paired, settings.repetition, settings.cfg_filter = int(paired), int(ras), int(filtered)
    return settings
