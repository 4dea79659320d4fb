"""Latency under load: a workload driven by arrivals, as a server sees it.

Requests arrive as a Poisson process at several rates, up to and past saturation, into one
engine (``SpeechStreamer``: streamed and one-shot requests side by side). Each request's text has
3-60 words and its audio a length that follows (``FRAMES_PER_WORD``: random weights would not
end by themselves, and fixed lengths keep runs comparable); half stream, half are one-shot; the
sampling varies (temperature, top-k 1-500, top-p), and where the family guides, a quarter use CFG
at varied scales. Per rate: the sustained audio-s/s, p50 / p95 time to first audio (one-shot: its
whole audio) and end-to-end latency, and the graph captures and torch.compile frames during the
timed run (after warm-up both should be 0), and the codec's decode graphs recorded in it. Saturation is measured first: every request of a
round submitted at once, then the same round with uniform settings (one sampling, one CFG scale:
``varied_vs_uniform`` is what the variety costs), twice, in the order varied, uniform, uniform, varied.

    speechctl bench --workload --shape llama-1b --rates 0.3,0.5,0.7,0.9,1.2
"""

from __future__ import annotations

import collections
import gc
import os
import time
from dataclasses import replace

import numpy as np

from speechctl.codecs.streaming import StreamingDecoder, default_max_chunk
from speechctl.engine.params import Guidance, Sampling
from speechctl.errors import EngineError
from speechctl.jobs import TtsJob

FIRST_CHUNK = 2  # frames of a streamed request's first chunk
FRAMES_PER_WORD = 6  # ~0.24 s of speech per word at 25 frames/s
WORDS = ("the quick brown fox jumps over a lazy dog while seven birds sing near old stone walls "
         "and rivers run under bright cold skies far from any town").split()


def workload(count: int, rng: np.random.Generator, frame_rate: float, cfg: bool) -> list[tuple[TtsJob, bool]]:
    """``count`` (job, streamed) of the mix (module doc), deterministic for ``rng``."""
    jobs = []
    for i in range(count):
        words = int(rng.integers(3, 61))
        seconds = words * FRAMES_PER_WORD / frame_rate
        sampling = Sampling(temperature=float(rng.uniform(0.5, 1.2)), top_k=int(rng.integers(1, 501)),
                            top_p=float(rng.choice([1.0, 0.95, 0.9])))
        guidance = Guidance(scale=float(rng.uniform(1.5, 4.0))) if cfg and rng.random() < 0.25 else Guidance()
        text = " ".join(rng.choice(WORDS, words)) + "."
        job = TtsJob(id=f"w{i}", text=text, audio_sampling=sampling, seed=i, max_seconds=seconds, guidance=guidance)
        jobs.append((job, bool(rng.random() < 0.5)))
    return jobs


UNIFORM_SAMPLING = Sampling(temperature=0.9, top_k=50)
UNIFORM_CFG_SCALE = 3.0
ROUND_ORDER = ("varied", "uniform", "uniform", "varied")  # the saturated rounds' settings, in turn
ROUND_KEYS = ("audio_s_per_s", "makespan_s", "steps", "engine_s", "codec_busy_s")  # each saturated round's, side by side


def uniform(jobs: list[tuple[TtsJob, bool]]) -> list[tuple[TtsJob, bool]]:
    """The same jobs with one setting for all (issue 21's yardstick for varied settings): one
    sampling, CFG where they have it at one scale; the same texts, lengths and streaming."""
    return [(replace(job, audio_sampling=UNIFORM_SAMPLING,
                     guidance=Guidance(scale=UNIFORM_CFG_SCALE) if job.guidance.enabled else Guidance()), stream)
            for job, stream in jobs]


def fixed_length(speech, job: TtsJob):
    """The job's engine request, its audio exactly ``max_seconds`` long: random weights would end
    anywhere, and other sampling elsewhere, so rounds that differ in settings alone (the uniform
    round) would otherwise do different work. One request, its text uncut: the bench's texts are
    prompts of the lengths it names, not speech to split."""
    request = speech.request(job, None)
    return replace(request, min_frames=request.max_frames)


