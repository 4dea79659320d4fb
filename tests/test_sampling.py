"""The on-device auxiliary-stream sampler against direct computations of what it should do."""

import numpy as np
import torch

from speechctl.engine.runtime.sampling import gumbel_noise, row_settings, sample_streams


def _sample(logits, temperature=1.0, top_k=0, top_p=1.0, seed=0, step=0):
    R = logits.shape[0]
    full = lambda v, dt: torch.full((R,), v, dtype=dt)
    return sample_streams(
        logits,
        full(temperature, torch.float32),
        full(top_k, torch.int64),
        full(top_p, torch.float32),
        full(seed, torch.int64),
        full(step, torch.int64),
    )


def test_greedy_is_argmax():
    logits = torch.randn(5, 3, 11)
    np.testing.assert_array_equal(_sample(logits, temperature=0.0), logits.argmax(-1))


def test_draws_follow_the_softmax():
    """Across steps (fresh noise each), draw frequencies match softmax(logits / T)."""
    torch.manual_seed(0)
    logits = torch.randn(1, 1, 6) * 2
    T = 0.7
    n = 20000
    rows = logits.expand(n, 1, 6).contiguous()
    steps = torch.arange(n)
    tokens = sample_streams(
        rows, torch.full((n,), T), torch.zeros(n, dtype=torch.int64), torch.ones(n),
        torch.full((n,), 123, dtype=torch.int64), steps,
    )
    freq = np.bincount(tokens[:, 0].numpy(), minlength=6) / n
    expected = torch.softmax(logits[0, 0] / T, -1).numpy()
    assert np.abs(freq - expected).max() < 0.015


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]]]).expand(2000, 1, 6).contiguous()
    n = logits.shape[0]
    base = dict(temperature=torch.full((n,), 1.5), seed=torch.full((n,), 9, dtype=torch.int64), step=torch.arange(n))
    top2 = sample_streams(logits, base["temperature"], torch.full((n,), 2), torch.ones(n), base["seed"], base["step"])
    assert set(top2.unique().tolist()) == {0, 1}
    # top_p: keep the smallest prefix whose mass reaches p.
    probs = torch.softmax(logits[0, 0] / 1.5, -1)
    p = float(probs[:3].sum()) - 1e-4  # needs exactly the first three tokens
    nucleus = sample_streams(logits, base["temperature"], torch.zeros(n, dtype=torch.int64), torch.full((n,), p), base["seed"], base["step"])
    assert set(nucleus.unique().tolist()) == {0, 1, 2}


def test_randomness_is_keyed_by_seed_and_step_not_by_batch():
    logits = torch.randn(4, 2, 50)
    one = _sample(logits[2:3], seed=5, step=7)
    batch = _sample(logits, seed=5, step=7)
    np.testing.assert_array_equal(one[0], batch[2])
    assert not torch.equal(gumbel_noise(torch.tensor([5]), torch.tensor([7]), 2, 50),
                           gumbel_noise(torch.tensor([5]), torch.tensor([8]), 2, 50))
    assert not torch.equal(gumbel_noise(torch.tensor([5]), torch.tensor([7]), 2, 50),
                           gumbel_noise(torch.tensor([6]), torch.tensor([7]), 2, 50))


def test_rows_with_different_settings_in_one_batch():
    logits = torch.randn(3, 2, 20)
    tokens = sample_streams(
        logits,
        torch.tensor([0.0, 1.0, 1.0]),
        torch.tensor([0, 1, 0]),
        torch.tensor([1.0, 1.0, 1.0]),
        torch.tensor([1, 2, 3]),
        torch.tensor([0, 0, 0]),
    )
    np.testing.assert_array_equal(tokens[0], logits[0].argmax(-1))  # greedy row
    np.testing.assert_array_equal(tokens[1], logits[1].argmax(-1))  # top-1 row


def test_top_k_candidates_sample_like_the_full_vocabulary():
    """Sampling among the top-k candidates (one ``topk``) draws exactly what the full sort draws:
    the noise is keyed by token id."""
    torch.manual_seed(1)
    R, K, V = 64, 3, 200
    logits = torch.randn(R, K, V) * 3
    args = (
        torch.full((R,), 0.8),
        torch.randint(1, 40, (R,)),
        torch.rand(R) * 0.5 + 0.5,
        torch.arange(R, dtype=torch.int64) * 7919,
        torch.arange(R, dtype=torch.int64),
    )
    full = sample_streams(logits, *args, max_top_k=0)
    candidates = sample_streams(logits, *args, max_top_k=40)
    np.testing.assert_array_equal(full, candidates)


