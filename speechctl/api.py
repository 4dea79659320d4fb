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
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speechctl.accelerator import has_cuda
from speechctl.engine.params import (
    DEFAULT_AUDIO,
    DEFAULT_TEXT,
    GREEDY,
    NO_GUIDANCE,
    Guidance,
    Sampling,
)
from speechctl.errors import EngineError, InputError, SpeechctlError

ENCODE_CHUNK = 16  # audio inputs encoded per codec call


@dataclass
class TtsJob:
    id: str
    text: str
    voice: np.ndarray | None = None  # reference waveform at the codec's sample rate
    voice_text: str | None = None  # its transcript (Higgs Audio v2 prompts use it)
    text_sampling: Sampling = DEFAULT_TEXT
    audio_sampling: Sampling = DEFAULT_AUDIO
    seed: int | None = None
    max_seconds: float = 20.0
    guidance: Guidance = NO_GUIDANCE  # classifier-free guidance (scale 1.0 = off)
    task = "tts"


@dataclass
class AsrJob:
    id: str
    audio: np.ndarray  # waveform at the engine's sample_rate (the codec's; Whisper: 16 kHz)
    text_sampling: Sampling = GREEDY
    seed: int | None = None
    max_tokens: int = 256
    whisper: object | None = None  # speechctl.asr.WhisperOptions (Whisper: beam search, fallback, ...)
    task = "asr"


@dataclass
class FailedJob:
    """A job that could not be built (say, an unreadable input file); ``run`` reports it."""

    id: str
    task: str
    error: str


@dataclass
class TtsResult:
    id: str
    audio: np.ndarray | None
    sample_rate: int
    codes: np.ndarray | None = None  # [K, T]
    error: str | None = None
    task = "tts"

    @property
    def duration(self) -> float:
        return 0.0 if self.audio is None else len(self.audio) / self.sample_rate


@dataclass
class TtsChunk:
    """A piece of a streamed TTS result (``Speech.stream_tts``): samples ``start`` ..
    ``start + len(audio)`` of the job's waveform. The job's last chunk has ``last`` set (its audio
    may be empty); a failed job's last chunk carries ``error``."""

    id: str
    audio: np.ndarray  # float32
    sample_rate: int
    start: int = 0
    last: bool = False
    error: str | None = None


@dataclass
class AsrResult:
    id: str
    text: str | None
    error: str | None = None
    segments: list | None = None  # Whisper: [speechctl.asr.segments.Segment] with start/end seconds
    tokens: list | None = None  # Whisper: generated token ids of each window
    language: str | None = None  # Whisper: the language code (given or detected)
    task = "asr"


Job = TtsJob | AsrJob | FailedJob
Result = TtsResult | AsrResult


@dataclass
class _Pending:
    job: Job
    errors: deque = field(default_factory=deque)