def drive(speech, jobs: list[tuple[TtsJob, bool]], arrivals: list[float], first_chunk: int = FIRST_CHUNK,
          first_lookahead: int | None = None, max_chunk: int | None = None) -> tuple[dict, dict]:
    """Submit each job at its arrival time (seconds from now) and step the engine until all are
    done; per job: arrival, first audio, last audio (times from the start), audio seconds; and
    where the steps' time went (``SpeechStreamer.seconds``). ``first_lookahead``: the streamed
    requests' first chunks wait for that many frames past them (None: exact chunks);
    ``max_chunk``: their largest chunk."""
    from speechctl.pipeline.streamer import SpeechStreamer

    # every round's prompts prefilled as new requests' are: the saturated rounds and the loads
    # repeat one set of texts, and vLLM's prefix cache served the later rounds' prompts from the
    # first's (the first saturated round waited 332 ms for its first outputs, the next three
    # 65-81: H200, forty-sixth session)
    speech.engine.forget_cached_prompts()
    streamer = SpeechStreamer(speech, first_chunk=first_chunk, first_lookahead=first_lookahead, max_chunk=max_chunk)
    graphs_before, kernels_before = speech.codec.decode_graphs_recorded, _triton_kernels()
    start = time.perf_counter()
    pending = sorted(zip(arrivals, range(len(jobs))))
    seen = {job.id: {"arrival": t, "stream": stream} for t, (job, stream) in zip(arrivals, jobs)}
    samples: dict[str, int] = {}
    # per engine step: did it finish a prefill, did the codec decode beside it, were requests
    # submitted just before it, its engine seconds (_step_split)
    step_seconds: list[tuple[bool, bool, bool, float]] = []
    with _GcPauses() as gc_pauses:
        while pending or streamer.busy():
            now = time.perf_counter() - start
            submitted = False
            while pending and pending[0][0] <= now:
                _, i = pending.pop(0)
                job, stream = jobs[i]
                streamer.submit_request(job.id, fixed_length(speech, job), stream=stream)
                submitted = True
            if not streamer.busy():
                time.sleep(max(0.0, min(pending[0][0] - now, 0.01)))
                continue
            before = (streamer.engine_steps, streamer.first_outputs, streamer.seconds["engine"])
            decoding, started = streamer.codec_activity()
            chunks = streamer.step()
            if streamer.engine_steps > before[0]:
                beside_codec = decoding or streamer.codec_activity()[1] > started
                step_seconds.append((streamer.first_outputs > before[1], beside_codec, submitted,
                                     streamer.seconds["engine"] - before[2]))
            for chunk in chunks:
                row, t = seen[chunk.id], time.perf_counter() - start
                if chunk.error:
                    raise EngineError(f"workload request failed: {chunk.error}")
                if len(chunk.audio) and "first" not in row:
                    row["first"] = t
                samples[chunk.id] = samples.get(chunk.id, 0) + len(chunk.audio)
                if chunk.last:
                    row["last"] = t
    for job_id, row in seen.items():
        row["audio_s"] = samples.get(job_id, 0) / speech.sample_rate
    for wait in streamer.first_audio:  # the driver's part: a request arriving mid-step waits for its end
        wait["arrival_to_submit_s"] = wait["submitted_at"] - start - seen[wait["id"]]["arrival"]
    split = {f"{part}_s": round(t, 3) for part, t in streamer.seconds.items()}
    # the codec's decode graphs recorded in this round (each a capture beside the engine's steps,
    # which waited for it in the fortieth session's varied round): which round paid for them
    recorded = max(0, speech.codec.decode_graphs_recorded - graphs_before)  # (0 where they fell back to eager)
    # the streamed requests' windows: their frames with the context decoded again beside each
    # chunk (the one-shot requests' audio is decoded whole, apart from these)
    return seen, {"steps": streamer.steps, **split, "codec_busy_s": round(streamer.codec_busy_s, 3),
                  "codec_graphs_recorded": recorded, **_triton_compiled_since(kernels_before),
                  "streamed_window_frames": streamer.decoder.window_frames,
                  "step_ms": _step_split(step_seconds), "gc_pauses": gc_pauses.summary(),
                  "first_audio": streamer.first_audio}


