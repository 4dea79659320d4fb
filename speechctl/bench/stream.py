"""Streaming latency: time to first audio (TTFA) and chat-turn latency, streaming vs one-shot,
measured side by side in one process.

* TTS: ``concurrency`` requests of exactly ``frames`` audio frames each are submitted at once (the
  text is available at that moment). Streaming: the time until each request's first decoded chunk
  (``SpeechStreamer``) and its last; one-shot: the time until each request's whole waveform is
  decoded (``SpeechEngine.generate`` + one batched codec decode per step, what ``Speech.run``
  does). Medians over requests and repeats.
* Turn: a recorded utterance ("hello world", espeak-ng) through Whisper -> the response LM (a
  fixed number of tokens) -> TTS. Streaming: the staged pipeline (TTS starts on the LM's first
  phrase, audio plays per chunk). One-shot: the same stages one after the other, each waiting for
  the previous one to finish, then every phrase synthesized at once (same text, same seeds, so the
  same audio). Latencies are from the end of the user's speech (the utterance handed over) to
  the first and the last reply audio.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from speechctl.accelerator import has_cuda
from speechctl.bench.report import environment
from speechctl.bench.shapes import SHAPES, describe
from speechctl.codecs.streaming import default_max_chunk
from speechctl.engine.params import Sampling
from speechctl.errors import EngineError

AUDIO_SAMPLING = Sampling(temperature=0.9, top_k=50)
SAMPLE = Path(__file__).resolve().parent.parent.parent / "samples" / "hello.wav"


def run_stream_bench(
    shape: str = "tiny",
    concurrencies=(1, 4),
    frames: int = 64,
    repeats: int = 3,
    first_chunk: int = 2,
    max_chunks=None,
    turn: bool = True,
    reply_tokens: int = 96,
    engine_overrides: dict | None = None,
    speech=None,
    asr_model: str | None = None,
    lm_model: str | None = None,
    log=print,
) -> dict:
    """``speech``: an already loaded ``Speech`` of that shape to measure (tests), else one is
    built from ``SHAPES[shape]`` with random weights. ``max_chunks``: the streamed chunks'
    largest size in frames; each is a row of its own at every concurrency (the codec decodes each
    chunk with its context, so fewer, larger chunks cost it less; None: the codec's default).
    ``asr_model``/``lm_model``: the chat turn's Whisper and response LM (default: whisper-tiny.en,
    tiny-lm)."""
    startup = None
    with tempfile.TemporaryDirectory() as tmp:
        if speech is None:
            speech, startup = _load(shape, Path(tmp), max(concurrencies), frames, engine_overrides)
        max_chunks = max_chunks or (default_max_chunk(speech.codec),)
        rows = [_tts_row(speech, c, frames, repeats, first_chunk, m, log) for c in concurrencies for m in max_chunks]
        turn_row = _turn_row(speech, repeats, first_chunk, reply_tokens, asr_model, lm_model, log) if turn else None
        if startup is not None:
            speech.close()
    return {
        "benchmark": "stream",
        "model": describe(shape) if startup is not None else {"family": speech.checkpoint.family.name, "path": str(speech.checkpoint.path)},
        "codec": {"decode_context_frames": list(speech.codec.decode_context), "frame_rate": speech.codec.frame_rate,
                  "decode_graphs": speech.codec.decode_graphs},  # None: it decodes eagerly
        "first_chunk_frames": first_chunk,
        "repeats": repeats,
        "engine_startup_s": None if startup is None else round(startup, 1),
        "environment": {**environment(), "load_average_1m": round(os.getloadavg()[0], 2)},  # CPU contention
        "tts": rows,
        "turn": turn_row,
    }


def _load(shape: str, tmp: Path, concurrency: int, frames: int, engine_overrides: dict | None):
    from speechctl.api import Speech
    from speechctl.engine.engine import EngineConfig
    from speechctl.models.generic.checkpoint import create_multistream_checkpoint

    recipe = SHAPES[shape]
    path = create_multistream_checkpoint(tmp / shape, recipe)
    config = EngineConfig(
        max_num_seqs=max(8, 2 * concurrency),
        max_model_len=frames + 256,
        dtype=recipe.dtype,
        load_format="auto" if recipe.weights else "dummy",
        **(engine_overrides or {}),
    )
    if has_cuda():  # the chat turn's Whisper and response LM share the GPU
        config.gpu_memory_utilization = config.gpu_memory_utilization or 0.5
    started = time.perf_counter()
    speech = Speech(path, engine_config=config)
    return speech, time.perf_counter() - started


# -- TTS: time to first audio ------------------------------------------------------------------


def _requests(speech, count: int, frames: int) -> list:
    return [
        speech.prompts.tts(
            f"Sentence number {i} for the benchmark.",
            audio_sampling=AUDIO_SAMPLING,
            seed=i,
            max_frames=frames,
            min_frames=frames,
            tag=str(i),
        )
        for i in range(count)
    ]


def _streamed(speech, count: int, frames: int, first_chunk: int, max_chunk: int) -> tuple[list[float], list[float], dict]:
    from speechctl.api import TtsChunk
    from speechctl.pipeline.streamer import SpeechStreamer

    streamer = SpeechStreamer(speech, first_chunk=first_chunk, max_chunk=max_chunk)
    start = time.perf_counter()
    for request in _requests(speech, count, frames):
        streamer.submit_request(request.tag, request)
    first, last, samples = {}, {}, {}
    while streamer.busy():
        for event in streamer.step():
            if not isinstance(event, TtsChunk):
                continue
            if event.error:
                raise EngineError(f"benchmark request failed: {event.error}")
            now = time.perf_counter() - start
            samples[event.id] = samples.get(event.id, 0) + len(event.audio)
            if len(event.audio):
                first.setdefault(event.id, now)
            if event.last:
                last[event.id] = now
    _check_lengths(speech, samples, frames)
    parts = {"steps": streamer.steps, **streamer.seconds, "codec_busy": streamer.codec_busy_s,
             "pieces_per_request": streamer.pieces / count}  # (one a step before report_after)
    return list(first.values()), list(last.values()), parts


def _one_shot(speech, count: int, frames: int) -> tuple[list[float], dict]:
    start = time.perf_counter()
    done, samples = {}, {}
    parts = {"steps": 0, "engine": 0.0, "codec": 0.0}
    mark = start
    for outputs in speech.engine.generate_steps(_requests(speech, count, frames), every_step=True):
        began = time.perf_counter()  # the step's engine time: since the last step's decode ended
        parts["engine"] += began - mark
        parts["steps"] += 1
        codes = []
        for out in outputs:
            if out.error:
                raise EngineError(f"benchmark request failed: {out.error}")
            (segment,) = speech.prompts.audio_segments(out, starts_in_audio=True)
            codes.append((out.tag, segment))
        if codes:
            waves = speech.codec.decode([c for _, c in codes])
            now = time.perf_counter() - start
            for (tag, _), wave in zip(codes, waves):
                done[tag], samples[tag] = now, len(wave)
        mark = time.perf_counter()
        parts["codec"] += mark - began
    _check_lengths(speech, samples, frames)
    return list(done.values()), parts


def _check_lengths(speech, samples: dict, frames: int) -> None:
    expected = frames * speech.codec.hop_length  # (CSM's reading keeps its end frame: one more)
    if any(n < expected for n in samples.values()):
        raise EngineError(f"expected at least {expected} samples per request, got {sorted(set(samples.values()))}")


def _tts_row(speech, count: int, frames: int, repeats: int, first_chunk: int, max_chunk: int, log) -> dict:
    _streamed(speech, count, frames, first_chunk, max_chunk)  # warm-up at this batch size (and its windows' graphs)
    _one_shot(speech, count, frames)
    s_first, s_last, o_done, s_parts, o_parts, pair_ratios = [], [], [], [], [], []
    for _ in range(repeats):
        first, last, parts = _streamed(speech, count, frames, first_chunk, max_chunk)
        s_first += first
        s_last += last
        s_parts.append(parts)
        done, parts = _one_shot(speech, count, frames)
        o_done += done
        o_parts.append(parts)
        pair_ratios.append(round(statistics.median(last) / statistics.median(done), 3))
    row = {
        "concurrency": count,
        "max_chunk": max_chunk,
        "frames": frames,
        "audio_s": round(frames / speech.codec.frame_rate, 3),
        "streaming_ttfa_s": _median(s_first),
        "streaming_last_s": _median(s_last),
        "one_shot_ttfa_s": _median(o_done),  # the whole waveform is the first audio
        "one_shot_last_s": _median(o_done),
    }
    row["ttfa_speedup"] = round(row["one_shot_ttfa_s"] / row["streaming_ttfa_s"], 2)
    # what streaming costs in total time (issue 21 item 3: at most 1.1): the last streamed chunk
    # against the one-shot waveform, the same requests in the same engine
    row["last_vs_one_shot"] = round(row["streaming_last_s"] / row["one_shot_last_s"], 3)
    # the same ratio within each repeat's back-to-back pair: its spread is the run's own noise
    # (a process's steps can run 15 % slower for a while, whichever mode is running)
    row["last_vs_one_shot_by_repeat"] = pair_ratios
    # where each run's wall time went (medians over the repeats): the engine's steps, the codec
    # (streamed: planning, waiting for and handing out decodes, beside the worker's busy seconds;
    # one-shot: its decodes in the loop), the rest (streamed: each request's tokens to its reader)
    row["streaming_parts_s"] = {k: _median([p[k] for p in s_parts]) for k in s_parts[0]}
    row["one_shot_parts_s"] = {k: _median([p[k] for p in o_parts]) for k in o_parts[0]}
    log(
        f"tts c={count:3d} max chunk {max_chunk:3d}  first audio: streaming {1000 * row['streaming_ttfa_s']:8.1f} ms, "
        f"one-shot {1000 * row['one_shot_ttfa_s']:8.1f} ms  (last: {1000 * row['streaming_last_s']:.1f} ms "
        f"streaming, {row['last_vs_one_shot']:.2f}x one-shot; by repeat {pair_ratios})  for {row['audio_s']} s of audio"
    )
    return row


# -- chat turn ----------------------------------------------------------------------------------


def _turn_row(speech, repeats: int, first_chunk: int, reply_tokens: int, asr_model, lm_model, log) -> dict:
    from speechctl.audio import read_audio
    from speechctl.pipeline.build import ChatConfig, build_pipeline
    from speechctl.pipeline.lm import LmConfig
    from speechctl.pipeline.stage import Piece

    lm = LmConfig(max_tokens=reply_tokens, min_tokens=reply_tokens, seed=0)
    options = dict(seed=0, max_seconds=1.0)
    config = ChatConfig(asr_model=asr_model, lm_model=lm_model, lm=lm, tts_options=options, first_chunk=first_chunk)
    pipeline = build_pipeline(speech, config)
    asr_stage, lm_stage, _ = pipeline.stages
    rate = asr_stage.asr.sample_rate
    audio = read_audio(SAMPLE, rate)

    def streamed() -> dict:
        lm_stage.history.clear()  # every repeat answers the same first turn
        turn = pipeline.run(Piece(0, "audio", audio, last=True, sample_rate=rate))
        lat = turn.latencies()
        return {
            "first_audio_s": lat["tts_first"],
            "last_audio_s": lat["tts_last"],
            "asr_s": lat["asr_last"],
            "lm_first_phrase_s": lat["lm_first"],
            "lm_done_s": lat["lm_last"],
            "reply_audio_s": round(len(turn.reply_audio) / speech.sample_rate, 3),
        }

    def one_shot() -> dict:
        from speechctl.api import AsrJob, TtsJob

        start = time.perf_counter()
        (text,) = [r.text for r in asr_stage.asr.run([AsrJob(id="u", audio=audio)])]
        asr_done = time.perf_counter() - start
        lm_stage.history.clear()
        lm_stage.lm.submit("bench", lm_stage.messages(text.strip()), lm)  # the streamed run's prompt
        reply = ""
        while lm_stage.lm.busy():
            reply += "".join(delta for _, delta, _ in lm_stage.lm.step())
        lm_done = time.perf_counter() - start
        splitter = lm_stage._new_splitter()
        phrases = splitter.push(reply) + splitter.finish()
        jobs = [TtsJob(id=str(i), text=p, seed=i, max_seconds=1.0) for i, p in enumerate(phrases)]
        results = list(speech.run(jobs))
        done = time.perf_counter() - start
        samples = sum(len(r.audio) for r in results if r.audio is not None)
        return {"first_audio_s": round(done, 4), "last_audio_s": round(done, 4), "asr_s": round(asr_done, 4), "lm_done_s": round(lm_done, 4), "reply_audio_s": round(samples / speech.sample_rate, 3)}

    streamed(), one_shot()  # warm-up
    runs = {"streaming": [], "one_shot": []}
    for _ in range(repeats):
        runs["streaming"].append(streamed())
        runs["one_shot"].append(one_shot())
    row = {mode: {k: _median([r[k] for r in rs]) for k in rs[0]} for mode, rs in runs.items()}
    row["reply_tokens"] = reply_tokens
    log(
        f"turn  end of speech -> first audio: streaming {1000 * row['streaming']['first_audio_s']:.0f} ms, "
        f"one-shot {1000 * row['one_shot']['first_audio_s']:.0f} ms; -> last audio: streaming "
        f"{1000 * row['streaming']['last_audio_s']:.0f} ms, one-shot {1000 * row['one_shot']['last_audio_s']:.0f} ms "
        f"({row['streaming']['reply_audio_s']} s of reply audio)"
    )
    return row


def _median(values) -> float:
    return round(float(statistics.median(values)), 4)


def plot_stream(result: dict, path: str | Path) -> None:
    """Time to first audio per concurrency, streamed beside one-shot (whose first audio is the
    whole request), and the streamed speed-up (needs matplotlib)."""
    from speechctl.bench.report import plot_rates_and_ratio

    rates = [("streaming_ttfa_s", "o-", "streamed: first audio (s)"), ("one_shot_ttfa_s", "s:", "one-shot: first audio (s)"),
             ("streaming_last_s", "^--", "streamed: last audio (s)")]
    ratio = ("ttfa_speedup", "concurrent requests", "one-shot TTFA ÷ streamed TTFA", [(1.0, ":", "k", "no gain")])
    first = result["tts"][0].get("max_chunk")  # (the first chunking's rows, where several ran)
    plot_rates_and_ratio(result, path, rates, "seconds", ratio, rows=[r for r in result["tts"] if r.get("max_chunk") == first])
