"""The per-step code that runs only on CUDA, run on the CPU: speechctl's per-step graphs (bucketed
batches, padding rows in the scratch slot, graphs recorded at attach for every variant, keyed by
the host's settings), vLLM's graph buckets past ``max_num_seqs`` (its largest is twice it; the
per-step graphs stop at the first that holds it), the general audio sampling path, against the
plain-PyTorch reference and the batch-independence checks of the parity suites.

Only the CUDA calls themselves are stood in for (``cuda_stand_in.py``): a graph's replay runs its
function again on the same static, padded inputs, where CUDA would replay the recorded kernels
(``PYTHONPATH=tests python -m pytest -p cuda_stand_in tests/...`` runs any suite so). What the
stand-in cannot check is that a graph's key names every host-side fact its function reads (a
replay here sees today's Python state); the H200 runs the real graphs.
Every engine start on CUDA failed once in code that only this path reaches (the readback's rows
sized by ``max_num_seqs`` while the graphs ran twice as many), unseen until a GPU ran it."""

import numpy as np
import pytest

from cuda_stand_in import BUCKETS, CpuGraphs, stand_in
from speechctl.engine import vllm_compat
from speechctl.engine.runtime import graphs, runtime

# The parity checks, run here on an engine with the CUDA paths (the engine fixture below).
from test_cfg import strict_pairs, test_mixed_cfg_batch_equals_reference  # noqa: F401
from test_parity import (  # noqa: F401
    make_engine,
    test_mixed_batch_equals_reference,
    test_seeded_sampling_does_not_depend_on_the_batch,
    test_streamed_pieces_add_up_to_the_whole_output,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", autouse=True)
def cuda_paths():
    with pytest.MonkeyPatch.context() as m:
        stand_in(m.setattr)
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
    """Graphs recorded at attach (``use_step_graphs``) for every bucket up to the first that holds
    the batch limit (a step has a row per request; vLLM's larger buckets count tokens) but
    vLLM's one-row bucket (one row replays the two-row graph); the readback
    has room for the largest graph's rows (on CUDA also for vLLM's largest bucket:
    ``cudagraph_capture_rows``); the general sampling path on."""
    rt = _runtime(engine)
    assert max(BUCKETS) > engine.config.max_num_seqs
    buckets = [b for b in BUCKETS if 1 < b <= engine.config.max_num_seqs]
    assert isinstance(rt.logits_graphs, CpuGraphs) and rt.logits_graphs.sizes == buckets
    assert rt.stats()["graph_captures"] >= 2 * len(buckets)  # input and logits graphs, every bucket
    assert engine.stats()["start_up_graphs_s"] > 0  # their recording's share of start-up, for the benches
    assert rt.table.readback.record.shape[0] >= max(buckets)
    assert rt.table.settings.general_audio
    assert graphs.step_graphs_enabled is not runtime.step_graphs_enabled  # the stand-in, not the module's own
    replays = CpuGraphs.replays
    prompts = engine.prompt_builder()
    outs = engine.generate([prompts.tts("one", max_frames=6), prompts.tts("and two", max_frames=9)])
    assert all(o.error is None for o in outs)
    assert CpuGraphs.replays > replays  # the decode steps replayed their graphs
    replays = CpuGraphs.replays
    (alone,) = engine.generate([prompts.tts("alone", max_frames=5)])
    assert alone.error is None and CpuGraphs.replays > replays  # one row: the two-row graph


def alone_then_mixed(engine, make, n: int) -> tuple[list, list]:
    """Requests ``make(0..n-1)`` each alone, then all in one batch: (alone, mixed) outputs, in
    order, every one without an error."""
    alone = []
    for i in range(n):
        (out,) = engine.generate([make(i)])
        assert out.error is None, out.error
        alone.append(out)
    mixed = engine.generate([make(i) for i in range(n)])
    assert all(o.error is None for o in mixed), [o.error for o in mixed]
    return alone, sorted(mixed, key=lambda o: o.tag)


def test_varied_sampling_records_no_graph_after_start_up(engine):
    """Every graph a workload of varied audio sampling needs was recorded at start-up (issue 21
    item 5): greedy, top-k within and past the general path's candidate set, top-p, no filter,
    alone and mixed. Before, the graphs were keyed also by the depth-decoder flags of models
    without one, which every request's sampling set: each new setting recorded graphs mid-run."""
    from speechctl.engine.params import Sampling

    rt = _runtime(engine)
    prompts = engine.prompt_builder()
    settings = [Sampling(temperature=0.0), Sampling(temperature=0.9, top_k=5), Sampling(temperature=0.7, top_k=60),
                Sampling(temperature=1.0, top_k=500), Sampling(temperature=1.1, top_p=0.8), Sampling(temperature=1.0)]
    before = rt.stats()["graph_captures"]
    alone_then_mixed(engine, lambda i: prompts.tts(f"varied {i}", audio_sampling=settings[i], seed=i, max_frames=4 + i,
                                                   tag=i), len(settings))
    assert rt.stats()["graph_captures"] == before


def test_varied_guidance_records_no_graph_after_start_up(engine):
    """CFG on and off, any scale and guided streams, beside sampled and greedy audio, alone and
    mixed (issue 21 item 5's workload): the graphs for all of them were recorded at start-up.
    (A pair sampling its text at a temperature, and Dia's CFG filter outside Dia, record theirs
    at first use: ``warmup.record_step_graphs``.)"""
    from speechctl.engine.params import Guidance, Sampling

    rt = _runtime(engine)
    prompts = engine.prompt_builder()
    cases = [
        dict(guidance=Guidance(scale=3.0)),
        dict(guidance=Guidance(scale=0.5, streams="audio"), audio_sampling=Sampling(temperature=0.9, top_k=40)),
        dict(guidance=Guidance(scale=2.0, streams="text")),
        dict(guidance=Guidance(scale=1.5), audio_sampling=Sampling(temperature=1.2, top_k=300, top_p=0.95)),
        dict(audio_sampling=Sampling(temperature=0.7)),
    ]
    before = rt.stats()["graph_captures"]
    alone_then_mixed(engine, lambda i: prompts.tts(f"guided {i}", seed=i, max_frames=3 + i, tag=i, **cases[i]), len(cases))
    assert rt.stats()["graph_captures"] == before


def test_a_variant_met_mid_run_is_captured_without_compiling(engine, monkeypatch):
    """A CFG pair sampling its text at a temperature, a variant left to its first use
    (``warmup.record_step_graphs``): captured mid-run from the plain sampling step, never the
    compiled one (which would compile it then: a stall of seconds for every live request), while
    the variants recorded at start-up keep the compiled step."""
    from speechctl.engine.params import Guidance, Sampling

    rt = _runtime(engine)
    calls = {"compiled": set(), "plain": set()}

    def counted(kind, step):
        def call(*args, **kwargs):
            calls[kind].add(rt.table.settings.graph_key())
            return step(*args, **kwargs)
        return call

    monkeypatch.setattr(rt, "_sample_step", counted("compiled", rt._sample_step))
    monkeypatch.setattr(rt, "_plain_sample_step", counted("plain", rt._plain_sample_step))
    prompts = engine.prompt_builder()
    before = rt.stats()["graph_captures"]
    (out,) = engine.generate([prompts.tts("chat with guidance", guidance=Guidance(scale=2.0), seed=3, max_frames=5,
                                          text_sampling=Sampling(temperature=0.8, top_k=20))])
    assert out.error is None
    assert rt.stats()["graph_captures"] > before  # the new variant: a capture
    assert calls["plain"] and not calls["plain"] & rt._compiled_variants  # only variants not met at start-up
    (out,) = engine.generate([prompts.tts("then a plain one", seed=4, max_frames=4)])
    assert out.error is None
    assert calls["compiled"] and calls["compiled"] <= rt._compiled_variants  # (the stand-in's replays call it)


@pytest.fixture(scope="module")
def csm_engine(tmp_path_factory, cuda_paths):
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    eng = make_engine(create_csm_checkpoint(tmp_path_factory.mktemp("csm") / "tiny-csm", CsmRecipe(seed=2)))
    yield eng
    eng.shutdown()


def test_a_depth_decoders_varied_sampling_records_no_graph_after_start_up(csm_engine):
    """CSM samples its depth codebooks by their own settings: greedy, top-k within and past the
    candidate set, top-p, none, beside any setting of codebook 0, alone and mixed, all met by
    graphs recorded at start-up (issue 21 item 5). Before, the depth codebooks' graphs were keyed
    by the requests' largest top-k itself, so each new setting recorded graphs mid-run. And the
    tokens a request draws do not depend on its batch, whichever graph the batch replays."""
    from speechctl.engine.params import Sampling

    rt = _runtime(csm_engine)
    assert rt.table.settings.depth_decoder
    prompts = csm_engine.prompt_builder()
    greedy, k5, k60, k500 = (Sampling(temperature=0.0), Sampling(temperature=0.9, top_k=5),
                             Sampling(temperature=0.7, top_k=60), Sampling(temperature=1.0, top_k=500))
    nucleus, free = Sampling(temperature=1.1, top_p=0.8), Sampling(temperature=1.0)
    cases = [(greedy, greedy), (greedy, k5), (k5, greedy), (k60, k500), (nucleus, free), (free, k60), (k500, nucleus)]

    def request(i):
        audio, depth = cases[i]
        return prompts.tts(f"case {i}", audio_sampling=audio, depth_sampling=depth, seed=i, max_frames=4 + i % 3, tag=i)

    before = rt.stats()["graph_captures"]
    alone, mixed = alone_then_mixed(csm_engine, request, len(cases))
    assert rt.stats()["graph_captures"] == before
    for a, m in zip(alone, mixed):
        np.testing.assert_array_equal(m.aux, a.aux, err_msg=f"case {m.tag} depends on its batch")


def test_the_stand_in_refuses_what_would_sync_the_host():
    """A replayed per-step function may not read device values into Python (CUDA's capture
    would fail on it, and it would stall the step): the stand-in says so."""
    import torch

    graphs = CpuGraphs([4], torch.device("cpu"))

    def branchy(x):
        return (x * 2 if x.sum() > 0 else x,)  # Tensor.__bool__: a sync

    def masked(x):
        return (x[x > 0].sum()[None],)  # its shape needs the host

    for fn in (branchy, masked):
        graphs.run(fn, fn.__name__, 3, [torch.ones(3)], [0.0])  # recorded: the eager run is fine
        with pytest.raises(RuntimeError, match="sync|host"):
            graphs.run(fn, fn.__name__, 3, [torch.ones(3)], [0.0])