def summarize(driven: tuple[dict, dict]) -> dict:
    """TTFA counts a one-shot request's whole audio as its first; ``streamed_ttfa_*`` are the
    streamed requests' alone (what a listener waits for before the first sound), and
    ``streamed_steps_to_audio_*`` the engine steps they waited (TTFA is that many steps at the
    load's step time: too many steps and too slow steps need different cures)."""
    rows, split = driven
    split = dict(split)
    waits = split.pop("first_audio")
    first = [r["first"] - r["arrival"] for r in rows.values()]
    streamed = [r["first"] - r["arrival"] for r in rows.values() if r["stream"]]
    last = [r["last"] - r["arrival"] for r in rows.values()]
    makespan = max(r["last"] for r in rows.values()) - min(r["arrival"] for r in rows.values())
    audio = sum(r["audio_s"] for r in rows.values())
    ms = lambda xs, q: round(1000 * float(np.percentile(xs, q)), 1) if xs else None
    pct = lambda xs, q: round(float(np.percentile(xs, q)), 1) if xs else None
    return {"requests": len(rows), "streamed": len(streamed), "audio_s": round(audio, 2),
            "makespan_s": round(makespan, 3), "audio_s_per_s": round(audio / makespan, 2),
            "ttfa_p50_ms": ms(first, 50), "ttfa_p95_ms": ms(first, 95),
            "streamed_ttfa_p50_ms": ms(streamed, 50), "streamed_ttfa_p95_ms": ms(streamed, 95),
            "streamed_steps_to_audio_p50": pct([w["steps_to_audio"] for w in waits], 50),
            "streamed_steps_to_audio_p95": pct([w["steps_to_audio"] for w in waits], 95),
            # of those: the steps until the first chunk went to the codec, then the wait for it
            "first_chunk_planned_steps_p50": pct([w["steps_to_plan"] for w in waits], 50),
            "first_chunk_planned_steps_p95": pct([w["steps_to_plan"] for w in waits], 95),
            "first_chunk_decode_ms_p50": ms([w["decode_wait_s"] for w in waits], 50),
            "first_chunk_decode_ms_p95": ms([w["decode_wait_s"] for w in waits], 95),
            # the streamed TTFA in parts (each part's own percentiles: they need not add up):
            # arrival to submission (the driver's step in progress), submission to the engine's
            # first output for it (queueing and prefill), from there to the first chunk planned
            # (decode steps, and the step time they ran at), then the codec's decode above
            "ttfa_parts_ms": {part: {"p50": ms([w[key] for w in waits], 50), "p95": ms([w[key] for w in waits], 95)}
                              for part, key in (("arrival_to_submit", "arrival_to_submit_s"),
                                                ("submit_to_first_output", "to_output_s"),
                                                ("first_output_to_plan", "output_to_plan_s"))},
            "steps_to_first_output_p50": pct([w["steps_to_output"] for w in waits], 50),
            "decode_step_ms_before_first_chunk_p50": ms([w["output_to_plan_s"] / max(1, w["steps_to_plan"] - w["steps_to_output"])
                                                        for w in waits], 50),
            "e2e_p50_ms": ms(last, 50), "e2e_p95_ms": ms(last, 95), **split}


