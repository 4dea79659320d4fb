"""speechctl.codecs: the Codec interface, exact batching, DAC through transformers, load_codec.

A tiny random DAC (K=4 codebooks of 64, hop 320 at 16 kHz: 50 frames/s) stands in for real
checkpoints. "Exact" means within DECODE_TOLERANCE of decoding each item alone in float32 (the
observed difference is ~1e-8: float rounding of differently shaped batches); codes are compared
for equality.
"""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
import transformers

from speechctl.codecs import Codec, load_codec
from speechctl.accelerator import CODEC_MEMORY_ENV, codec_memory_budget
from speechctl.codecs.batching import frames_within, measure_context, run_exact_batched
from speechctl.errors import InputError

DECODE_TOLERANCE = 1e-5  # max abs difference, float32 waveforms in [-1, 1]
HOP = 320
K = 4
CODEBOOK_SIZE = 64


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The tiny models are too small to gain from threads, and on a busy machine OpenMP threads
    that wait on each other cost up to 20x; restored after this module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def dac_path(tmp_path_factory):
    config = transformers.DacConfig(
        n_codebooks=K,
        codebook_size=CODEBOOK_SIZE,
        encoder_hidden_size=8,
        downsampling_ratios=[2, 4, 5, 8],
        decoder_hidden_size=32,
        codebook_dim=8,
        sampling_rate=16000,
    )
    torch.manual_seed(1)
    model = transformers.DacModel(config).eval()
    path = tmp_path_factory.mktemp("codecs") / "codec"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def codec(dac_path) -> Codec:
    return load_codec(dac_path, device="cpu")


@pytest.fixture(scope="session")
def reference_model(dac_path):
    """An independent copy of the checkpoint, called the way transformers documents."""
    return transformers.DacModel.from_pretrained(dac_path).eval()


def random_codes(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, CODEBOOK_SIZE, (K, n), dtype=np.int64) for n in lengths]


def random_waveforms(sample_counts, seed=0):
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in sample_counts]


def boundary_lengths(context):
    """Lengths around the tail window W = left + right, where the batching strategy changes."""
    window = sum(context)
    return [window - 1, window, window + 1]


# ---- attributes and loading ----


def test_attributes(codec):
    assert isinstance(codec, Codec)
    assert codec.sample_rate == 16000
    assert codec.frame_rate == 50.0
    assert codec.hop_length == HOP
    assert codec.num_codebooks == K
    assert codec.codebook_size == CODEBOOK_SIZE
    assert codec.device == torch.device("cpu")
    assert not codec.model.training


def test_measured_receptive_fields(codec):
    # DAC is non-causal: both sides reach past the frame; the tiny model reaches ~9 frames.
    left, right = codec.decode_context
    assert 0 < left < 32 and 0 < right < 32
    left, right = codec.encode_context
    assert 0 < left < 32 and 0 < right < 32


