"""How Whisper decodes one input: OpenAI's ``transcribe()`` / ``DecodingOptions`` settings, with
their defaults (faster-whisper shares them, except that its ``length_penalty`` means another
formula and defaults to 1).

* **Search.** At temperature 0: beam search of ``beam_size`` beams (1 = greedy) that stops once
  ``round(beam_size * patience)`` beams have ended; at a temperature above 0: ``best_of``
  independent samples. Either way the candidate with the highest ``sum_logprob / penalty`` wins,
  ``penalty`` = the number of tokens (``length_penalty`` None) or ``((5 + n) / 6) ** alpha``
  (Google NMT's, ``length_penalty`` = alpha in [0, 1]).
* **Fallback.** A window whose text compresses more than ``compression_ratio_threshold`` (gzip,
  a sign of loops) or whose average log-probability is below ``logprob_threshold`` is decoded
  again at the next of ``temperatures``, unless it looks like silence (below).
* **No speech.** A window whose ``<|nospeech|>`` probability exceeds ``no_speech_threshold``
  while its average log-probability is below ``logprob_threshold`` is dropped.
* **Context.** With ``condition_on_previous_text`` a window is prompted with the text of the
  windows before it (reset after a window decoded at a temperature above 0.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TASKS = ("transcribe", "translate")


@dataclass(frozen=True)
class WhisperOptions:
    task: str = "transcribe"
    language: str | None = None  # None: detected per input on its first window (multilingual)
    beam_size: int = 5  # at temperature 0; 1 = greedy
    best_of: int = 5  # samples at a temperature above 0
    patience: float = 1.0
    length_penalty: float | None = None
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    timestamps: bool = True  # Whisper's timestamp tokens (segments); False: <|notimestamps|>
    word_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    suppress_blank: bool = True
    top_k: int = 0  # sampling only (not in OpenAI's decoder): 0 = off
    top_p: float = 1.0

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, not {self.task!r}")
        if not isinstance(self.beam_size, int) or self.beam_size < 1:
            raise ValueError(f"beam size must be a positive integer, not {self.beam_size!r}")
        if not isinstance(self.best_of, int) or self.best_of < 1:
            raise ValueError(f"best-of must be a positive integer, not {self.best_of!r}")
        if not (self.patience > 0) or round(self.beam_size * self.patience) < 1:
            raise ValueError(f"patience must be positive (and beam size x patience at least 1), not {self.patience!r}")
        if self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise ValueError(f"length penalty must be between 0 and 1 (or None), not {self.length_penalty!r}")
        temperatures = tuple(float(t) for t in self.temperatures)
        if not temperatures or any(not math.isfinite(t) or t < 0 for t in temperatures):
            raise ValueError(f"temperatures must be finite and >= 0, not {self.temperatures!r}")
        object.__setattr__(self, "temperatures", temperatures)
        if self.max_initial_timestamp is not None and self.max_initial_timestamp < 0:
            raise ValueError("max initial timestamp must be >= 0")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError("top-k must be >= 0 and top-p in (0, 1]")

    @property
    def max_candidates(self) -> int:
        return round(self.beam_size * self.patience)

    def lanes(self, temperature: float) -> int:
        """Sequences decoded together for one window at ``temperature``."""
        return self.beam_size if temperature == 0 else self.best_of

    def with_(self, **changes) -> WhisperOptions:
        return replace(self, **changes)


def temperature_schedule(start: float, increment: float | None) -> tuple[float, ...]:
    """OpenAI's CLI: ``start, start + increment, ...`` up to 1.0 (just ``start`` without an
    increment)."""
    if not increment:
        return (float(start),)
    steps = int(math.floor((1.0 + 1e-6 - start) / increment)) + 1
    return tuple(round(start + i * increment, 6) for i in range(max(steps, 1)))


def resolve_options(job, default: WhisperOptions | None = None) -> WhisperOptions:
    """The job's Whisper options: ``job.whisper`` if set, else ``default`` (OpenAI's defaults if
    None); an AsrJob sampling at a temperature (``text_sampling``) without Whisper options samples
    at that temperature alone, as before beam search existed."""
    options = getattr(job, "whisper", None)
    if options is not None:
        if not isinstance(options, WhisperOptions):
            raise ValueError(f"AsrJob.whisper must be a WhisperOptions, not {type(options).__name__}")
        return options
    base = default or WhisperOptions()
    sampling = job.text_sampling
    if sampling.temperature > 0:
        return base.with_(temperatures=(sampling.temperature,), top_k=max(0, sampling.top_k), top_p=sampling.top_p)
    return base


# Decoding as transformers' plain ``generate()`` runs it: one window's tokens at temperature 0 and
# nothing else (no timestamp tokens, no previous-text prompt, no fallback, no window dropped as
# silence). What the parity tests and the speed benches compare against transformers with;
# ``.with_(beam_size=N)`` for its beam search.
PLAIN_GREEDY = WhisperOptions(beam_size=1, temperatures=(0.0,), timestamps=False, condition_on_previous_text=False,
                              no_speech_threshold=None)