def described(row: dict) -> str:
    """One round's ``summarize`` in a log line."""
    return (f"{row['audio_s_per_s']} audio-s/s, TTFA p50/p95 {row['ttfa_p50_ms']}/{row['ttfa_p95_ms']} ms "
            f"(streamed {row['streamed_ttfa_p50_ms']}/{row['streamed_ttfa_p95_ms']} ms, "
            f"{row['streamed_steps_to_audio_p50']}/{row['streamed_steps_to_audio_p95']} steps; first chunk planned after "
            f"{row['first_chunk_planned_steps_p50']}/{row['first_chunk_planned_steps_p95']} steps, decoded in "
            f"{row['first_chunk_decode_ms_p50']}/{row['first_chunk_decode_ms_p95']} ms; p50 parts: arrival to submit "
            f"{row['ttfa_parts_ms']['arrival_to_submit']['p50']} ms, to first output {row['ttfa_parts_ms']['submit_to_first_output']['p50']} ms, "
            f"to plan {row['ttfa_parts_ms']['first_output_to_plan']['p50']} ms at {row['decode_step_ms_before_first_chunk_p50']} ms/step), "
            f"e2e p50/p95 {row['e2e_p50_ms']}/{row['e2e_p95_ms']} ms; {row['steps']} steps: engine {row['engine_s']} s, "
            f"codec {row['codec_s']} s, host {row['host_s']} s (a step p50/p95: with a prefill "
            f"{_p(row, 'prefill')}, decodes only {_p(row, 'decode_only')}; beside the codec {_p(row, 'beside_codec')}, "
            f"codec idle {_p(row, 'codec_idle')}; after a submission {_p(row, 'after_submit')}, "
            f"none {_p(row, 'no_submit')}); garbage collections by generation {row['gc_pauses']['collections']}, "
            f"longest {row['gc_pauses']['longest_ms']} ms; the codec decoded {row['codec_busy_s']} s "
            f"and recorded {row['codec_graphs_recorded']} decode graphs; Triton compiled {row['triton_kernels_compiled']} kernels"
            + "".join(f", {n} {name}" for name, n in row["triton_kernels_compiled_names"].items()))


class _GcPauses:
    """Python's garbage collections while it lives, per generation: how many and how long (a
    full collection stops every thread; is one of them a long step under load?)."""

    def __init__(self):
        self._started = None
        self.counts, self.seconds, self.longest = [0, 0, 0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            took, generation = time.perf_counter() - self._started, info["generation"]
            self.counts[generation] += 1
            self.seconds[generation] += took
            self.longest[generation] = max(self.longest[generation], took)

    def __enter__(self) -> "_GcPauses":
        return self

    def __exit__(self, *_) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"collections": self.counts, "ms": [round(1000 * t, 2) for t in self.seconds],
                "longest_ms": [round(1000 * t, 2) for t in self.longest]}


def _p(row: dict, part: str) -> str:
    """One part of a row's ``step_ms``, for the log line."""
    stats = row["step_ms"][part]
    return f"{stats['p50']}/{stats['p95']} ms x{stats['steps']}"


def _step_split(steps: list[tuple[bool, bool, bool, float]]) -> dict:
    """The engine's step time in ms (p50, p95, how many) split three ways, each a suspect for
    the slow steps under load, where TTFA is steps times step time: the steps that finished a
    request's prefill (a prompt beside the decodes) or not (decodes only); those during which
    the codec decoded on its thread (sharing the GPU and Python's lock) or not; those just after
    requests were submitted (their admission) or not."""
    def stats(xs):
        return {"p50": round(1000 * float(np.percentile(xs, 50)), 2), "p95": round(1000 * float(np.percentile(xs, 95)), 2),
                "steps": len(xs)} if xs else {"p50": None, "p95": None, "steps": 0}

    def split(index: int, yes: str, no: str) -> dict:
        return {yes: stats([s[-1] for s in steps if s[index]]), no: stats([s[-1] for s in steps if not s[index]])}

    return {**split(0, "prefill", "decode_only"), **split(1, "beside_codec", "codec_idle"),
            **split(2, "after_submit", "no_submit")}


def _compiles() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


def _triton_kernels() -> dict[str, str]:
    """Kernels in Triton's on-disk cache, entry -> kernel name: one more for each kernel Triton
    compiles (its own JIT, as vLLM's fused MoE kernel's for a tile or specialization not met
    before, which torch's compile counters do not see; a stall in the step that meets it). Where
    a cache from an earlier process has the kernel, it is read, not compiled, and not counted."""
    try:
        from triton import knobs

        folder = knobs.cache.dir
    except (ImportError, AttributeError):  # (no Triton: the CPU; an older one)
        folder = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    if not os.path.isdir(folder):
        return {}
    return {entry: _kernel_name(os.path.join(folder, entry)) for entry in os.listdir(folder)}


