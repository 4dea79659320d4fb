"""How the per-step work around vLLM's forward runs fast on CUDA: CUDA graphs of its own and
torch.compile.

vLLM captures the backbone's forward in full CUDA graphs, but the work speechctl does each step
outside it (gathering auxiliary inputs, the heads, delay rules, sampling, CFG merging) is a few
hundred small kernels. Launched one by one from Python they bound the step by the host, not the
GPU (docs/benchmarks/cfg.md). ``StepGraphs`` records such a function once per batch-size bucket
(and per host-side setting that changes its code path) and replays it: one launch per step.

The class is ``speechctl.graphs.StepGraphs`` (the codec's decode records its graphs with it
too); this module holds the engine's switches for it and for torch.compile.
"""

from __future__ import annotations

import os

import torch

from speechctl.accelerator import has_cuda
from speechctl.errors import EngineError


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


VARIANTS = 64  # compiled variants a per-step function may have (host facts x CSM's depth settings)


def compile_step(fn):
    """``fn`` compiled for any number of rows, one compile per host-side variant (CFG pairs live,
    Dia's filter, a candidate set, a depth decoder's sampling): each is a guard, and past
    torch's default recompile limit of 8 a function silently falls back to eager, a stall and a
    slow path mid-run; VARIANTS lifts it. (A size first seen as 1 is specialized and compiles
    again for more rows: ``StreamRuntime.use_step_graphs`` records no one-row graph.)"""
    import torch._dynamo.config as config

    config.recompile_limit = max(config.recompile_limit, VARIANTS)
    return torch.compile(fn, dynamic=True)


def step_graphs_enabled(device: torch.device) -> bool:
    """On CUDA unless SPEECHCTL_STEP_GRAPHS=0 (the eager path, for comparison and debugging)."""
    return device.type == "cuda" and os.environ.get("SPEECHCTL_STEP_GRAPHS", "1") != "0"