class Speech:
    """A model, its engine and its codec, ready to run TTS and ASR jobs.

    With ``engine_config.data_parallel_size`` N > 1 it holds N replicas instead (processes, each
    a ``Speech`` on its own GPUs; ``speechctl.engine.data_parallel``): ``run``/``tts``/``asr``
    split whole jobs over them (job i on replica i % N, so a CFG pair stays on one) and return
    results in job order; streaming needs one engine."""

    def __init__(self, model: str | Path | None = None, *, engine_config=None, device: str | None = None):
        from speechctl.codecs import load_codec
        from speechctl.engine.engine import SpeechEngine
        from speechctl.models.catalog import codec_dir, resolve_model

        self.model_dir = resolve_model(str(model) if model is not None else None)
        self.replicas = None
        if engine_config is not None and engine_config.data_parallel_size > 1:
            self._start_replicas(engine_config)
            return
        self.engine = SpeechEngine(self.model_dir, engine_config)
        self.prompts = self.engine.prompt_builder()
        device = device or ("cuda" if has_cuda() else "cpu")
        self.codec = load_codec(codec_dir(self.model_dir), device=device)

    def _start_replicas(self, config) -> None:
        import functools
        from dataclasses import replace

        from speechctl.engine.data_parallel import ReplicaPool
        from speechctl.models.catalog import codec_sample_rate

        self.engine = self.prompts = self.codec = None  # they live in the replicas
        self._sample_rate = codec_sample_rate(self.model_dir)
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
        requests = self._requests(iter(jobs), failed)
        for outputs in self.engine.generate_steps(requests):
            while failed:
                yield failed.popleft()
            yield from self._finish(outputs)
        while failed:
            yield failed.popleft()

    def stream_tts(self, jobs: Iterable[TtsJob] | str, *, first_chunk: int = 2, growth: float = 2.0, max_chunk: int = 32, **options) -> Iterator[TtsChunk]:
        """Stream TTS: yield ``TtsChunk``s as the codec decodes them, while the audio is still
        being generated (jobs batched together; a string is one job with ``options``). A job's
        chunks concatenate to its ``run`` result (same codes; samples equal up to float rounding).
        Chunks are ``first_chunk`` frames, then ``growth`` times larger up to ``max_chunk``; see
        ``speechctl.codecs.streaming``."""
        from speechctl.pipeline.streamer import SpeechStreamer

        if self.replicas:
            raise EngineError("streaming runs on one engine: use data_parallel_size 1")
        if isinstance(jobs, str):
            jobs = [TtsJob(id="text", text=jobs, **options)]
        streamer = SpeechStreamer(self, first_chunk=first_chunk, growth=growth, max_chunk=max_chunk)
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
                error = job.error if isinstance(job, FailedJob) else _validate(job)
                if error:
                    failed.append(_failure(job, error, self.sample_rate))
                else:
                    ready.append(job)
            waves = [j.voice if isinstance(j, TtsJob) else j.audio for j in ready]
            with_audio = [i for i, w in enumerate(waves) if w is not None]
            codes = dict(zip(with_audio, self.codec.encode([waves[i] for i in with_audio])))
            for i, job in enumerate(ready):
                yield self._request(job, codes.get(i))

    def _request(self, job: Job, codes: np.ndarray | None):
        if isinstance(job, TtsJob):
            return self.prompts.tts(
                job.text,
                voice_codes=codes,
                text_sampling=job.text_sampling,
                audio_sampling=job.audio_sampling,
                seed=job.seed,
                max_frames=max(1, math.ceil(job.max_seconds * self.codec.frame_rate)),
                guidance=job.guidance,
                tag=job,
                **({"voice_text": job.voice_text} if job.voice_text is not None else {}),
            )
        return self.prompts.asr(
            codes, text_sampling=job.text_sampling, seed=job.seed, max_tokens=job.max_tokens, tag=job
        )

    def _finish(self, outputs) -> Iterator[Result]:
        speech_out, codes = [], []
        for out in outputs:
            job = out.tag
            if out.error:
                yield _failure(job, f"{job.id}: {out.error}", self.sample_rate)
            elif isinstance(job, TtsJob):
                try:
                    (segment,) = self.prompts.audio_segments(out, starts_in_audio=True)
                except (SpeechctlError, ValueError) as e:
                    yield _failure(job, f"{job.id}: {e}", self.sample_rate)
                    continue
                speech_out.append(job)
                codes.append(segment)
            else:
                yield AsrResult(job.id, self.prompts.text(out))
        if speech_out:
            for job, segment, wave in zip(speech_out, codes, self.codec.decode(codes)):
                yield TtsResult(job.id, wave, self.sample_rate, codes=segment)

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


def load_asr(model: str | Path | None = None, *, engine_config=None, whisper_config=None):
    """The engine for ASR jobs: Whisper (``speechctl.asr.WhisperAsr``) when ``model`` is a
    Whisper model or None (the default, whisper-tiny.en), else a multi-stream :class:`Speech`.
    Both take ``run(jobs)`` with AsrJobs at their ``sample_rate``."""
    from speechctl.asr import WhisperAsr, is_whisper

    if is_whisper(model):
        return WhisperAsr(model, whisper_config)
    return Speech(model, engine_config=engine_config)


def _validate(job: Job) -> str | None:
    if isinstance(job, TtsJob):
        if not job.text or not job.text.strip():
            return f"{job.id}: empty text"
        if job.max_seconds <= 0:
            return f"{job.id}: max_seconds must be positive"
        if job.voice is not None and len(job.voice) == 0:
            return f"{job.id}: empty voice prompt"
    elif isinstance(job, AsrJob):
        if job.audio is None or len(job.audio) == 0:
            return f"{job.id}: empty audio"
    return None


def _failure(job: Job, error: str, sample_rate: int) -> Result:
    if getattr(job, "task", None) == "tts":
        return TtsResult(job.id, None, sample_rate, error=error)
    return AsrResult(job.id, None, error=error)


__all__ = ["Speech", "load_asr", "TtsJob", "AsrJob", "FailedJob", "TtsResult", "TtsChunk", "AsrResult", "InputError"]