def test_noise_and_settings_made_ahead_draw_what_the_sampler_draws():
    """A frame's noise made once for every stream and code (``gumbel_noise``) and the rows'
    settings derived once (``row_settings``), as CSM's codebook sampler does, give the draws the
    sampler makes from its own, stream by stream, with and without top-k / top-p, with one top-k
    for candidates or a full sort."""
    gen = torch.Generator().manual_seed(4)
    R, K, V = 6, 4, 37
    logits = torch.randn(R, K, V, generator=gen) * 3
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.3, 0.9, 1.0])
    top_k = torch.tensor([0, 5, 0, 12, 3, 0])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.9, 1.0, 0.5])
    seed, step = torch.randint(0, 2**40, (R,), generator=gen), torch.randint(0, 500, (R,), generator=gen)
    noise = gumbel_noise(seed, step, K, V)
    for flags in ({"any_filter": False}, {"any_filter": True}, {"any_filter": True, "max_top_k": 12}):
        t, k, p = (temperature, top_k * 0, top_p * 0 + 1) if not flags["any_filter"] else (temperature, top_k, top_p)
        own = sample_streams(logits, t, k, p, seed, step, **flags)
        ahead = sample_streams(logits, t, k, p, seed, step, noise=noise, **flags)
        assert torch.equal(own, ahead), flags
        rows = row_settings(t, k, p, V, flags["any_filter"], flags.get("max_top_k", 0))
        for s in range(K):  # one stream at a time, as the depth decoder samples codebooks
            one = sample_streams(logits[:, s : s + 1], t, k, p, seed, step, noise=noise[:, s : s + 1], rows=rows, **flags)
            assert torch.equal(one[:, 0], own[:, s]), (flags, s)


def test_top_p_of_one_filters_nothing_whatever_the_batch():
    """top_p 1 is off: a row draws the same with the nucleus step skipped (``any_top_p=False``)
    and with it run because another row of the batch filters by top-p, even where the mass above
    its tail tokens rounds to 1 (here token 0 holds all but e^-30 of it, and the noise favours
    token 7 by more than that gap)."""
    R, K, V = 4, 2, 50
    logits = torch.zeros(R, K, V)
    logits[:, :, 0] = 30.0
    noise = torch.zeros(R, K, V)
    noise[:, :, 7] = 40.0
    temperature, top_k = torch.ones(R), torch.zeros(R, dtype=torch.int64)
    seed = step = torch.zeros(R, dtype=torch.int64)
    off = torch.ones(R)
    skipped = sample_streams(logits, temperature, top_k, off, seed, step, any_top_p=False, noise=noise)
    assert (skipped == 7).all()
    mixed = off.clone()
    mixed[0] = 0.5  # one row filters: the batch runs the nucleus step
    beside = sample_streams(logits, temperature, top_k, mixed, seed, step, noise=noise)
    assert torch.equal(beside[1:], skipped[1:])
    assert (beside[0] == 0).all()  # token 0 alone holds more than half the mass


def test_all_random_skips_the_greedy_pick_and_draws_the_same():
    """``all_random`` (every row at temperature > 0, known on the host) leaves out the greedy
    argmax and the choice between it and the draw: the same tokens, with and without filters."""
    gen = torch.Generator().manual_seed(6)
    R, K, V = 5, 3, 40
    logits = torch.randn(R, K, V, generator=gen) * 2
    temperature = torch.tensor([0.5, 1.0, 1.3, 0.9, 2.0])
    top_k = torch.tensor([0, 5, 0, 12, 3])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.9, 1.0])
    seed, step = torch.randint(0, 2**40, (R,), generator=gen), torch.randint(0, 500, (R,), generator=gen)
    for flags in ({"any_filter": False}, {"any_filter": True}, {"any_filter": True, "max_top_k": 12}):
        k, p = (top_k, top_p) if flags["any_filter"] else (top_k * 0, top_p * 0 + 1)
        mixed = sample_streams(logits, temperature, k, p, seed, step, **flags)
        assert torch.equal(sample_streams(logits, temperature, k, p, seed, step, all_random=True, **flags), mixed)


def test_a_row_without_top_k_draws_the_same_beside_top_k_rows():
    """A request sampling without a top-k may draw any token, whatever the others in its batch
    filter by: the candidates the host flags ask for hold every token it may draw. (They were
    the batch's largest top-k: beside a top-5 request, three in four of its tokens changed.)"""
    from speechctl.engine.params import Sampling, StreamParams
    from speechctl.engine.runtime.settings import LiveSettings

    gen = torch.Generator().manual_seed(7)
    R, K, V = 4, 8, 1024
    logits = torch.randn(R, K, V, generator=gen) * 2
    seed, step = torch.tensor([3, 4, 5, 6]), torch.tensor([10, 11, 12, 13])
    samplings = [Sampling(temperature=1.0), Sampling(temperature=1.0, top_k=5), Sampling(temperature=0.8, top_p=0.9),
                 Sampling(temperature=0.0, top_k=3)]

    def draw(rows):
        live = LiveSettings(vocab=V)
        for i in rows:
            live.count(StreamParams(str(i), i, audio=samplings[i]), 1)
        t = torch.tensor([samplings[i].temperature for i in rows])
        k = torch.tensor([samplings[i].top_k for i in rows])
        p = torch.tensor([samplings[i].top_p for i in rows])
        return sample_streams(logits[rows], t, k, p, seed[rows], step[rows], **live.sampling_flags())

    for rows in ([0, 1], [0, 1, 3], [0, 1, 2, 3]):
        batch = draw(rows)
        for j, i in enumerate(rows):
            assert torch.equal(batch[j], draw([i])[0]), (rows, samplings[i])