def _kernel_name(entry: str) -> str:
    """A cache entry's kernel: its files are named after it (``fused_moe_kernel.json``, ...)."""
    names = sorted(f.rsplit(".", 1)[0] for f in os.listdir(entry) if f.endswith(".json")) if os.path.isdir(entry) else []
    return next((n for n in names if not n.startswith("__grp__")), names[0].removeprefix("__grp__") if names else "?")


def _triton_compiled_since(before: dict[str, str]) -> dict:
    """The kernels Triton compiled since ``before`` (``_triton_kernels()``): how many, and of which."""
    new = [name for entry, name in _triton_kernels().items() if entry not in before]
    return {"triton_kernels_compiled": len(new), "triton_kernels_compiled_names": dict(collections.Counter(new))}


def _memory(speech) -> dict | None:
    """The GPU's memory in GiB: its total, what is in use (this process's unused cached blocks
    not counted), the room the engine's steps may still need (which the codec leaves
    alone); and the codec's batch bound and decode graphs; None on the CPU."""
    import torch

    from speechctl.accelerator import device_bytes_in_use, device_bytes_total

    if not torch.cuda.is_available():
        return None
    in_gib = {"total": device_bytes_total(), "in_use": device_bytes_in_use(), "engine_step_room": speech.engine.step_room_bytes}
    return {**{name: round(b / 2**30, 2) for name, b in in_gib.items()},
            "codec_max_batch_frames": speech.codec.max_batch_frames, "codec_decode_graphs": speech.codec.decode_graphs_recorded}


