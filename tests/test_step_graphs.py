"""speechctl.graphs on CUDA: a replayed step equals the eager step, padding rows write only
where the caller says, and batches past the largest bucket are left to the caller. (The engine-
level check is the parity suite, which runs with these graphs on CUDA.)"""

import pytest
import torch

from speechctl.engine.runtime.graphs import step_graphs_enabled
from speechctl.graphs import StepGraphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def test_step_graphs_are_off_on_the_cpu_and_by_switch(monkeypatch):
    assert not step_graphs_enabled(torch.device("cpu"))
    monkeypatch.setenv("SPEECHCTL_STEP_GRAPHS", "0")
    assert not step_graphs_enabled(torch.device("cuda"))


@cuda
def test_replay_equals_eager_and_padding_writes_only_scratch():
    device = torch.device("cuda")
    scratch = 9
    weight = torch.randn(16, 8, device=device)

    def make_state():
        return torch.zeros(scratch + 1, device=device)

    def step(state):
        def fn(x, slots):
            y = (x @ weight.T).softmax(dim=-1)  # a few kernels
            state.index_put_((slots,), y[:, 0], accumulate=False)
            return y.argmax(dim=-1), y

        return fn

    graphed_state, eager_state = make_state(), make_state()
    graphs = StepGraphs([2, 4, 8], device)
    assert graphs.bucket(3) == 4 and graphs.bucket(9) is None
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows in [3, 3, 1, 4, 2, 3, 8, 5]:
        x = torch.randn(rows, 8, device=device, generator=gen)
        slots = torch.randperm(scratch, device=device, generator=gen)[:rows]
        got = graphs.run(step(graphed_state), ("key",), rows, (x, slots), (None, scratch))
        want = step(eager_state)(x, slots)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)
        torch.testing.assert_close(graphed_state[:scratch], eager_state[:scratch])
    assert graphs.captured == 3  # buckets 4, 2 and 8, each recorded once
    assert graphs.run(step(graphed_state), ("key",), 9, (torch.zeros(9, 8, device=device), torch.zeros(9, dtype=torch.int64, device=device)), (None, scratch)) is None


def test_in_place_inputs_are_read_where_they_lie():
    """An ``InPlace`` input is not copied: a replay reads what its buffer holds at that moment,
    padding rows included (the caller keeps them fit: here the scratch slot), and a buffer
    shorter than the bucket runs eagerly (None)."""
    from cuda_stand_in import CpuGraphs

    from speechctl.graphs import InPlace

    scratch = 9
    state = torch.zeros(scratch + 1)
    slots = torch.full((8,), scratch, dtype=torch.int64)  # a persistent buffer, like the row slots

    def fn(x, slots):
        state.index_put_((slots,), x[:, 0])
        return (x[:, 0] * 2,)

    graphs = CpuGraphs([2, 4, 8], torch.device("cpu"))
    x = torch.arange(3.0)[:, None]
    slots[:3] = torch.tensor([4, 1, 7])
    (out,) = graphs.run(fn, "k", 3, (x, InPlace(slots)), (0.0, None))
    assert out.tolist() == [0.0, 2.0, 4.0] and state[[4, 1, 7]].tolist() == [0.0, 1.0, 2.0]
    slots[:3] = torch.tensor([2, 3, 5])  # the buffer changes between steps: the replay sees it
    (out,) = graphs.run(fn, "k", 3, (x + 10, InPlace(slots)), (0.0, None))
    assert CpuGraphs.replays >= 1 and out.tolist() == [20.0, 22.0, 24.0]
    assert state[[2, 3, 5]].tolist() == [10.0, 11.0, 12.0] and state[[4, 1, 7]].tolist() == [0.0, 1.0, 2.0]
    assert graphs.captured == 1
    # shorter than the bucket: not recorded (checked when a graph is; its replays get the same buffer)
    assert graphs.run(fn, "k2", 3, (x, InPlace(slots[:2])), (0.0, None)) is None
    with pytest.raises(RuntimeError, match="moved"):
        graphs.run(fn, "k", 3, (x, InPlace(slots.clone())), (0.0, None))


def test_a_compiled_step_compiles_once_for_every_size_but_one():
    """Why the per-step graphs have no one-row bucket (``StreamRuntime.use_step_graphs``): a
    compiled step's first trace at two rows serves every larger batch, while one row is a
    compile of its own (torch's 0/1 specialization), so recording that bucket first compiled each
    variant twice. If torch stops specializing one row, this fails and the bucket can return."""
    import torch._dynamo

    from speechctl.engine.runtime.graphs import compile_step

    step = compile_step(lambda rows, ids: (rows * 2 + 1)[ids.clamp(0, rows.shape[0] - 1)])
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]
    for n in (2, 3, 5, 8):
        step(torch.ones(n, 4), torch.arange(n))
    assert frames["unique_graphs"] - before == 1
    step(torch.ones(1, 4), torch.arange(1))
    assert frames["unique_graphs"] - before == 2


def test_one_compile_serves_every_candidate_set():
    """The general sampling path's candidate sets (``CANDIDATE_SETS``: a top 64, every token) are
    one trace of the compiled step, not a compile each: the count reaches ``topk`` as a
    symbolic size, whether the step compiles or comes from inductor's cache (run it twice).
    Each set keeps its own tokens, the same as the step run eagerly."""
    import torch._dynamo

    from speechctl.engine.runtime.graphs import compile_step
    from speechctl.engine.runtime.sampling import sample_streams
    from speechctl.engine.runtime.settings import CANDIDATE_SETS, GENERAL_SAMPLING, candidate_set

    rows, streams, vocab = 3, 2, 300
    logits = torch.randn(rows, streams, vocab, generator=torch.Generator().manual_seed(0))
    args = (torch.tensor([0.9, 0.0, 1.2]), torch.tensor([0, 5, 40]), torch.tensor([0.95, 1.0, 0.8]),
            torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]))
    step = compile_step(sample_streams)
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]
    for top_k in CANDIDATE_SETS:
        flags = dict(GENERAL_SAMPLING, max_top_k=candidate_set(top_k, vocab))
        got = step(logits, *args, **flags)
        assert torch.equal(got, sample_streams(logits, *args, **flags))
    assert frames["unique_graphs"] - before == 1