def test_runtime_sampling_flags_follow_the_live_requests():
    """The host facts the runtime hands the sampler (and keys its graphs by) follow the live
    requests' settings as they come and go; depth-decoder settings are counted apart."""
    from speechctl.engine.params import Sampling, StreamParams
    from speechctl.engine.runtime import StreamRuntime
    from speechctl.models.csm.checkpoint import CsmRecipe, csm_config
    from speechctl.models.csm.family import csm_spec

    from speechctl.engine.runtime.slots import Admitted

    runtime = StreamRuntime(csm_spec(csm_config(CsmRecipe()).to_dict()), max_rows=4, max_len=64, device=torch.device("cpu"))
    flags = runtime.table.settings.sampling_flags

    def admit(row, params):
        runtime.admit(row + 1, [], [Admitted(row, params, prompt_len=3)], [])
    assert flags() == {"any_random": False, "all_random": False, "any_filter": False, "max_top_k": 0, "any_top_p": False}
    admit(0, StreamParams("a", 1, audio=Sampling(temperature=0.9, top_k=50), depth=Sampling(temperature=0.0)))
    assert flags() == {"any_random": True, "all_random": True, "any_filter": True, "max_top_k": 50, "any_top_p": False}
    assert flags(depth=True) == {"any_random": False, "all_random": False, "any_filter": False, "max_top_k": 0,
                                 "any_top_p": False}
    admit(1, StreamParams("b", 2, audio=Sampling(temperature=0.0, top_p=0.8)))  # greedy: it needs no candidates
    assert flags() == {"any_random": True, "all_random": False, "any_filter": True, "max_top_k": 50, "any_top_p": True}
    admit(2, StreamParams("c", 3, audio=Sampling(temperature=0.7, top_p=0.8)))  # may draw any token
    assert flags()["max_top_k"] == 0
    runtime.release(["c"])
    runtime.release(["a"])
    assert flags() == {"any_random": False, "all_random": False, "any_filter": True, "max_top_k": 0, "any_top_p": True}
    runtime.release(["b"])
    assert flags() == {"any_random": False, "all_random": False, "any_filter": False, "max_top_k": 0, "any_top_p": False}


def test_the_general_path_draws_what_the_specialized_paths_draw():
    """On CUDA the audio codebooks always take the general path (one graph whatever the live
    requests' settings): it must give every row the token the path specialized for the batch's
    settings gives — greedy rows, unfiltered rows, top-k and top-p rows alike."""
    from speechctl.engine.runtime.settings import CANDIDATE_SETS, GENERAL_SAMPLING

    gen = torch.Generator().manual_seed(4)
    R, K, V = 64, 4, 67
    logits = torch.randn(R, K, V, generator=gen) * 3
    logits[:, :, -3:] = float("-inf")  # rule-masked specials
    seed, step = torch.randint(0, 1 << 40, (R,), generator=gen), torch.randint(0, 500, (R,), generator=gen)
    cases = {
        "greedy": (torch.zeros(R), torch.zeros(R, dtype=torch.int64), torch.ones(R)),
        "random": (torch.full((R,), 0.9), torch.zeros(R, dtype=torch.int64), torch.ones(R)),
        "top-k": (torch.full((R,), 0.9), torch.randint(1, 40, (R,), generator=gen), torch.ones(R)),
        "top-p": (torch.full((R,), 1.1), torch.zeros(R, dtype=torch.int64), torch.full((R,), 0.7)),
    }
    for name, (temperature, top_k, top_p) in cases.items():
        mixed = torch.arange(R) % 2 == 0  # half the rows greedy: the general path mixes them
        temperature = torch.where(mixed, 0.0, temperature)
        specialized = dict(any_random=bool((temperature > 0).any()), all_random=bool((temperature > 0).all()),
                           any_filter=bool(((top_k > 0) | (top_p < 1)).any()), max_top_k=int(top_k.max()) if (top_p == 1).all() else 0,
                           any_top_p=bool((top_p < 1).any()))
        want = sample_streams(logits, temperature, top_k, top_p, seed, step, **specialized)
        got = sample_streams(logits, temperature, top_k, top_p, seed, step, **GENERAL_SAMPLING)
        assert torch.equal(got, want), name
        if name in ("greedy", "top-k"):  # every random row's top-k within the candidate set
            candidates = dict(GENERAL_SAMPLING, max_top_k=CANDIDATE_SETS[0])
            assert torch.equal(sample_streams(logits, temperature, top_k, top_p, seed, step, **candidates), want), name