def run_workload_bench(speech, rates=(0.3, 0.5, 0.7, 0.9, 1.2), requests: int = 64, seed: int = 0, log=print,
                       partial=None, eager_codec_rates=(), lookahead_rates=(), first_lookahead: int = 4,
                       max_chunks=None) -> dict:
    """``rates``: fractions of the saturated request rate. ``speech``: a loaded ``Speech``.
    ``partial(result)`` is called after the saturated run and after every rate (a run cut short
    by a time limit still leaves what it measured). ``lookahead_rates``: loads run again, the
    same arrivals, with the first chunk waiting for ``first_lookahead`` frames past it instead
    of the codec's whole right context (``first_lookahead``: the inexact first chunk's TTFA side
    by side with the exact one's). ``eager_codec_rates``: loads run again at the end, the same
    arrivals, with the codec decoding eagerly (``eager_codec``: what its CUDA graphs are worth,
    side by side; nothing where it has none). ``max_chunks``: the streamed requests' largest
    chunks (None: the codec's default); the saturated rounds and the other rounds use the first,
    and each load runs at every one, the same arrivals (a row per load and largest chunk, side by
    side)."""
    from speechctl.bench.report import environment, host_probe

    cfg = speech.checkpoint.family.cfg is not None
    rate = speech.codec.frame_rate
    # the codec's graphs of every batch size (the streamer records those up to 64 rows) and
    # length, so that a saturated round's large batches do not record theirs in it. Before the
    # warm-up: each capture empties the caching allocator (torch.cuda.graph), and the engine's
    # steps after it allocate their blocks anew (recorded between the warm-up and the first timed
    # round, the varied one, that round's prefill waited 307 ms for its first output against the
    # uniform round's 94: H200, forty-fifth session)
    max_chunks = list(max_chunks or (default_max_chunk(speech.codec),))
    early = StreamingDecoder(speech.codec, first_chunk=FIRST_CHUNK, first_lookahead=first_lookahead, max_chunk=max_chunks[0])
    exact = [StreamingDecoder(speech.codec, first_chunk=FIRST_CHUNK, max_chunk=m) for m in max_chunks]
    for decoder in exact + ([early] if lookahead_rates else []):
        speech.codec.record_decode_graphs(decoder.window_lengths(), most_rows=1 << 20, padded=True)
    # warm-up, a saturated round of other texts and settings: compiles, graphs and the allocator
    # at the timed rounds' batch sizes, so that the first timed round (the varied one) pays for
    # nothing the uniform round after it does not
    warm = workload(requests, np.random.default_rng(seed + 1), rate, cfg)
    drive(speech, warm, [0.0] * len(warm), max_chunk=max_chunks[0])
    memory = _memory(speech)  # before the timed runs: a run that ran out reads by it (the log has it)
    log(f"memory: {memory}")
    jobs = workload(requests, np.random.default_rng(seed), rate, cfg)
    mean_audio = float(np.mean([j.max_seconds for j, _ in jobs]))
    captures, compiles, kernels = speech.engine.stats()["graph_captures"], _compiles(), _triton_kernels()
    codec_graphs = speech.codec.decode_graphs_recorded
    # every request at once, in ROUND_ORDER: whatever drifts through the four rounds (or favours
    # the first) weighs on both settings alike; one pair read 1.000, 0.889 and 0.864 in three runs
    round_jobs = {"varied": jobs, "uniform": uniform(jobs)}
    rounds = [summarize(drive(speech, round_jobs[settings], [0.0] * len(jobs), max_chunk=max_chunks[0]))
              for settings in ROUND_ORDER]
    saturated, same = rounds[ROUND_ORDER.index("varied")], rounds[ROUND_ORDER.index("uniform")]
    saturated_rate = saturated["audio_s_per_s"] / mean_audio  # requests/s the engine sustains
    summed = {settings: sum(r["audio_s_per_s"] for s, r in zip(ROUND_ORDER, rounds) if s == settings) for settings in round_jobs}
    varied_vs_uniform = summed["varied"] / summed["uniform"]
    log(f"saturation ({saturated_rate:.2f} requests/s): {described(saturated)}")
    log(f"saturation with uniform settings: {same['audio_s_per_s']} audio-s/s; rounds {', '.join(ROUND_ORDER)}: "
        f"{', '.join(str(r['audio_s_per_s']) for r in rounds)} audio-s/s; varied / uniform {varied_vs_uniform:.3f}")
    rows = []
    result = {
        "benchmark": "workload",
        "model": {"family": speech.checkpoint.family.name, "path": str(speech.checkpoint.path)},
        "codec_frame_rate": rate,
        # (left, right) frames: a streamed request's first audio waits for `right` frames past it
        "codec_decode_context": list(speech.codec.decode_context),
        "codec_decode_graphs": speech.codec.decode_graphs,  # None: it decodes eagerly (codecs/base.py)
        "codec_compiled": speech.codec.compiled,  # None: transformers' eager modules (codecs/base.py)
        "requests_per_rate": requests,
        "max_chunks": max_chunks,  # the streamed requests' largest chunks (the saturated rounds: the first)
        "mix": {"streamed": 0.5, "cfg": 0.25 if cfg else 0.0, "words": [3, 60], "frames_per_word": FRAMES_PER_WORD,
                "top_k": [1, 500], "top_p": [0.9, 0.95, 1.0], "temperature": [0.5, 1.2]},
        "saturation": saturated,
        "uniform_saturation": same,  # the same jobs, one sampling and CFG scale for all
        # the four saturated rounds in order: each one's rate, steps and step time, and its
        # prefill wait (submission to first output, p50)
        "saturation_rounds": [{"settings": settings, **{key: r[key] for key in ROUND_KEYS},
                               "submit_to_first_output_p50_ms": r["ttfa_parts_ms"]["submit_to_first_output"]["p50"]}
                              for settings, r in zip(ROUND_ORDER, rounds)],
        "varied_vs_uniform": round(varied_vs_uniform, 3),  # both varied rounds' rates over both uniform ones'
        "varied_vs_uniform_first_pair": round(saturated["audio_s_per_s"] / same["audio_s_per_s"], 3),
        "environment": environment(),
        "memory_gib": memory,
        "results": rows,
    }

    def counted() -> None:  # the timed runs' captures and compiles so far; the result so far written
        result["graph_captures_timed"] = speech.engine.stats()["graph_captures"] - captures
        result["compiled_frames_timed"] = _compiles() - compiles
        since = _triton_compiled_since(kernels)
        result["triton_kernels_compiled_timed"] = since["triton_kernels_compiled"]
        result["triton_kernels_compiled_timed_names"] = since["triton_kernels_compiled_names"]
        # the codec's decode graphs recorded mid-run: on its worker thread, not in the step loop,
        # but each one a slower decode that the audio behind it waits for (the eager rounds at
        # the end record none)
        if speech.codec.decode_graphs is not None or "codec_graphs_recorded_timed" not in result:
            result["codec_graphs_recorded_timed"] = speech.codec.decode_graphs_recorded - codec_graphs
        if partial is not None:
            partial(result)

    counted()

    def at_load(fraction: float, first_lookahead: int | None = None, max_chunk: int = max_chunks[0]) -> dict:
        offered = fraction * saturated_rate
        arrivals = list(np.cumsum(np.random.default_rng(seed + 7).exponential(1 / offered, len(jobs))))
        driven = drive(speech, jobs, arrivals, first_lookahead=first_lookahead, max_chunk=max_chunk)
        # the host's speed right after the round: it has moved between processes on one machine
        # (58 and 87 ns a loop, fiftieth session), and a load round's steps are host-bound
        return {"load": fraction, "max_chunk": max_chunk, "offered_requests_per_s": round(offered, 3), **summarize(driven),
                "host_after": host_probe()}

    for fraction in rates:
        for max_chunk in max_chunks:
            rows.append(at_load(fraction, max_chunk=max_chunk))
            chunked = f", largest chunk {max_chunk}" if len(max_chunks) > 1 else ""
            log(f"load {fraction:.2f}{chunked}: {described(rows[-1])}")
            counted()
    if lookahead_rates:
        result["first_lookahead"] = {"frames": early.first_right, "exact_frames": early.right, "results": []}
        for fraction in lookahead_rates:
            result["first_lookahead"]["results"].append(at_load(fraction, first_lookahead))
            log(f"load {fraction:.2f}, first chunk {early.first_right} frames of lookahead (of {early.right}): "
                f"{described(result['first_lookahead']['results'][-1])}")
            counted()
    if eager_codec_rates and speech.codec.decode_graphs is not None:
        speech.codec.decode_eagerly()
        result["eager_codec"] = []
        for fraction in eager_codec_rates:
            result["eager_codec"].append(at_load(fraction))
            log(f"load {fraction:.2f}, the codec eager: {described(result['eager_codec'][-1])}")
            counted()
    return result


