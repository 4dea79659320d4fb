"""Jobs and results: what callers hand the API, the pipelines and ASR, and what comes back.

Plain data with its validation, below ``api.py``, ``asr/`` and ``pipeline/``; imports neither
torch nor vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from speechctl.engine.params import GREEDY, Guidance, Sampling


@dataclass
class TtsJob:
    id: str
    text: str
    voice: np.ndarray | None = None  # reference waveform at the codec's sample rate
    voice_text: str | None = None  # its transcript (Higgs Audio v2 prompts use it)
    # None: the checkpoint's generation defaults (its generation_config.json, else speechctl's)
    text_sampling: Sampling | None = None
    audio_sampling: Sampling | None = None
    depth_sampling: Sampling | None = None  # a depth decoder's codebooks (CSM); None: its default
    seed: int | None = None
    max_seconds: float | None = None  # None: the checkpoint's default length, else 20 s
    guidance: Guidance | None = None  # classifier-free guidance, in the family's convention (1.0 = off); None: the checkpoint's
    # repetition-aware sampling (window, max_repeat); None: the checkpoint's; (0, 0): off
    repetition: tuple[int, int] | None = None
    codes_out: str | None = None  # where the batch runner writes the generated codes [K, T] (.npy)
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
    warnings: list[str] = field(default_factory=list)  # e.g. a piece that reached its length cap
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
    duration: float | None = None  # seconds of the input audio
    task = "asr"


Job = TtsJob | AsrJob | FailedJob
Result = TtsResult | AsrResult


def validate(job: Job) -> str | None:
    if isinstance(job, TtsJob):
        if not job.text or not job.text.strip():
            return f"{job.id}: empty text"
        if job.max_seconds is not None and job.max_seconds <= 0:
            return f"{job.id}: max_seconds must be positive"
        if job.voice is not None and len(job.voice) == 0:
            return f"{job.id}: empty voice prompt"
    elif isinstance(job, AsrJob):
        if job.audio is None or len(job.audio) == 0:
            return f"{job.id}: empty audio"
    return None


def failure(job: Job, error: str, sample_rate: int) -> Result:
    if getattr(job, "task", None) == "tts":
        return TtsResult(job.id, None, sample_rate, error=error)
    audio = getattr(job, "audio", None)  # a failed ASR job still reports how long its input was
    duration = None if audio is None or len(audio) == 0 else len(audio) / sample_rate
    return AsrResult(job.id, None, error=error, duration=duration)
