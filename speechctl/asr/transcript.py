"""One input's way through Whisper, window by window (OpenAI's ``transcribe()`` loop, minus the
seeking: speechctl's windows are cut at pauses beforehand, :func:`segments.plan_windows`).

A window is *ready* when nothing it depends on is missing: with ``condition_on_previous_text``
the text of the windows before it (its prompt), and for a multilingual model without
``language`` the language, detected on the input's first window. Every ready window of every
input goes to the engine at once; a window is decoded at ``temperatures[0]`` and again at the
next temperature while the result looks wrong (:func:`needs_fallback`), each attempt a new
request group in the same continuous batch. A final result is dropped as silence
(:func:`is_silence`) or cut into segments at its timestamp tokens (:func:`token_segments`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from speechctl.asr.options import WhisperOptions
from speechctl.asr.segments import RATE, Segment, Window, segment as window_segment
from speechctl.asr.vocab import TIME_PRECISION, WhisperVocab

PROMPT_TOKENS = 223  # OpenAI: n_text_ctx // 2 - 1 tokens of previous text at most


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass
class DecodeResult:
    """A window's decoding at one temperature (OpenAI's ``DecodingResult``)."""

    tokens: list[int]  # free tokens, timestamps included, <|endoftext|> excluded
    sum_logprob: float
    temperature: float
    no_speech_prob: float
    text: str
    language: int | None = None  # the language token used (detected or given)

    @property
    def avg_logprob(self) -> float:
        return self.sum_logprob / (len(self.tokens) + 1)

    @cached_property  # gzip of the text: asked for by the fallback test and by every segment
    def compression_ratio(self) -> float:
        return compression_ratio(self.text)


def needs_fallback(result: DecodeResult, options: WhisperOptions) -> bool:
    """OpenAI's ``decode_with_fallback`` test."""
    fallback = False
    if options.compression_ratio_threshold is not None and result.compression_ratio > options.compression_ratio_threshold:
        fallback = True  # too repetitive
    if options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
        fallback = True  # not confident
    if is_quiet(result, options) and options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
        fallback = False  # silence: no point trying harder
    return fallback


def is_quiet(result: DecodeResult, options: WhisperOptions) -> bool:
    ns = result.no_speech_prob
    return options.no_speech_threshold is not None and ns == ns and ns > options.no_speech_threshold


def is_silence(result: DecodeResult, options: WhisperOptions) -> bool:
    """OpenAI's no-speech skip: a likely "no speech" unless the text is confident."""
    if not is_quiet(result, options):
        return False
    return not (options.logprob_threshold is not None and result.avg_logprob > options.logprob_threshold)


def token_segments(tokens: list[int], vocab: WhisperVocab, window: Window, decode, rate: int = RATE) -> list[Segment]:
    """Segments of a window's tokens at Whisper's timestamp tokens (OpenAI's ``transcribe``):
    each pair of consecutive timestamps closes one segment and opens the next. Text after the
    last closed segment (OpenAI would re-decode from there) becomes a segment that ends where
    the window's speech ends; tokens without any timestamp become one segment over the window's
    speech."""
    tsb = vocab.timestamp_begin
    offset = window.speech_start / rate  # the model hears the window's audible part
    speech_end = window.speech_end / rate
    is_ts = [t >= tsb for t in tokens]
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    single_ending = is_ts[-2:] == [False, True]
    out: list[tuple[float, float, list[int]]] = []

    def at(token: int) -> float:
        return offset + (token - tsb) * TIME_PRECISION

    if cuts:
        slices = cuts + ([len(tokens)] if single_ending else [])
        last = 0
        for cut in slices:
            part = tokens[last:cut]
            out.append((at(part[0]), at(part[-1]), part))
            last = cut
        tail = tokens[last:]
        if tail and any(t < vocab.eot for t in tail):
            start = at(tail[0]) if tail[0] >= tsb else out[-1][1]
            out.append((start, max(speech_end, start), tail))
    else:
        stamps = [t for t in tokens if t >= tsb]
        end = at(stamps[-1]) if stamps and stamps[-1] != tsb else speech_end
        start = at(stamps[0]) if stamps and is_ts[0] else offset
        if not stamps:
            base = window_segment(window, "", rate)
            start, end = base.start, base.end
        out.append((start, end, tokens))
    segments = []
    for start, end, part in out:
        text = decode([t for t in part if t < vocab.eot])
        if start == end or not text.strip():
            text, part = "", []
        segments.append(Segment(start, end, text.strip(), tokens=part))
    return segments