def plot_workload(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    load = [r["load"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(load, [r["audio_s_per_s"] for r in rows], "o-")
    left.axhline(result["saturation"]["audio_s_per_s"], ls=":", c="k", label="saturated")
    left.set(xlabel="offered load (fraction of saturation)", ylabel="sustained audio-s / s")
    left.legend()
    for key, style, label in (("ttfa_p50_ms", "o-", "TTFA p50"), ("ttfa_p95_ms", "s-", "TTFA p95"),
                              ("streamed_ttfa_p50_ms", "o:", "streamed TTFA p50"), ("streamed_ttfa_p95_ms", "s:", "streamed TTFA p95"),
                              ("e2e_p50_ms", "o--", "end-to-end p50"), ("e2e_p95_ms", "s--", "end-to-end p95")):
        if all(r.get(key) is not None for r in rows):  # results from before the streamed split lack it
            right.plot(load, [r[key] for r in rows], style, label=label)
    early = (result.get("first_lookahead") or {}).get("results") or []
    if early:
        right.plot([r["load"] for r in early], [r["streamed_ttfa_p95_ms"] for r in early], "d-.",
                   label=f"streamed TTFA p95, first lookahead {result['first_lookahead']['frames']}")
    eager = result.get("eager_codec") or []
    if eager:
        right.plot([r["load"] for r in eager], [r["streamed_ttfa_p95_ms"] for r in eager], "x-.", label="streamed TTFA p95, codec eager")
    right.axhline(250, ls=":", c="r", label="goal: streamed TTFA p95 250 ms at 0.7")
    right.set(xlabel="offered load (fraction of saturation)", ylabel="ms", yscale="log")
    right.legend()
    env = result["environment"]
    fig.suptitle(f"{result['model']['family']} — {env.get('device', '')}, vLLM {env.get('vllm', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