def test_unknown_model_type_raises(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not_a_codec"}))
    with pytest.raises(ValueError, match="not_a_codec"):
        load_codec(tmp_path)


def test_missing_config_raises(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_codec(tmp_path)


# ---- decode ----


def test_decode_lengths_and_dtype(codec):
    lengths = [1, 7, 30, 64, 65]
    for waveform, n in zip(codec.decode(random_codes(lengths)), lengths):
        assert waveform.dtype == np.float32
        assert waveform.shape == (n * HOP,)


@pytest.mark.parametrize("lengths", [[1, 7, 30, 64, 65], [65, 1, 30, 1, 7, 64, 30]])
def test_batched_decode_equals_one_by_one(codec, lengths):
    lengths = lengths + boundary_lengths(codec.decode_context)
    codes = random_codes(lengths, seed=len(lengths))
    batched = codec.decode(codes)
    for item, waveform in zip(codes, batched):
        alone = codec.decode([item])[0]
        np.testing.assert_allclose(waveform, alone, rtol=0, atol=DECODE_TOLERANCE)


def test_naive_padding_would_differ(codec, reference_model):
    """Sanity check that the test above has teeth: plain right-padding changes the last samples."""
    short, long = random_codes([7, 30], seed=3)
    padded = np.concatenate([short, np.zeros((K, 23), dtype=np.int64)], axis=1)
    with torch.no_grad():
        out = reference_model.decode(audio_codes=torch.from_numpy(np.stack([padded, long]))).audio_values
    alone = codec.decode([short])[0]
    assert np.abs(out[0, : 7 * HOP - 8].numpy() - alone[: 7 * HOP - 8]).max() > 100 * DECODE_TOLERANCE


@pytest.mark.parametrize("length", [1, 7, 30, 65])
def test_decode_equals_transformers_decode(codec, reference_model, length):
    (codes,) = random_codes([length], seed=length)
    with torch.no_grad():
        reference = reference_model.decode(audio_codes=torch.from_numpy(codes)[None]).audio_values[0].numpy()
    reference = reference[: length * HOP]
    (longer,) = random_codes([length + 40], seed=length + 1)
    alone = codec.decode([codes])[0]
    in_batch = codec.decode([longer, codes])[1]
    for waveform in (alone, in_batch):
        np.testing.assert_allclose(waveform[: len(reference)], reference, rtol=0, atol=DECODE_TOLERANCE)
        # Stride 5 upsampling returns T*320 - 8 samples; the codec zero-pads to T*320.
        assert np.all(waveform[len(reference) :] == 0)


def test_compiled_codec_decodes_as_transformers_modules_do(dac_path, monkeypatch):
    """On CUDA ``load_codec`` compiles part of the decode (``codec_compile_mode``): each Snake
    activation into one kernel (``fuse_snakes``, the default), or the whole decoder
    (``compile_decoder``, SPEECHCTL_CODEC_COMPILE=decoder). Either way the decode stays
    transformers' (its Snakes given varied alphas, as trained ones have), for items of several
    lengths in one batch and one alone. Nothing is compiled on the CPU; a wrong setting is named."""
    from speechctl.codecs.base import codec_compile_mode, compile_decoder, fuse_snakes
    from speechctl.errors import InputError

    codecs = [load_codec(dac_path, device="cpu") for _ in range(3)]
    assert all(c.compiled is None and codec_compile_mode(c) == "none" for c in codecs)  # (the CPU)
    for codec in codecs:
        torch.manual_seed(5)
        with torch.no_grad():
            for module in codec.model.modules():
                if type(module).__name__ == "Snake1d":
                    module.alpha.uniform_(0.3, 3.0)
    plain, snakes, decoder = codecs
    assert fuse_snakes(snakes.model) == sum(type(m).__name__ == "Snake1d" for m in snakes.model.modules()) > 0
    assert compile_decoder(decoder) and type(decoder.model.decoder).__name__ == "OptimizedModule"
    items = random_codes([1, 9, 30], seed=3)
    want = plain.decode(items) + plain.decode(items[2:])
    for codec in (snakes, decoder):
        for got, ref in zip(codec.decode(items) + codec.decode(items[2:]), want):
            np.testing.assert_allclose(got, ref, rtol=0, atol=DECODE_TOLERANCE)
    monkeypatch.setenv("SPEECHCTL_CODEC_COMPILE", "everything")
    with pytest.raises(InputError, match="SPEECHCTL_CODEC_COMPILE='everything': give snakes, decoder or 0"):
        codec_compile_mode(plain)


def test_batch_of_64_uses_few_model_calls(codec, monkeypatch):
    calls = []
    decode_batch = codec._decode_batch

    def counting_decode_batch(codes):
        calls.append(tuple(codes.shape))
        return decode_batch(codes)

    monkeypatch.setattr(codec, "_decode_batch", counting_decode_batch)
    window = sum(codec.decode_context)
    lengths = list(range(window, window + 64))  # 64 different lengths, none shorter than W
    codes = random_codes(lengths, seed=64)
    batched = codec.decode(codes)
    assert len(calls) == 2  # one padded batch, one batch of tail windows
    for i in (0, 31, 63):
        np.testing.assert_allclose(batched[i], codec.decode([codes[i]])[0], rtol=0, atol=DECODE_TOLERANCE)


def test_small_batch_budget_splits_calls_and_stays_exact(codec, monkeypatch):
    lengths = [1, 3, 3, 20, 25, 40, 41, 64]
    codes = random_codes(lengths, seed=5)
    expected = codec.decode(codes)
    monkeypatch.setattr(codec, "max_batch_frames", 50)
    for waveform, reference in zip(codec.decode(codes), expected):
        np.testing.assert_allclose(waveform, reference, rtol=0, atol=DECODE_TOLERANCE)


def test_frames_within_a_memory_budget():
    # 1 GiB at 1 MiB a frame: 1,024 frames; never more than the configured most, never fewer
    # than the floor (a call always takes one item), the floor itself capped by the most.
    assert frames_within(2**30, 2**20, most=32768) == 1024
    assert frames_within(2**30, 2**20, most=500) == 500
    assert frames_within(2**20, 2**20, most=32768) == 64
    assert frames_within(2**20, 2**20, most=10) == 10
    assert frames_within(2**30, 0.0, most=32768) == 32768  # a probe that allocated nothing


def test_codec_memory_budget_default_and_setting(monkeypatch):
    monkeypatch.delenv(CODEC_MEMORY_ENV, raising=False)
    assert codec_memory_budget(free_bytes=100 * 2**30) == 4 * 2**30  # the default cap
    assert codec_memory_budget(free_bytes=2 * 2**30) == 2**30  # half of what is free
    monkeypatch.setenv(CODEC_MEMORY_ENV, "1.5")
    assert codec_memory_budget(free_bytes=2 * 2**30) == int(1.5 * 2**30)
    for bad in ("lots", "0", "-2"):
        monkeypatch.setenv(CODEC_MEMORY_ENV, bad)
        with pytest.raises(InputError, match=CODEC_MEMORY_ENV):
            codec_memory_budget(free_bytes=2**30)


def test_fit_to_memory_leaves_the_cpu_batches_alone(codec):
    before = codec.max_batch_frames
    codec.fit_to_memory(budget_bytes=1)
    assert codec.max_batch_frames == before and codec.decode_bytes_per_frame is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="measures CUDA memory")
def test_decode_on_cuda_stays_within_the_codec_memory_budget(dac_path):
    # load_codec fits the batches to a budget from a probe decode; a batch of 64 items then
    # decodes in several calls, none of which takes more than the budget (with a probe's
    # margin: activations grow with frames, the probe's fixed part makes it conservative).
    budget = 64 * 2**20
    codec = load_codec(dac_path, device="cuda")
    codec.fit_to_memory(budget_bytes=budget)
    assert codec.decode_bytes_per_frame > 0 and codec.max_batch_frames < 64 * 2000
    codes = random_codes([2000] * 64, seed=7)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    waveforms = codec.decode(codes)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= 1.25 * budget
    # (cuDNN's TF32 convolutions: batches of other shapes round differently)
    np.testing.assert_allclose(waveforms[5], codec.decode([codes[5]])[0], rtol=0, atol=5e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_decode_graphs_on_cuda_take_about_one_decode_of_memory(dac_path, monkeypatch):
    """The decode graphs record into one shared pool, so that all of them hold about one
    decode's activations (the budget), not the sum over every bucket and length; their
    recordings' eager runs keep another in the caching allocator. So at most ~2.5 budgets beside
    the weights and the graphs' output buffer. (Higgs 3B's workload bench ran the H200 out of
    memory while recording them, with 11.3 GiB in graph pools: this says whether the pool is
    shared as meant.)"""
    budget = 64 * 2**20
    monkeypatch.setenv("SPEECHCTL_CODEC_MEMORY", str(budget / 2**30))
    monkeypatch.setenv("SPEECHCTL_CODEC_GRAPHS", "1")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    codec = load_codec(dac_path, device="cuda")
    recorded = codec.record_decode_graphs([16, 32, 64], most_rows=1 << 20)
    torch.cuda.synchronize()
    fixed = sum(t.numel() * t.element_size() for t in [*codec.model.parameters(), *codec.model.buffers(), codec._graph_out])
    grown = torch.cuda.memory_reserved() - before - fixed
    assert recorded >= 12, codec.decode_graphs
    assert grown <= 2.5 * budget, f"{recorded} graphs took {grown / 2**20:.0f} MiB for a {budget / 2**20:.0f} MiB budget"


def test_decode_empty_and_bad_input(codec):
    assert codec.decode([]) == []
    (empty,) = codec.decode([np.zeros((K, 0), dtype=np.int64)])
    assert empty.shape == (0,) and empty.dtype == np.float32
    with pytest.raises(ValueError, match=r"codes\[0\].*shape"):
        codec.decode([np.zeros((K + 1, 5), dtype=np.int64)])
    with pytest.raises(ValueError, match=r"codes\[1\].*\[0, 64\)"):
        codec.decode([np.zeros((K, 5), dtype=np.int64), np.full((K, 5), CODEBOOK_SIZE)])
    with pytest.raises(ValueError, match="integer"):
        codec.decode([np.zeros((K, 5), dtype=np.float32)])
    with pytest.raises(ValueError, match="list"):
        codec.decode(np.zeros((K, 5), dtype=np.int64))


# ---- encode ----


def test_encode_shapes_dtype_range(codec):
    sample_counts = [1, HOP - 1, HOP, HOP + 1, 30 * HOP + 17]
    for codes, n in zip(codec.encode(random_waveforms(sample_counts)), sample_counts):
        assert codes.dtype == np.int64
        assert codes.shape == (K, -(-n // HOP))
        assert codes.min() >= 0 and codes.max() < CODEBOOK_SIZE


def test_encode_pads_partial_frame_with_zeros(codec):
    (waveform,) = random_waveforms([7 * HOP + 100], seed=2)
    padded = np.concatenate([waveform, np.zeros(HOP - 100, dtype=np.float32)])
    np.testing.assert_array_equal(codec.encode([waveform])[0], codec.encode([padded])[0])


def test_batched_encode_equals_one_by_one(codec):
    frames = [1, 7, 30, 64, 65] + boundary_lengths(codec.encode_context)
    sample_counts = [n * HOP - (37 * i) % HOP for i, n in enumerate(frames)]
    waveforms = random_waveforms(sample_counts, seed=7)
    batched = codec.encode(waveforms)
    for waveform, codes in zip(waveforms, batched):
        np.testing.assert_array_equal(codes, codec.encode([waveform])[0])


def test_encode_empty_and_bad_input(codec):
    (empty,) = codec.encode([np.zeros(0, dtype=np.float32)])
    assert empty.shape == (K, 0) and empty.dtype == np.int64
    with pytest.raises(ValueError, match="mono"):
        codec.encode([np.zeros((2, HOP), dtype=np.float32)])
    with pytest.raises(ValueError, match="float"):
        codec.encode([np.zeros(HOP, dtype=np.int16)])
    with pytest.raises(ValueError, match="NaN"):
        codec.encode([np.full(HOP, np.nan, dtype=np.float32)])


def test_round_trip(codec):
    sample_counts = [HOP * 5 + 3, HOP * 40]
    codes = codec.encode(random_waveforms(sample_counts, seed=9))
    waveforms = codec.decode(codes)
    for waveform, n in zip(waveforms, sample_counts):
        assert waveform.shape == (-(-n // HOP) * HOP,)
        assert np.all(np.isfinite(waveform)) and np.abs(waveform).max() <= 1.0


# ---- the batching engine on its own, with known receptive fields ----


def conv_model(kernel_size: int, causal: bool):
    """A zero-padded conv stack (two layers with bias) over [B, N] -> [B, N]: fixed reach."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(1, 1, kernel_size, generator=generator) for _ in range(2)]

    def run(batch: torch.Tensor) -> torch.Tensor:
        hidden = batch[:, None, :].float()
        for weight in weights:
            pad = (kernel_size - 1, 0) if causal else ((kernel_size - 1) // 2, kernel_size // 2)
            hidden = torch.nn.functional.conv1d(torch.nn.functional.pad(hidden, pad), weight)
            hidden = torch.tanh(hidden + 0.5)
        return hidden[:, 0, :]

    return run


@pytest.mark.parametrize("causal", [False, True])
def test_run_exact_batched_on_conv_stack(causal):
    run = conv_model(kernel_size=5, causal=causal)

    def probe(frames):
        base = torch.randn(1, frames)
        changed = base.clone()
        changed[0, frames // 2] += 1.0
        return base, changed

    context = measure_context(run, probe, out_per_frame=1, margin=0)
    assert context == ((8, 0) if causal else (4, 4))
    items = [torch.randn(n) for n in [1, 3, 7, 8, 9, 20, 20, 33]]
    outputs = run_exact_batched(
        items, run, in_per_frame=1, out_per_frame=1, context=context, max_batch_frames=64
    )
    for item, output in zip(items, outputs):
        torch.testing.assert_close(output, run(item[None])[0], rtol=0, atol=1e-6)


def test_decode_queue_merges_the_batches_that_wait_behind_a_running_decode():
    """On CUDA a worker thread decodes: batches submitted while it is busy go into its next
    decode together (one codec call, not one each), and come back in submission order with
    their tags; a failed decode fails the batches that were in it where they are read."""
    import threading
    import time
    import types

    from speechctl.codecs.worker import DecodeQueue

    release, calls = threading.Event(), []

    def decode(codes):
        calls.append([item.shape[1] for item in codes])
        if len(calls) == 1:
            release.wait(10)  # busy while the next batches arrive
        if len(calls) == 3:
            raise ValueError("bad codes")
        return [np.full(item.shape[1], item.shape[1], dtype=np.float32) for item in codes]

    queue = DecodeQueue(types.SimpleNamespace(device=torch.device("cuda"), decode=decode))
    try:
        queue.submit(["a"], [np.zeros((2, 1))])
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.001)
        queue.submit(["b", "c"], [np.zeros((2, 2)), np.zeros((2, 3))])
        queue.submit(["d"], [np.zeros((2, 4))])
        release.set()
        out = [(tag, len(wave)) for tag, wave in queue.ready(wait=True)]
        queue.submit(["e"], [np.zeros((2, 5))])
        with pytest.raises(ValueError, match="bad codes"):
            list(queue.ready(wait=True))
    finally:
        queue.close()
    assert calls == [[1], [2, 3, 4], [5]]
    assert out == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]


def test_urgent_batches_are_decoded_first_and_apart_from_the_bulk_waiting():
    """Streamed chunks (urgent) waiting behind a running decode go into the worker's next decode
    alone, before the whole waveforms (bulk) that arrived before them, which follow in one call;
    urgent futures complete in submission order."""
    import threading
    import time
    import types

    from speechctl.codecs.worker import DecodeQueue

    release, calls, done = threading.Event(), [], []

    def decode(codes):
        calls.append([item.shape[1] for item in codes])
        if len(calls) == 1:
            release.wait(10)  # busy while the next batches arrive
        return [np.zeros(item.shape[1], dtype=np.float32) for item in codes]

    queue = DecodeQueue(types.SimpleNamespace(device=torch.device("cuda"), decode=decode))
    try:
        running = queue.decode([np.zeros((2, 1))])
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.001)
        futures = [queue.decode([np.zeros((2, 100))]),  # a one-shot request's whole codes
                   queue.decode([np.zeros((2, 2))], urgent=True),  # streamed windows
                   queue.decode([np.zeros((2, 200))]),
                   queue.decode([np.zeros((2, 3)), np.zeros((2, 4))], urgent=True)]
        for name, future in zip("BUBU", futures):
            future.add_done_callback(lambda _, name=name: done.append(name))
        release.set()
        assert [len(w) for f in [running] + futures for w in f.result(10)] == [1, 100, 2, 200, 3, 4]
    finally:
        queue.close()
    assert calls == [[1], [2, 3, 4], [100, 200]]
    assert done == ["U", "U", "B", "B"]


# ---- fixed windows and decode graphs (CUDA; their CPU stand-in here) ----


def conv_recording(causal: bool):
    """The conv stack, its receptive field, and the same run recording each call's frames."""
    run, shapes = conv_model(kernel_size=5, causal=causal), []

    def recording(batch):
        shapes.append(batch.shape[-1])
        return run(batch)

    return run, ((8, 0) if causal else (4, 4)), recording, shapes


@pytest.mark.parametrize("causal", [False, True])
def test_run_in_fixed_windows_equals_the_whole_run(causal):
    """With ``window``, an item longer than it runs as windows of exactly that many frames (one
    shape for the decode graphs) and comes out as the whole run; shorter items are unchanged."""
    from speechctl.codecs.batching import _fixed_windows

    run, context, recording, shapes = conv_recording(causal)

    items = [torch.randn(n) for n in [3, 17, 18, 19, 40, 100, 101]]
    outputs = run_exact_batched(items, recording, in_per_frame=1, out_per_frame=1, context=context,
                                max_batch_frames=64, window=18)
    for item, output in zip(items, outputs):
        torch.testing.assert_close(output, run(item[None])[0], rtol=0, atol=1e-6)
    assert 18 in shapes and max(shapes) == 18  # nothing ran longer than the window
    # the windows tile the item: kept frames follow each other from 0 to its end
    for frames in (19, 40, 100, 101):
        spans = _fixed_windows(frames, 18, *context)
        assert [skip + start for start, skip, _ in spans] == list(np.cumsum([0] + [k for *_, k in spans])[:-1])
        assert sum(k for *_, k in spans) == frames and all(start + 18 <= frames for start, _, _ in spans)
    with pytest.raises(ValueError, match="keeps nothing"):
        _fixed_windows(40, 8, 4, 4)


@pytest.mark.parametrize("causal", [False, True])
def test_batches_padded_to_given_lengths_stay_exact(causal):
    """``pad_to``: a batch runs at the least of the given lengths that holds its longest item (the
    graphs' few shapes); the padding is undone at each item's natural end as ever."""
    run, context, recording, shapes = conv_recording(causal)

    for lengths in ([3], [9, 9], [14], [10, 12, 17], [20, 31], [33, 5]):
        items = [torch.randn(n) for n in lengths]
        for item, output in zip(items, run_exact_batched(items, recording, in_per_frame=1, out_per_frame=1, context=context,
                                                         max_batch_frames=256, pad_to=(12, 16, 32))):
            torch.testing.assert_close(output, run(item[None])[0], rtol=0, atol=1e-6)
    # non-causal: the natural-end windows (left + right frames) and items shorter than them at
    # their own length; past the longest given length a batch runs at its longest item's
    assert set(shapes) == ({12, 16, 32, 33} | ({8, 3, 5} if not causal else set()))


def graphed(codec_path, monkeypatch):
    """A codec that decodes through its graphs, recorded and replayed by the CPU stand-in
    (tests/cuda_stand_in.py: a replay runs the decode again on the static, padded batch and
    fails on anything that would sync the host, which a CUDA graph cannot hold)."""
    from cuda_stand_in import CpuGraphs

    codec = load_codec(codec_path, device="cpu")
    monkeypatch.setattr("speechctl.codecs.base.StepGraphs", CpuGraphs)
    codec.use_decode_graphs(core=24)
    return codec


def test_whole_items_meet_only_graphs_recorded_ahead_with_padded(dac_path, monkeypatch):
    """``record_decode_graphs(padded=True)`` (the streamer's, for its one-shot requests' whole
    audio) records every length a call is padded to: items of any length, alone or batched, then
    decode without a graph recorded mid-run (on CUDA a capture synchronizes the device and
    empties the caching allocator while the engine runs). Without it, such items record theirs."""
    lengths = ([1], [5, 9], [13, 30, 2], [70], [7, 64, 3, 100])

    def recorded_while_decoding(padded: bool) -> int:
        fast = graphed(dac_path, monkeypatch)
        assert fast.record_decode_graphs([], most_rows=1 << 20, padded=padded) > 0
        before = fast.decode_graphs_recorded
        for seed, batch in enumerate(lengths):
            fast.decode(random_codes(batch, seed=seed))
        return fast.decode_graphs_recorded - before

    assert recorded_while_decoding(padded=True) == 0
    assert recorded_while_decoding(padded=False) > 0


def test_a_capture_failing_while_recording_ahead_frees_the_graphs_before_the_eager_decode(codec, dac_path, monkeypatch):
    """Out of memory in one capture of ``record_decode_graphs`` (the streamer's start): the codec
    decodes eagerly from then on, and its graphs (on CUDA: their memory pool) are gone before that
    eager decode runs, which needs the memory; then it decodes as the eager codec does."""
    import weakref

    from cuda_stand_in import CpuGraphs

    fast = graphed(dac_path, monkeypatch)
    graphs = weakref.ref(fast._graphs)
    captures = []

    def entry(self, fn, static):
        captures.append(static[0].shape)
        if len(captures) == 3:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return _Entry(fn, static, None)

    from speechctl.graphs import _Entry

    monkeypatch.setattr(CpuGraphs, "_entry", entry)
    eager_with_graphs_alive = []
    decode_batch = fast._decode_batch

    def watched(codes):
        if fast._graphs is None:
            eager_with_graphs_alive.append(graphs() is not None)
        return decode_batch(codes)

    monkeypatch.setattr(fast, "_decode_batch", watched)
    assert fast.record_decode_graphs([], most_rows=4, padded=True) == 0
    assert len(captures) == 3 and fast.decode_graphs is None
    assert eager_with_graphs_alive == [False]
    codes = random_codes([5, 40, 90], seed=3)
    for waveform, reference in zip(fast.decode(codes), codec.decode(codes)):
        np.testing.assert_allclose(waveform, reference, rtol=0, atol=DECODE_TOLERANCE)


def test_an_eager_decode_out_of_memory_runs_in_halves(codec, dac_path, monkeypatch, caplog):
    """A decode call the device has no memory for (stood in for: more than two rows at once) is
    decoded in halves of its rows, down to what fits, and gives the audio of the whole call; the
    split is said once; one row out of memory fails as before."""
    import logging

    small = load_codec(dac_path, device="cpu")
    decode_batch, calls = small._decode_batch, []

    def two_rows_at_most(codes):
        calls.append(codes.shape[0])
        if codes.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")
        return decode_batch(codes)

    monkeypatch.setattr(small, "_decode_batch", two_rows_at_most)
    codes = random_codes([30] * 5, seed=4)  # one call of five rows
    with caplog.at_level(logging.WARNING, logger="speechctl.codecs.base"):
        ours = small.decode(codes)
        small.decode(codes)
    for waveform, reference in zip(ours, codec.decode(codes)):
        np.testing.assert_allclose(waveform, reference, rtol=0, atol=DECODE_TOLERANCE)
    assert calls[:5] == [5, 2, 3, 1, 2]  # 5 -> 2 + 3 -> 2 + (1 + 2)
    assert sum("decodes such calls in halves" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(small, "_decode_batch", lambda codes: (_ for _ in ()).throw(torch.OutOfMemoryError("one row")))
    with pytest.raises(torch.OutOfMemoryError, match="one row"):
        small.decode(random_codes([30], seed=5))


def test_decode_graphs_give_the_eager_decode(codec, dac_path, monkeypatch):
    """Through the graphs (stood in for on the CPU), long items in fixed windows and batches
    padded to their bucket decode as the eager codec does; the graphs are a few shapes, kept
    below their limit, and a decode that a graph cannot hold falls back to eager."""
    from cuda_stand_in import CpuGraphs

    fast = graphed(dac_path, monkeypatch)
    left, right = fast.decode_context
    assert fast.graph_window == left + 24 + right
    assert fast.decode_graphs.startswith(f"windows of {fast.graph_window} frames, calls padded to ")
    lengths = [1, 7, 30, 64, 65, 200, 3, 7]
    codes = random_codes(lengths, seed=11)
    before = CpuGraphs.replays
    for waveform, reference in zip(fast.decode(codes), codec.decode(codes)):
        np.testing.assert_allclose(waveform, reference, rtol=0, atol=DECODE_TOLERANCE)
    again = fast.decode(random_codes(lengths, seed=12))
    assert CpuGraphs.replays > before and len(again) == len(lengths)
    recorded = fast.decode_graphs_recorded
    assert 0 < recorded <= 10  # (bucket, frames): the window and the short items' lengths
    fast.decode(random_codes(lengths, seed=13))
    assert fast.decode_graphs_recorded == recorded  # the same shapes replay, nothing new recorded
    # every length from the context's to the window's, in one call: padded to the window, its
    # ends decoded again in natural-end windows of left + right frames: two shapes
    spread = random_codes(range(left + right, fast.graph_window + 1), seed=17)
    for waveform, reference in zip(fast.decode(spread), codec.decode(spread)):
        np.testing.assert_allclose(waveform, reference, rtol=0, atol=DECODE_TOLERANCE)
    assert fast.decode_graphs_recorded - recorded <= 2
    recorded = fast.decode_graphs_recorded
    # recorded ahead: every bucket up to most_rows, for the lengths given and the window
    sizes = [n for n in fast._graphs.sizes if n <= 4]
    lengths = {left + right + 3, 5, fast.graph_window}
    missing = sum(not fast._graphs.recorded(n, f) for n in sizes for f in lengths)
    assert fast.record_decode_graphs([left + right + 3, 5], most_rows=4) == missing > 0
    assert all(fast._graphs.recorded(n, f) for n in sizes for f in (left + right + 3, 5, fast.graph_window))
    assert fast.record_decode_graphs([left + right + 3, 5], most_rows=4) == 0  # nothing left to record
    recorded = fast.decode_graphs_recorded
    (again_short,) = fast.decode(random_codes([left + right + 3], seed=18))  # its own length now: no padding
    assert fast.decode_graphs_recorded == recorded
    fast._graphs.most = fast.decode_graphs_recorded  # at the limit a new shape runs eagerly
    (odd,) = fast.decode(random_codes([41], seed=14))
    np.testing.assert_allclose(odd, codec.decode(random_codes([41], seed=14))[0], rtol=0, atol=DECODE_TOLERANCE)
    assert fast.decode_graphs_recorded == recorded

    def syncs(batch):  # what a CUDA graph cannot record: the codec falls back to eager, and says so
        float(batch.sum())
        return fast.model.decode(audio_codes=batch).audio_values

    monkeypatch.setattr(fast, "_decode_batch", syncs)
    fast._graphs.most = None
    fast.decode(random_codes([33], seed=16))  # recorded (the stand-in checks for syncs at its replays)
    (waveform,) = fast.decode(random_codes([33], seed=15))
    assert fast.decode_graphs is None
    np.testing.assert_allclose(waveform, codec.decode(random_codes([33], seed=15))[0], rtol=0, atol=DECODE_TOLERANCE)


def test_a_decode_graph_without_the_memory_for_it_is_not_recorded(dac_path, monkeypatch):
    """A graph whose capture would not fit in the device's free memory beside the largest eager
    decode (and a quarter more) is left out: those calls decode eagerly, the same waveforms, and
    the graphs that fit go on replaying."""
    fast, eager = graphed(dac_path, monkeypatch), load_codec(dac_path, device="cpu")
    fast.decode_bytes_per_frame, fast.max_batch_frames = 1000.0, 64  # (measured on CUDA at load)
    free = {"bytes": 0.0}
    monkeypatch.setattr(fast, "_free_bytes", lambda: free["bytes"])
    assert fast.record_decode_graphs([16], most_rows=4) == 0
    codes = random_codes([16, 16], seed=31)
    for waveform, reference in zip(fast.decode(codes), eager.decode(codes)):
        np.testing.assert_allclose(waveform, reference, rtol=0, atol=DECODE_TOLERANCE)
    assert fast.decode_graphs_recorded == 0 and fast.decode_graphs is not None
    free["bytes"] = 1.25 * 1000.0 * (2 * 16 + 64) + 1  # room for 2 x 16 frames, not for 4 x 16
    assert fast.record_decode_graphs([16], most_rows=4) >= 1
    assert fast._graphs.recorded(2, 16) and not fast._graphs.recorded(4, 16)
    for waveform, reference in zip(fast.decode(codes), eager.decode(codes)):
        np.testing.assert_allclose(waveform, reference, rtol=0, atol=DECODE_TOLERANCE)


def test_the_codec_leaves_an_engines_step_room_alone(dac_path, monkeypatch):
    """Memory the driver reports free is not all the codec's: an engine beside it left room in
    its share for its steps' activations (``leave_free_bytes``). A graph that fits in what is free
    but not beside that room is not recorded (the real Higgs 3B's prefill ran out of memory
    after the codec recorded its graphs into the engine's room)."""
    fast = graphed(dac_path, monkeypatch)
    fast.decode_bytes_per_frame, fast.max_batch_frames = 1000.0, 64
    smallest = fast._graphs.sizes[0]
    need = 1.25 * 1000.0 * (smallest * 16 + 64)  # the smallest graph of 16 frames beside the largest eager decode
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(need) + 1 - 4096, 80 << 30))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # the allocator's segments: 4,096 bytes unused in its default pool, and a CUDA graph pool's
    # 1 GiB unused (it serves only that pool's captures, vLLM's: never the codec's), and another
    # device's
    segment = lambda device, pool, total, allocated: {"device": device, "segment_pool_id": pool,  # noqa: E731
                                                      "total_size": total, "allocated_size": allocated}
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: [segment(0, (0, 0), 10_000, 10_000 - 4096),
                                                                segment(0, (1, 3), 2 << 30, 1 << 30),
                                                                segment(1, (0, 0), 1 << 30, 0)])
    assert fast._free_bytes() == int(need) + 1  # the driver's free and the default pool's unused blocks
    fast.leave_free_bytes = 2048
    assert fast._free_bytes() == int(need) + 1 - 2048
    assert fast.record_decode_graphs([16], most_rows=2) == 0  # fits what is free, not beside the room
    fast.leave_free_bytes = 0
    assert fast.record_decode_graphs([16], most_rows=2) >= 1
    fast.leave_free_bytes = 10 * int(need)
    assert fast._free_bytes() == 0  # (never below nothing)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_decode_graphs_on_cuda_give_the_eager_decode(dac_path, monkeypatch):
    """load_codec records decode graphs on CUDA; they give what the eager decode gives (TF32
    convolutions of other batch shapes round differently: the tolerance), recorded once per
    shape, and a streamed request's windows meet only a few shapes."""
    from speechctl.codecs.streaming import StreamingDecoder

    monkeypatch.setenv("SPEECHCTL_CODEC_GRAPHS", "1")
    fast = load_codec(dac_path, device="cuda")
    assert fast.decode_graphs.startswith(f"windows of {fast.graph_window} frames, calls padded to ")
    monkeypatch.setenv("SPEECHCTL_CODEC_GRAPHS", "0")
    eager = load_codec(dac_path, device="cuda")
    assert eager.decode_graphs is None and eager.decode_graphs_recorded == 0
    codes = random_codes([1, 7, 30, 64, 65, 300, 3], seed=21)
    for _ in range(2):
        for waveform, reference in zip(fast.decode(codes), eager.decode(codes)):
            np.testing.assert_allclose(waveform, reference, rtol=0, atol=5e-3)
    recorded = fast.decode_graphs_recorded
    assert recorded > 0
    streamed = StreamingDecoder(fast)
    (long,) = random_codes([400], seed=22)
    chunks = []
    for t in range(400):
        chunks += streamed.step({"a": long[:, t : t + 1]}, ended=["a"] if t == 399 else [])
    np.testing.assert_allclose(np.concatenate([c.audio for c in chunks]), eager.decode([long])[0], rtol=0, atol=5e-3)
    assert fast.decode_graphs_recorded - recorded <= 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("family", ["higgs_audio_v2", "csm"])
def test_the_families_codecs_record_their_decode_graphs_on_cuda(family, tmp_path, monkeypatch):
    """Higgs' tokenizer (windows) and Mimi (causal, padded calls: its mask code skips its host
    sync while a graph is captured) record their decode graphs on CUDA, and replay what eager
    gives. In float32: with cuDNN's default TF32 a graph's padded call picks other convolution
    kernels than the eager call at its own length, and random-weight Mimi's waveform (peak ~4)
    then differed by up to 0.012 at 82 of 9,600 samples on the H200 (thirty-first session):
    rounding that would hide a padded call's leak, not one."""
    if family == "csm":
        from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

        path = create_csm_checkpoint(tmp_path / "m", CsmRecipe())
    else:
        from speechctl.models.higgs.checkpoint import HiggsRecipe, create_higgs_checkpoint

        path = create_higgs_checkpoint(tmp_path / "m", HiggsRecipe()) / "audio_tokenizer"
    from speechctl.codecs.dac import codes_in_float32  # (TF32 off for matmuls and convolutions)

    with codes_in_float32():
        monkeypatch.setenv("SPEECHCTL_CODEC_GRAPHS", "1")
        fast = load_codec(path, device="cuda")
        # Mimi's conv padding scalars stay on the host on CUDA (else F.pad syncs it: no capture)
        assert all(m.stride.device.type == "cpu" for m in fast.model.modules() if type(m).__name__ == "MimiConv1d")
        monkeypatch.setenv("SPEECHCTL_CODEC_GRAPHS", "0")
        eager = load_codec(path, device="cuda")
        rng = np.random.default_rng(0)
        for lengths in [(1, 5), (30, 30, 9), (300,), (5, 1)]:
            codes = [rng.integers(0, fast.codebook_size, (fast.num_codebooks, n)) for n in lengths]
            for waveform, reference in zip(fast.decode(codes), eager.decode(codes)):
                np.testing.assert_allclose(waveform, reference, rtol=0, atol=5e-3)
    assert fast.decode_graphs is not None and fast.decode_graphs_recorded > 0


def test_codec_graphs_are_on_on_cuda_unless_turned_off(dac_path, monkeypatch):
    """Decode graphs (decode_graphs_enabled): on CUDA by default, off with
    SPEECHCTL_CODEC_GRAPHS=0, never on the CPU."""
    from speechctl.codecs.base import decode_graphs_enabled

    codec = load_codec(dac_path)
    on_cuda = types.SimpleNamespace(device=torch.device("cuda"), decode_context=codec.decode_context)
    monkeypatch.delenv("SPEECHCTL_CODEC_GRAPHS", raising=False)
    assert decode_graphs_enabled(on_cuda) and not decode_graphs_enabled(codec)
    monkeypatch.setenv("SPEECHCTL_CODEC_GRAPHS", "0")
    assert not decode_graphs_enabled(on_cuda) and not decode_graphs_enabled(codec)


def test_mimi_and_encodec_keep_their_conv_padding_on_the_host(tmp_path):
    """transformers' Mimi and EnCodec convolutions turn scalar buffers into F.pad's Python ints:
    on the GPU a host sync per convolution, which also breaks a CUDA graph capture (H200,
    thirtieth session). Their codecs keep those scalars on the CPU wherever the model runs, and
    decode as before."""
    from transformers import EncodecConfig, EncodecModel

    from speechctl.codecs.base import keep_conv_padding_on_host
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    from speechctl.codecs.mimi import load_mimi

    path = create_csm_checkpoint(tmp_path / "csm", CsmRecipe())
    mimi = load_codec(path)
    convs = [m for m in mimi.model.modules() if type(m).__name__ == "MimiConv1d"]
    assert convs and keep_conv_padding_on_host(mimi.model) == len(convs)
    assert all(m.stride.device.type == "cpu" and m.padding_total.device.type == "cpu" for m in convs)
    codes = np.random.default_rng(4).integers(0, mimi.codebook_size, (1, mimi.num_codebooks, 9))
    with torch.no_grad():
        untouched = load_mimi(path).eval().decode(torch.from_numpy(codes)).audio_values[0, 0].numpy()
    np.testing.assert_allclose(mimi.decode([codes[0]])[0], untouched, rtol=0, atol=1e-6)
    encodec = EncodecModel(EncodecConfig(num_filters=4, upsampling_ratios=[2, 2], codebook_size=16, hidden_size=8,
                                         num_lstm_layers=1, target_bandwidths=[1.5]))
    assert keep_conv_padding_on_host(encodec) == sum(type(m).__name__ == "EncodecConv1d" for m in encodec.modules()) > 0


def test_a_causal_codec_pads_its_calls_to_few_lengths_for_its_graphs(tmp_path, monkeypatch):
    """Mimi is causal: its calls are padded at the end to one of a few lengths for its graphs,
    which changes none of the frames kept. (Stood in for without the host-sync check: Mimi's mask
    code syncs where no graph is being captured, and skips that on CUDA while one is.)"""
    from cuda_stand_in import CpuGraphs

    from speechctl.codecs.base import GRAPH_FRAMES
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    class Replays(CpuGraphs):
        def _replay(self, entry):
            CpuGraphs.replays += 1
            return entry.graph(*entry.inputs)

    path = create_csm_checkpoint(tmp_path / "csm", CsmRecipe())
    eager = load_codec(path)
    assert eager.decode_context[1] == 0
    monkeypatch.setattr("speechctl.codecs.base.StepGraphs", Replays)
    fast = load_codec(path)
    fast.use_decode_graphs()
    assert fast.graph_window is None and fast.decode_graphs.startswith("causal")
    rng = np.random.default_rng(3)
    before = CpuGraphs.replays
    for lengths in [(1, 5), (9,), (30, 30), (700, 3), (5, 1)]:  # a causal call is padded to its longest item
        codes = [rng.integers(0, fast.codebook_size, (fast.num_codebooks, n)) for n in lengths]
        for waveform, reference in zip(fast.decode(codes), eager.decode(codes)):
            np.testing.assert_allclose(waveform, reference, rtol=0, atol=1e-5)
    # calls of 5 frames -> 8, 9 -> 12, 30 -> 32, each recorded once (700, past the longest: eager)
    assert all(fast._graphs.recorded(rows, frames) for rows, frames in [(2, 8), (1, 12), (2, 32)])
    assert {8, 12, 32} <= set(GRAPH_FRAMES) and fast.decode_graphs_recorded == 3 and CpuGraphs.replays == before + 1
