"""Every per-step CUDA graph a model's workload can meet, recorded at start-up.

``StepGraphs`` records a graph the first time a step needs it; a graph recorded mid-run stalls
that step for the capture (a varied workload met them one by one: issue 21). At start-up the
runtime records them all, one per batch-size bucket and host-side variant, with dummy rows in
the scratch slot, whose writes go nowhere.
"""

from __future__ import annotations

import torch

from speechctl.engine.runtime.runtime import ScheduledRows, StreamRuntime
from speechctl.engine.runtime.settings import LiveSettings


def record_step_graphs(runtime: StreamRuntime, heads, embed, hidden_size: int, dtype: torch.dtype, *, guidance: bool,
                       repetition: bool, cfg_filter: bool = False) -> int:
    """Record ``runtime``'s graphs of every bucket: the input graph (none where ``embed`` is
    None: an encoder-decoder model gathers its inputs inside vLLM's graph of its forward), and
    the logits graph for each host-side variant (CFG pairs live or not where ``guidance``, with
    Dia's CFG filter or not where ``cfg_filter``; repetition-aware sampling where
    ``repetition``; the audio sampling is one general path on CUDA). Returns the graphs
    recorded (0 without graphs)."""
    graphs = runtime.logits_graphs
    if graphs is None:
        return 0
    before = runtime.stats()["graph_captures"]
    table, device = runtime.table, runtime.device
    live = table.settings
    pairings = [(False, False)] + ([(True, False)] if guidance else []) + ([(True, True)] if guidance and cfg_filter else [])
    for size in graphs.sizes:
        slots = torch.full((size,), table.scratch, dtype=torch.int64, device=device)
        zeros = torch.zeros(size, dtype=torch.int64, device=device)
        if embed is not None:
            runtime.graphed_embed(embed, zeros, zeros, slots)
        hidden = torch.zeros(size, hidden_size, dtype=dtype, device=device)
        for paired, filtered in pairings:
            for ras in (False, True) if repetition else (False,):
                table.settings = LiveSettings(general_audio=live.general_audio)
                table.settings.paired, table.settings.repetition = int(paired), int(ras)
                table.settings.cfg_filter = int(filtered)
                runtime.rows = ScheduledRows(size, slots, zeros)
                try:
                    runtime.graphed_logits(heads, hidden)
                finally:
                    table.settings, runtime.rows = live, None
    return runtime.stats()["graph_captures"] - before
