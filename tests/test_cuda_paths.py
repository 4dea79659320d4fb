"""The per-step code that runs only on CUDA, run on the CPU: speechctl's per-step graphs (bucketed
batches, padding rows in the scratch slot, graphs recorded at attach for every variant, keyed by
the host's settings), vLLM's graph buckets past ``max_num_seqs`` (its largest is twice it), the
general audio sampling path, against the plain-PyTorch reference and the batch-independence
checks of the parity suites.

Only the CUDA calls themselves are stood in for (``StepGraphs._entry``/``_replay``): a graph's
replay runs its function again on the same static, padded inputs, where CUDA would replay the
recorded kernels. What the stand-in cannot check is that a graph's key names every host-side
fact its function reads (a replay here sees today's Python state); the H200 runs the real graphs.
Every engine start on CUDA failed once in code that only this path reaches (the readback's rows
sized by ``max_num_seqs`` while the graphs ran twice as many), unseen until a GPU ran it."""

import pytest

from speechctl.engine import vllm_compat
from speechctl.engine.runtime import graphs, runtime, slots
from speechctl.engine.runtime.graphs import StepGraphs, _Entry

# The parity checks, run here on an engine with the CUDA paths (the engine fixture below).
from test_cfg import strict_pairs, test_mixed_cfg_batch_equals_reference  # noqa: F401
from test_parity import (  # noqa: F401
    make_engine,
    test_mixed_batch_equals_reference,
    test_seeded_sampling_does_not_depend_on_the_batch,
    test_streamed_pieces_add_up_to_the_whole_output,
)

pytestmark = pytest.mark.engine
BUCKETS = [1, 2, 4, 8, 16]  # vLLM's for max_num_seqs 8: up to twice it


class CpuGraphs(StepGraphs):
    """StepGraphs with the CUDA calls stood in for: recording keeps the function and its static
    inputs, a replay runs it on them."""

    def _new_pool(self):
        return None

    def _entry(self, fn, static):
        return _Entry(fn, static, None)

    def _replay(self, entry):
        return entry.graph(*entry.inputs)


@pytest.fixture(scope="module", autouse=True)
def cuda_paths():
    with pytest.MonkeyPatch.context() as m:
        m.setattr(runtime, "step_graphs_enabled", lambda device: True)
        m.setattr(runtime, "StepGraphs", CpuGraphs)
        m.setattr(vllm_compat, "cudagraph_batch_sizes", lambda runner: list(BUCKETS))
        m.setattr(slots, "general_audio_sampling", lambda device: True)
        yield


@pytest.fixture(scope="module", params=["default", "preemption"])
def engine(request, tiny_checkpoint, cuda_paths):
    overrides = {"preemption": dict(num_kv_blocks=5, max_model_len=128)}.get(request.param, {})
    eng = make_engine(tiny_checkpoint, **overrides)
    eng.name = request.param
    yield eng
    eng.shutdown()


def _runtime(engine):
    runner = vllm_compat.worker_runner(engine._vllm.model_executor.driver_worker)
    return runner.get_model().stream_runtime


def test_the_cuda_paths_are_the_ones_running(engine):
    """Graphs recorded at attach for every bucket, the largest past the batch limit, with the
    readback room for it; the general sampling path on."""
    rt = _runtime(engine)
    assert isinstance(rt._logits_graphs, CpuGraphs) and rt._logits_graphs.sizes == BUCKETS
    assert rt.stats()["graph_captures"] >= 2 * len(BUCKETS)  # input and logits graphs, every bucket
    assert max(BUCKETS) > engine.config.max_num_seqs
    assert rt.table.readback.record.shape[0] >= max(BUCKETS)
    assert rt.table.settings.general_audio
    assert graphs.step_graphs_enabled is not runtime.step_graphs_enabled  # the stand-in, not the module's own