@dataclass
class InputState:
    """One job through the windows of its audio."""

    job: object
    windows: list[Window]
    options: WhisperOptions
    vocab: WhisperVocab
    max_tokens: int
    language: int | None = None  # the language token, once given or detected
    prompt_tokens: list[int] = field(default_factory=list)  # all segments' tokens so far
    reset_since: int = 0
    final: list = field(default_factory=list)  # per window: DecodeResult, or None until decoded
    skipped: list = field(default_factory=list)
    segments: list = field(default_factory=list)  # per window: [Segment]
    started: set = field(default_factory=set)
    attempts: list = field(default_factory=list)  # per window: temperature index in flight
    error: str | None = None
    restarts: dict = field(default_factory=dict)  # window -> beam groups decoded again
    serial: int = -1  # the driver's number for the input (its windows' renderings are keyed by it)

    def __post_init__(self):
        n = len(self.windows)
        self.final, self.skipped, self.segments, self.attempts = [None] * n, [False] * n, [None] * n, [0] * n
        if self.options.language is not None and self.vocab.multilingual:
            self.language = self.vocab.language_token(self.options.language)

    def start_prompt(self, encode) -> None:
        if self.options.initial_prompt:
            self.prompt_tokens = encode(" " + self.options.initial_prompt.strip())

    @property
    def done(self) -> bool:
        return self.error is not None or all(r is not None for r in self.final)

    @property
    def open_windows(self) -> int:
        return 0 if self.error is not None else sum(r is None for r in self.final)

    def ready(self) -> list[int]:
        """Windows that can start now (their first attempt)."""
        out = []
        for w in range(len(self.windows)):
            if w in self.started:
                continue
            if self.vocab.multilingual and self.language is None and w > 0:
                break  # the language comes from window 0
            if self.options.condition_on_previous_text and w > 0 and self.final[w - 1] is None:
                break
            out.append(w)
            if self.vocab.multilingual and self.language is None:
                break
        return out

    def prompt(self) -> list[int]:
        return self.prompt_tokens[self.reset_since :][-PROMPT_TOKENS:]

    def accept(self, w: int, result: DecodeResult, decode) -> int | None:
        """Take a window's result at its current temperature; returns the next temperature
        index to try, or None when the window is final."""
        if self.vocab.multilingual and self.language is None and result.language is not None:
            self.language = result.language
        t = self.attempts[w]
        if needs_fallback(result, self.options) and t + 1 < len(self.options.temperatures):
            self.attempts[w] = t + 1
            return t + 1
        self.final[w] = result
        if is_silence(result, self.options):
            self.skipped[w] = True
            self.segments[w] = []
            return None
        if self.options.timestamps:
            segments = token_segments(result.tokens, self.vocab, self.windows[w], decode)
        else:
            text = decode([t for t in result.tokens if t < self.vocab.eot])
            base = window_segment(self.windows[w], text)
            segments = [Segment(base.start, base.end, base.text, tokens=[t for t in result.tokens if t < self.vocab.eot])]
        for s in segments:
            s.avg_logprob, s.no_speech_prob = result.avg_logprob, result.no_speech_prob
            s.temperature, s.compression_ratio = result.temperature, result.compression_ratio
        self.segments[w] = segments
        self.prompt_tokens.extend(t for s in segments for t in s.tokens)
        if not self.options.condition_on_previous_text or result.temperature > 0.5:
            self.reset_since = len(self.prompt_tokens)
        return None

    def window_audio(self, w: int) -> np.ndarray:
        """What the model hears of window ``w``: its audible part (silence before and after is
        cut, so that timestamps count from the speech; Whisper's first one must be <= 1 s)."""
        window = self.windows[w]
        return np.ascontiguousarray(self.job.audio[window.speech_start : window.speech_end], dtype=np.float32)
