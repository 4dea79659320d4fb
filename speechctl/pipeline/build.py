"""Build the chat pipeline from model names, sharing loaded engines within a process.

* staged (default): ``AsrStage`` (Whisper, ``speechctl.api.load_asr``) -> ``LmStage`` (a vLLM text
  model, default ``tiny-lm``) -> ``TtsStage`` (the multi-stream speech model, default ``tiny``);
* unified: one ``UnifiedStage`` on the multi-stream speech model (audio in, text and audio out).

Each engine has its own bounded KV cache in this process: on CPU a byte budget, on a GPU a
memory fraction (``gpu_fractions``: the three fractions must leave room for each other; vLLM
checks free memory when an engine starts). Loaded engines are kept per (kind, model, settings),
so several chats, scripts and tests in one process load each model once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speechctl.accelerator import has_cuda
from speechctl.api import shared
from speechctl.pipeline.lm import LmConfig, LmStage, TextLm
from speechctl.pipeline.stage import Pipeline


@dataclass
class ChatConfig:
    mode: str = "staged"  # staged | unified
    asr_model: str | None = None  # default whisper-tiny.en
    lm_model: str | None = None  # default tiny-lm
    lm: LmConfig = field(default_factory=LmConfig)
    tts_options: dict = field(default_factory=dict)  # TtsJob fields (sampling, seed, voice, max_seconds)
    reply_in_audio: bool = True  # unified: the reply opens with speech
    first_chunk: int = 2
    growth: float = 2.0
    max_chunk: int | None = None  # None: speechctl.codecs.streaming.default_max_chunk (by device)
    first_lookahead: int | None = None  # None: every sample final (speechctl.codecs.streaming)
    asr_gpu_fraction: float = 0.1

    @property
    def chunking(self) -> dict:
        return dict(first_chunk=self.first_chunk, growth=self.growth, max_chunk=self.max_chunk,
                    first_lookahead=self.first_lookahead)


def load_asr_engine(model: str | None = None, gpu_fraction: float = 0.1):
    """Whisper (or a speech LM for ``--asr-model tiny``) with a small batch: a chat transcribes
    one utterance at a time."""
    from speechctl.api import load_asr
    from speechctl.asr import WhisperConfig, WhisperOptions

    def make():
        # A chat wants its turn's text fast: greedy, without timestamps; fallback and no-speech
        # stay, a fallback sampling once (best-of 5 would be more lanes than its 4 sequences).
        config = WhisperConfig(max_num_seqs=4, gpu_memory_utilization=gpu_fraction if has_cuda() else None,
                               default_options=WhisperOptions(beam_size=1, best_of=1, timestamps=False))
        return load_asr(model, whisper_config=config)

    return shared(("asr", model, gpu_fraction), make)


def load_text_lm(model: str | None, config: LmConfig) -> TextLm:
    """The text LM engine for ``model``; engines with the same engine settings are shared (each
    ``LmStage`` brings its own sampling settings)."""
    engine_key = tuple(config.engine_args(str(model), False).items())
    return shared(("lm", model, engine_key), lambda: TextLm(model, config))


def build_pipeline(speech, config: ChatConfig | None = None) -> Pipeline:
    """The chat pipeline around ``speech`` (a loaded :class:`speechctl.api.Speech`: the TTS
    model, or the unified model)."""
    from speechctl.pipeline.asr import AsrStage
    from speechctl.pipeline.tts import TtsStage
    from speechctl.pipeline.unified import UnifiedStage

    config = config or ChatConfig()
    if config.mode == "unified":
        options = config.tts_options
        stage = UnifiedStage(
            speech,
            reply_in_audio=config.reply_in_audio,
            text_sampling=options.get("text_sampling"),
            audio_sampling=options.get("audio_sampling"),
            seed=options.get("seed"),
            max_seconds=options.get("max_seconds", 10.0),
            **config.chunking,
        )
        return Pipeline([stage])
    if config.mode != "staged":
        raise ValueError(f"unknown chat mode {config.mode!r} (staged or unified)")
    asr = load_asr_engine(config.asr_model, config.asr_gpu_fraction)
    lm = load_text_lm(config.lm_model, config.lm)
    tts = TtsStage(speech, job_options=config.tts_options, **config.chunking)
    return Pipeline([AsrStage(asr), LmStage(lm, config.lm), tts])

