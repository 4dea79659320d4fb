"""The CUDA-only per-step paths on the CPU (tests/test_cuda_paths.py): speechctl's per-step
graphs with the two CUDA calls stood in for (a replay runs the function again on the graph's
static, padded inputs), vLLM's graph buckets (up to twice ``max_num_seqs``, as vLLM makes them),
the general audio sampling path. Any suite runs with them as a pytest plugin::

    PYTHONPATH=tests python -m pytest -p cuda_stand_in tests/test_csm.py tests/test_dia.py
"""

from speechctl.engine.runtime.graphs import StepGraphs, _Entry

BUCKETS = [1, 2, 4, 8, 16]  # vLLM's for max_num_seqs 8


class CpuGraphs(StepGraphs):
    """StepGraphs with the CUDA calls stood in for: recording keeps the function and its static
    inputs, a replay runs it on them."""

    def _new_pool(self):
        return None

    def _entry(self, fn, static):
        return _Entry(fn, static, None)

    def _replay(self, entry):
        return entry.graph(*entry.inputs)


def stand_in(setattr) -> None:
    """Put the CUDA paths in place through ``setattr(obj, name, value)`` (a MonkeyPatch's, or
    the builtin for a whole run)."""
    from speechctl.engine import vllm_compat
    from speechctl.engine.runtime import runtime, slots

    setattr(runtime, "step_graphs_enabled", lambda device: True)
    setattr(runtime, "StepGraphs", CpuGraphs)
    setattr(vllm_compat, "cudagraph_batch_sizes", lambda runner: list(BUCKETS))
    setattr(slots, "general_audio_sampling", lambda device: True)


def pytest_configure(config):  # as a plugin (-p cuda_stand_in): for the whole run
    stand_in(setattr)
