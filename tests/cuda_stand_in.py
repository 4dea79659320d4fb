"""The CUDA-only per-step paths on the CPU (tests/test_cuda_paths.py): speechctl's per-step
graphs with the two CUDA calls stood in for (a replay runs the function again on the graph's
static, padded inputs, and fails on anything that would sync the host), vLLM's graph buckets (up to twice ``max_num_seqs``, as vLLM makes them),
the general audio sampling path. Any suite runs with them as a pytest plugin::

    PYTHONPATH=tests python -m pytest -p cuda_stand_in tests/test_csm.py tests/test_dia.py
"""

import torch
from torch.overrides import TorchFunctionMode

from speechctl.graphs import StepGraphs, _Entry

BUCKETS = [1, 2, 4, 8, 16]  # vLLM's for max_num_seqs 8

# What makes the host wait for the device (or reads a device value into Python): inside a CUDA
# graph's capture it is an error, and the per-step work must not do it at all.
_SYNCS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
          torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu,
          torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select,
          torch.unique, torch.Tensor.unique, torch.argwhere, torch.Tensor.argwhere}


class NoHostSync(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _SYNCS:
            raise RuntimeError(f"{getattr(func, '__name__', func)} inside a per-step graph: it syncs the host")
        if func is torch.Tensor.__getitem__ and any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                                                    for a in _flat(args[1:])):
            raise RuntimeError("boolean-mask indexing inside a per-step graph: its shape needs the host")
        return func(*args, **(kwargs or {}))


def _flat(items):
    for item in items:
        if isinstance(item, (tuple, list)):
            yield from _flat(item)
        else:
            yield item


class CpuGraphs(StepGraphs):
    """StepGraphs with the CUDA calls stood in for: recording keeps the function and its static
    inputs, a replay runs it on them, refusing what would sync the host (``NoHostSync``)."""

    replays = 0  # all instances: the tests check that graphs did replay

    def _new_pool(self):
        return None

    def _entry(self, fn, static):
        return _Entry(fn, static, None)

    def _replay(self, entry):
        CpuGraphs.replays += 1
        with NoHostSync():
            return entry.graph(*entry.inputs)


def stand_in(setattr) -> None:
    """Put the CUDA paths in place through ``setattr(obj, name, value)`` (a MonkeyPatch's, or
    the builtin for a whole run)."""
    from speechctl.engine import vllm_compat
    from speechctl.engine.runtime import runtime, slots

    setattr(runtime, "step_graphs_enabled", lambda device: True)
    setattr(runtime, "StepGraphs", CpuGraphs)
    # vLLM's CPU runner captures nothing: the buckets vLLM would have (a runner that says its own,
    # as a test's stand-in runner does, keeps them)
    setattr(vllm_compat, "cudagraph_batch_sizes",
            lambda runner: list(getattr(runner, "cudagraph_batch_sizes", None) or BUCKETS))
    setattr(slots, "general_audio_sampling", lambda device: True)


def pytest_configure(config):  # as a plugin (-p cuda_stand_in): for the whole run
    stand_in(setattr)
