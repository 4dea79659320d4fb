"""The Python API: what the CLI does, as functions and one object.

    from speechctl.api import Speech, TtsJob
    speech = Speech()                      # the embedded "tiny" model; Speech("path/to/ckpt")
    result = speech.tts("Hello world")     # TtsResult: .audio (float32), .sample_rate, .codes
    for r in speech.run(jobs): ...         # many TTS/ASR jobs through one continuously batched engine
    Speech(engine_config=EngineConfig(data_parallel_size=2)).run(jobs)  # replicas, job order
    for c in speech.stream_tts("Hi"): ...  # TtsChunk: audio pieces as they are generated
    asr = load_asr()                       # ASR with real weights: Whisper tiny.en (speechctl.asr)
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from speechctl.accelerator import has_cuda
from speechctl.engine.params import DEFAULT_AUDIO, DEFAULT_TEXT, GREEDY, NO_GUIDANCE, Guidance, Sampling  # noqa: F401 (API)
from speechctl.errors import EngineError, InputError, SpeechctlError
from speechctl.jobs import AsrJob, AsrResult, FailedJob, Job, Result, TtsChunk, TtsJob, TtsResult, failure, validate
from speechctl.models.family import DEFAULT_MAX_SECONDS
from speechctl.models.prompting import VoicePrompt
from speechctl.pieces import PartOf, Whole, cap_warning
from speechctl.text import MAX_PIECE_CHARS, split_for_speech

ENCODE_CHUNK = 16  # audio inputs encoded per codec call


class Speech:
    """A model, its engine and its codec, ready to run TTS and ASR jobs.

    With ``engine_config.data_parallel_size`` N > 1 it holds N replicas instead (processes, each
    a ``Speech`` on its own GPUs; ``speechctl.engine.data_parallel``): ``run``/``tts``/``asr``
    split whole jobs over them (job i on replica i % N, so a CFG pair stays on one) and return
    results in job order; streaming needs one engine."""

    def __init__(self, model: str | Path | None = None, *, engine_config=None, device: str | None = None):
        from speechctl.codecs import load_codec
        from speechctl.models.catalog import resolve_checkpoint

        self.checkpoint = resolve_checkpoint(str(model) if model is not None else None)
        self.model_dir = self.checkpoint.path
        self.replicas = None
        if engine_config is not None and engine_config.data_parallel_size > 1:
            self._start_replicas(engine_config)
            return
        # the family's engine: one vLLM engine (SpeechEngine), or its stages around one (AR+NAR)
        self.engine = self.checkpoint.family.engine(self.checkpoint, engine_config)
        self.prompts = self.engine.prompt_builder()
        device = device or ("cuda" if has_cuda() else "cpu")
        # (the codec leaves the room the engine's steps may still need: its activations come and go)
        self.codec = load_codec(self.checkpoint.codec_dir, device=device, leave_free_bytes=self.engine.step_room_bytes)

    def _start_replicas(self, config) -> None:
        import functools
        from dataclasses import replace

        from speechctl.engine.data_parallel import ReplicaPool
        from speechctl.models.catalog import codec_sample_rate

        self.engine = self.prompts = self.codec = None  # they live in the replicas
        self._sample_rate = codec_sample_rate(self.checkpoint)
        one = functools.partial(Speech, self.model_dir, engine_config=replace(config, data_parallel_size=1))
        self.replicas = ReplicaPool(one, config.data_parallel_size, tensor_parallel_size=config.tensor_parallel_size)

    @property
    def sample_rate(self) -> int:
        return self._sample_rate if self.replicas else self.codec.sample_rate

    # -- one-shot helpers ----------------------------------------------------------------------

    def tts(self, text: str, **options) -> TtsResult:
        (result,) = self.run([TtsJob(id="text", text=text, **options)])
        if result.error:
            raise SpeechctlError(result.error)
        return result

    def asr(self, audio: np.ndarray, **options) -> AsrResult:
        (result,) = self.run([AsrJob(id="audio", audio=audio, **options)])
        if result.error:
            raise SpeechctlError(result.error)
        return result

    # -- many jobs ------------------------------------------------------------------------------

    def run(self, jobs: Iterable[Job]) -> Iterator[Result]:
        """Run jobs through the engine together (continuous batching); yield results as they
        finish (in job order with data parallelism). Inputs are encoded and outputs decoded by the
        codec in batches."""
        if self.replicas:
            yield from self.replicas.run(jobs)
            return
        failed: deque[Result] = deque()
        yield from self.run_requests(self._requests(iter(jobs), failed), failed)

    def run_requests(self, requests: Iterable, failed: deque | None = None, timings: dict | None = None) -> Iterator[Result]:
        """Prepared engine requests (``Speech.request``; benchmarks build fixed-length ones
        tagged with their ``TtsJob``) through the engine, their audio decoded off the step loop
        (``codecs/worker.py``); results as they land. ``failed``: results to hand out between
        steps (jobs refused before they reached the engine). ``timings`` (benchmarks): filled
        with the engine's steps, the ``perf_counter`` times its last step's outputs came back
        (``last_step_at``) and their audio went to the codec (``last_submitted_at``), the
        seconds the codec spent decoding (``codec_busy_s``) and each decode's (start, end)
        (``decode_spans``)."""
        from speechctl.codecs.worker import DecodeQueue

        failed = failed if failed is not None else deque()
        decodes = DecodeQueue(self.codec)
        if timings is not None:
            timings["steps"] = 0
        try:
            for outputs in self.engine.generate_steps(requests, every_step=True):
                if timings is not None:
                    timings["steps"] += 1
                    timings["last_step_at"] = time.perf_counter()
                while failed:
                    yield failed.popleft()
                yield from self._finish(outputs, decodes)
                if timings is not None:
                    timings["last_submitted_at"] = time.perf_counter()
                yield from self._decoded(decodes)
            yield from self._decoded(decodes, wait=True)
        finally:
            if timings is not None:
                timings["codec_busy_s"], timings["decode_spans"] = decodes.busy_s, list(decodes.spans)
            decodes.close()
        while failed:
            yield failed.popleft()

    def stream_tts(self, jobs: Iterable[TtsJob] | str, *, first_chunk: int = 2, growth: float = 2.0, max_chunk: int | None = None,
                   first_lookahead: int | None = None, **options) -> Iterator[TtsChunk]:
        """Stream TTS: yield ``TtsChunk``s as the codec decodes them, while the audio is still
        being generated (jobs batched together; a string is one job with ``options``). A job's
        chunks concatenate to its ``run`` result (same codes; samples equal up to float rounding).
        Chunks are ``first_chunk`` frames, then ``growth`` times larger up to ``max_chunk`` (None:
        ``speechctl.codecs.streaming.default_max_chunk``: 128 frames on CUDA, 32 on the CPU);
        ``first_lookahead`` frames past the first chunk let it go early and inexact (None: exact);
        see ``speechctl.codecs.streaming``."""
        from speechctl.pipeline.streamer import SpeechStreamer

        if self.replicas:
            raise EngineError("streaming runs on one engine: use data_parallel_size 1")
        if isinstance(jobs, str):
            jobs = [TtsJob(id="text", text=jobs, **options)]
        streamer = SpeechStreamer(self, first_chunk=first_chunk, growth=growth, max_chunk=max_chunk,
                                  first_lookahead=first_lookahead)
        for job in jobs:
            streamer.submit(job)
        try:
            while streamer.busy():
                yield from (e for e in streamer.step() if isinstance(e, TtsChunk))
        finally:  # the caller stopped early: leave nothing running in the engine
            streamer.cancel()

    def _requests(self, jobs: Iterator[Job], failed: deque) -> Iterator:
        while True:
            chunk = [job for _, job in zip(range(ENCODE_CHUNK), jobs)]
            if not chunk:
                return
            ready = []
            for job in chunk:
                error = job.error if isinstance(job, FailedJob) else validate(job)
                if error:
                    failed.append(failure(job, error, self.sample_rate))
                else:
                    ready.append(job)
            waves = [j.voice if isinstance(j, TtsJob) else j.audio for j in ready]
            with_audio = [i for i, w in enumerate(waves) if w is not None]
            codes = dict(zip(with_audio, self.codec.encode([waves[i] for i in with_audio])))
            for i, job in enumerate(ready):
                yield from self.requests_of(job, codes.get(i))

    def requests_of(self, job: Job, codes: np.ndarray | None) -> list:
        """The engine requests of a validated job: one, or one per piece of a long text (tagged
        ``pieces.PartOf``; ``speechctl.text`` cuts it)."""
        if not isinstance(job, TtsJob):
            return [self.request(job, codes)]
        pieces = split_for_speech(job.text, self.max_piece_chars) if self.prompts.cuts_text else [job.text]
        if len(pieces) == 1:
            return [self.request(job, codes)]
        whole = Whole(job, pieces)
        frames = self.max_frames(job.max_seconds)
        return [self.request(replace(job, text=p.text), codes, tag=PartOf(whole, i, frames)) for i, p in enumerate(pieces)]

    def request(self, job: Job, codes: np.ndarray | None, tag=None):
        """The engine request of a validated job (or of one piece of it: ``tag``), its input audio
        (voice prompt, audio to transcribe) already encoded to ``codes`` [K, T]."""
        tag = job if tag is None else tag
        if isinstance(job, TtsJob):
            defaults = self.checkpoint.defaults
            depth = job.depth_sampling or defaults.depth
            repetition = job.repetition if job.repetition is not None else defaults.repetition
            repetition = tuple(repetition) if repetition and repetition[0] > 0 else None
            return self.prompts.tts(
                job.text,
                voice_codes=codes,
                text_sampling=job.text_sampling or defaults.text,
                audio_sampling=job.audio_sampling or defaults.audio,
                seed=job.seed,
                max_frames=self.max_frames(job.max_seconds),
                guidance=self.checkpoint.guidance(job.guidance, job.audio_sampling),
                continues=self.continuation(job),
                tag=tag,
                **({"repetition": repetition} if repetition else {}),
                **({"voice_text": job.voice_text} if job.voice_text is not None else {}),
                **({"depth_sampling": depth} if depth is not None else {}),
            )
        return self.prompts.asr(
            codes, text_sampling=job.text_sampling, seed=job.seed, max_tokens=job.max_tokens, tag=tag
        )

    def continuation(self, job: Job) -> VoicePrompt | None:
        """The voice prompt a job's speech follows on from: the checkpoint's own
        (``speechctl.voice_prompt``: the default voice reads short texts far more surely so,
        docs/voice/lm-progress.md) for a TTS job with no voice of its own and no guidance (its
        unconditional partner would need the prompt's audio too); else None."""
        prompt = self.prompts.voice_prompt
        if prompt is None or not isinstance(job, TtsJob) or job.voice is not None or job.voice_text is not None:
            return None
        return None if self.checkpoint.guidance(job.guidance, job.audio_sampling).enabled else prompt

    def max_frames(self, seconds: float | None) -> int:
        """Frames of audio for ``seconds`` (None: the checkpoint's default length)."""
        if seconds is None:
            if self.checkpoint.defaults.max_frames is not None:
                return self.checkpoint.defaults.max_frames
            seconds = DEFAULT_MAX_SECONDS
        return max(1, math.ceil(seconds * self.codec.frame_rate))

    @property
    def max_piece_chars(self) -> int:
        """The longest piece of text one request speaks (longer texts are cut: speechctl.text):
        the checkpoint's own where it sets one."""
        return self.checkpoint.defaults.max_piece_chars or MAX_PIECE_CHARS

    def _finish(self, outputs, decodes) -> Iterator[Result]:
        """Results that need no codec (ASR, failures); the step's finished TTS audio goes to
        ``decodes`` as one batch."""
        speech_out, codes = [], []
        for out in outputs:
            tag, job = out.tag, getattr(out.tag, "job", out.tag)
            if isinstance(tag, PartOf) and tag.whole.failed:
                continue
            error = out.error
            if error is None and isinstance(job, TtsJob):
                try:
                    (segment,) = self.prompts.audio_segments(out, starts_in_audio=True)
                except (SpeechctlError, ValueError) as e:
                    error = str(e)
            if error is not None:
                if isinstance(tag, PartOf):  # the job fails as a whole: stop its other pieces
                    tag.whole.failed = True
                    self.engine.abort([t for t in self.engine.tags() if isinstance(t, PartOf) and t.whole is tag.whole])
                    error = f"piece {tag.index + 1} of {len(tag.whole.pieces)}: {error}"
                yield failure(job, f"{job.id}: {error}", self.sample_rate)
            elif isinstance(job, TtsJob):
                prompt = self.continuation(job)
                decodable, cut = prompt.decodable(segment, self.codec.hop_length) if prompt else (segment, 0)
                speech_out.append((tag, segment, cut))
                codes.append(decodable)
            else:
                yield AsrResult(job.id, self.prompts.text(out), duration=len(job.audio) / self.sample_rate)
        decodes.submit(speech_out, codes)

    def _decoded(self, decodes, wait: bool = False) -> Iterator[Result]:
        for (tag, segment, cut), wave in decodes.ready(wait):
            yield from self._tts_result(tag, segment, wave[cut:])

    def _tts_result(self, tag, segment: np.ndarray, wave: np.ndarray) -> Iterator[TtsResult]:
        if not isinstance(tag, PartOf):
            frames = self.max_frames(tag.max_seconds)
            capped = [cap_warning(tag.id, frames / self.codec.frame_rate)] if segment.shape[1] >= frames else []
            yield TtsResult(tag.id, wave, self.sample_rate, codes=segment, warnings=capped)
            return
        whole = tag.whole
        if segment.shape[1] >= tag.max_frames:
            whole.warnings.append(cap_warning(whole.job.id, tag.max_frames / self.codec.frame_rate, tag.index, len(whole.pieces)))
        whole.add(tag.index, segment, wave)
        if whole.done:
            yield whole.result(self.sample_rate)

    def close(self) -> None:
        if self.replicas:
            self.replicas.close()
        else:
            self.engine.shutdown()


_LOADED: dict = {}  # engines loaded in this process, by what they were loaded with


def shared(key: tuple, make):
    """The engine loaded under ``key`` in this process, made by ``make()`` on first use: commands,
    pipelines and tests that run in one process share loaded models."""
    if key not in _LOADED:
        _LOADED[key] = make()
    return _LOADED[key]


def close_shared() -> None:
    """Close every engine loaded with ``shared`` in this process and give its memory back."""
    while _LOADED:
        _, engine = _LOADED.popitem()
        engine.close()


def load_asr(model: str | Path | None = None, *, engine_config=None, whisper_config=None):
    """The engine for ASR jobs: Whisper (``speechctl.asr.WhisperAsr``) when ``model`` is a
    Whisper model or None (the default, whisper-tiny.en), else a multi-stream :class:`Speech`.
    Both take ``run(jobs)`` with AsrJobs at their ``sample_rate``."""
    from speechctl.asr import WhisperAsr, is_whisper

    if is_whisper(model):
        return WhisperAsr(model, whisper_config)
    return Speech(model, engine_config=engine_config)


__all__ = ["Speech", "load_asr", "TtsJob", "AsrJob", "FailedJob", "TtsResult", "TtsChunk", "AsrResult", "InputError"]
