"""Streaming decode: turn code frames into waveform chunks while they are still being generated.

    decoder = StreamingDecoder(codec, first_chunk=2, growth=2, max_chunk=128)
    for step in generation:                                  # many requests at once
        chunks = decoder.step({key: new_frames [K, n]}, ended={keys that finished})
        for chunk in chunks: play(chunk.key, chunk.audio)    # float32 [n_frames * hop_length]

Every emitted sample is final: concatenating a request's chunks gives its one-shot
``codec.decode`` (same length; equal up to float rounding, see below). How:

* A chunk covers frames ``[a, b)``. It is decoded only once frames up to ``b + right`` exist
  (``right`` = the decoder's right receptive field, ``codec.decode_context[1]``), as the window
  ``[a - left, b + right)``, and only the middle ``[a, b)`` is kept. Inside that window every kept
  frame sees exactly the code frames it sees in the whole sequence, so its samples are those of the
  one-shot decode. A window that reaches back to frame 0 starts at the natural start (no left
  context is missing there).
* When a request ends, the rest ``[a, T)`` is decoded with the natural end, like the one-shot decode,
  in the shortest of the chunks' window lengths (``window_lengths``) that holds it and its left
  context (``[T - W, T)``, more left context than needed where ``W`` is longer): so the windows
  of every step have the few lengths that decode graphs replay (``Codec.use_decode_graphs``),
  and a request shorter than a full chunk's window is not decoded whole again at its end.
* Chunk sizes grow: ``first_chunk`` frames first (low latency to the first audio), then
  ``growth`` times the previous one up to ``max_chunk`` (fewer, larger decoder calls).
* ``first_lookahead`` (opt-in; default the whole right context) lets the first chunk go with
  fewer frames after it: the one place where emitted samples are not final. A trained decoder's
  receptive field is wider than what moves its output: on held-out speech, the default voice's
  codec (right context 9 frames) gives the first 2 frames within 44 dB (5th percentile) of the
  exact ones at 4 frames of lookahead, and below 16-bit PCM's step at 7; at 2 frames the median
  is 24 dB (``recipes/voice/first_lookahead.py``, docs/usage.md). Each frame of lookahead saved
  is a decode step less before the first audio, which under load is most of the time to first
  audio (docs/benchmarks/throughput.md, issue 21 item 6). Later chunks are
  exact, so the error stays in the first chunk's last samples.
* All windows that are ready in one step, of all requests, go to the codec in one batched
  ``codec.decode`` call (exact batching, see ``run_exact_batched``): that is what makes a GPU
  codec keep up with many streams.

Equality is up to float rounding, not bit-exact, for a non-causal decoder such as DAC: a window
is a different tensor shape from the whole sequence, so the convolutions may sum in a different
order (max abs difference ~1e-6 on CPU in float32). A causal decoder (``right == 0``) needs no
lookahead at all.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from speechctl.codecs.base import Codec
from speechctl.codecs.batching import bounded

# Frames of a streamed request's largest chunk where a caller names none, by where the codec
# runs. On CUDA it decodes on its own stream beside the engine's steps, and larger chunks mean
# fewer windows and less context decoded twice: 128 was as fast as 32 or faster in every row
# (llama-1b stream bench, H200 and H100: last audio / one-shot 0.99 and 0.92 against 1.19 and
# 1.03 at c = 64; the real Higgs 3B's workload on the H100: streamed TTFA p95 395 against 504 ms
# at 0.7 load). On the CPU it decodes in the step loop, where a request's last window (up to a
# largest chunk of frames after its last token) is on its last audio's path: 32 (c = 16: 828
# against 938 ms). docs/benchmarks/throughput.md, forty-seventh to forty-ninth sessions.
MAX_CHUNK = {"cuda": 128, "cpu": 32}


def default_max_chunk(codec: Codec) -> int:
    """``MAX_CHUNK`` for where ``codec`` runs (another device: the CPU's)."""
    return MAX_CHUNK.get(codec.device.type, MAX_CHUNK["cpu"])


@dataclass
class Chunk:
    """Decoded samples of one request: ``audio`` covers samples ``start`` .. ``start + len(audio)``
    of the request's waveform; ``last`` marks its final chunk."""

    key: Hashable
    audio: np.ndarray  # float32 [n_frames * hop_length]
    start: int  # first sample's index in the whole waveform
    last: bool


@dataclass
class Plan:
    """One chunk to emit: decode ``codes`` (a window; None: nothing to decode, an empty last
    chunk) and keep its frames ``[skip, skip + keep)``; the chunk starts at sample ``start``."""

    key: Hashable
    codes: np.ndarray | None
    skip: int
    keep: int
    start: int
    last: bool


@dataclass
class _Stream:
    codes: list[np.ndarray] = field(default_factory=list)  # [K, n] pieces from frame ``base`` on
    base: int = 0  # frames before this one are dropped (no window reaches back to them)
    frames: int = 0  # frames pushed so far
    emitted: int = 0  # frames decoded and emitted so far
    next_chunk: int = 0  # frames in the next chunk
    ended: bool = False

    def window(self, start: int, end: int) -> np.ndarray:
        """Codes of frames ``[start, end)`` (``start >= base``)."""
        if len(self.codes) > 1:
            self.codes = [np.concatenate(self.codes, axis=1)]
        return self.codes[0][:, start - self.base : end - self.base]

    def forget_before(self, frame: int) -> None:
        if self.codes and frame > self.base:
            self.codes = [self.window(frame, self.frames)]
            self.base = frame


class StreamingDecoder:
    """Chunked, exact, batched streaming decode of many requests' code frames (see module doc).

    Args:
        codec: the codec; its ``decode_context`` = (left, right) frames sets the windows.
        first_chunk: frames in a request's first chunk (1-4 keeps the first audio early).
        growth: each next chunk is ``growth`` times the previous one ...
        max_chunk: ... up to this many frames (None: ``default_max_chunk(codec)``).
        first_lookahead: frames the first chunk waits for past its end (None: the codec's right
            context, every sample final; fewer: an earlier, inexact first chunk, see module doc).
    """

    def __init__(self, codec: Codec, *, first_chunk: int = 2, growth: float = 2.0, max_chunk: int | None = None,
                 first_lookahead: int | None = None):
        max_chunk = default_max_chunk(codec) if max_chunk is None else max_chunk
        if first_chunk < 1 or max_chunk < first_chunk or growth < 1 or (first_lookahead or 0) < 0:
            raise ValueError(f"bad chunking: first_chunk={first_chunk}, growth={growth}, max_chunk={max_chunk}, "
                             f"first_lookahead={first_lookahead}")
        self.codec = codec
        self.first_chunk, self.growth, self.max_chunk = int(first_chunk), float(growth), int(max_chunk)
        self.left, self.right = codec.decode_context
        self.first_right = self.right if first_lookahead is None else min(int(first_lookahead), self.right)
        self.steady = self.left + self.max_chunk + self.right  # frames of a full chunk's window
        self._lengths = self.window_lengths() if bounded(codec.decode_context) else []
        self._streams: dict[Hashable, _Stream] = {}
        self.decode_calls = 0  # batched codec calls made (one per step with anything ready)
        self.window_frames = 0  # code frames in the windows planned: the chunks' and their context's

    def _lookahead(self, emitted: int) -> int:
        """Frames that must exist past a chunk that starts at frame ``emitted`` before it goes."""
        return self.first_right if emitted == 0 else self.right

    def frames_wanted(self, key: Hashable) -> int:
        """How many more frames the request must push before its next chunk can go (at least 1):
        its reader need not look for frames before then (``AudioStreamReader.feed``'s ``wanted``)."""
        s = self._streams.get(key) or _Stream(next_chunk=self.first_chunk)  # (not started: its first chunk)
        return max(1, s.emitted + s.next_chunk + self._lookahead(s.emitted) - s.frames)

    def window_lengths(self) -> list[int]:
        """The frames of the windows a request's chunks are decoded in, from its first to the
        full chunks' (``steady``; its last is the shortest of these that holds the rest), for the
        codec's decode graphs (``Codec.record_decode_graphs``); a request's frames that come
        several chunks at once, or that end it shorter than its last window, make others. Where
        every window reaches back to frame 0 (Mimi's unbounded left context) each has its own
        length: its first four chunks'."""
        if not bounded((self.left, self.right)):
            ends, end, size = [], 0, self.first_chunk
            for _ in range(4):
                ends.append(end + size + self._lookahead(end))
                end += size
                size = min(self.max_chunk, math.ceil(size * self.growth))
            return ends
        lengths, emitted, size = {self.steady}, 0, self.first_chunk
        while not (size == self.max_chunk and emitted >= self.left):
            lengths.add(emitted + size + self._lookahead(emitted) - max(0, emitted - self.left))
            emitted, size = emitted + size, min(self.max_chunk, math.ceil(size * self.growth))
        return sorted(lengths)

    def step(self, frames: Mapping[Hashable, np.ndarray] | None = None, ended: Iterable[Hashable] = ()) -> list[Chunk]:
        """Add new code frames (``[K, n]`` per request) and mark requests whose codes are complete;
        decode every chunk that is now ready, all requests in one batch. Returns the chunks in
        request order; a request's ``last`` chunk (possibly empty) ends it and forgets it."""
        plans = self.plan(frames, ended)
        windows = [p.codes for p in plans if p.codes is not None]
        if windows:
            self.decode_calls += 1
        return self.cut(plans, self.codec.decode(windows) if windows else [])

    def plan(self, frames: Mapping[Hashable, np.ndarray] | None = None, ended: Iterable[Hashable] = ()) -> list[Plan]:
        """``step`` without the decode, for a caller that decodes elsewhere (another thread):
        the chunks now ready, each with the window to decode (``Plan.codes``; all of them in one
        batch), and every request's state advanced as though they were decoded. ``cut`` turns
        the plans and the windows' waveforms into the chunks ``step`` would return."""
        for key, codes in (frames or {}).items():
            self._push(key, codes)
        for key in ended:
            self._stream(key).ended = True
        hop = self.codec.hop_length
        plans = []
        for key, s in list(self._streams.items()):
            if s.ended:
                # the rest is shorter than a chunk and its right context where the loop below
                # emitted what was ready in earlier steps: then [T - W, T) holds it with its left
                # context for the shortest window length W that reaches back far enough (frames
                # that came in the step that ended it may need a longer one than any)
                start = max(0, s.emitted - self.left)
                longer = [n for n in self._lengths if n >= s.frames - start]
                start = max(0, min(start, s.frames - (longer[0] if longer else self.steady)))
                keep = s.frames - s.emitted
                codes = s.window(start, s.frames) if keep > 0 else None
                plans.append(Plan(key, codes, s.emitted - start, keep, s.emitted * hop, True))
                del self._streams[key]
                continue
            end = s.emitted
            size = s.next_chunk
            lookahead = self._lookahead(end)
            while end + size + self._lookahead(end) <= s.frames:  # several chunks may be ready at once
                lookahead = self._lookahead(end)  # the window must reach past the last one's end
                end += size
                size = min(self.max_chunk, math.ceil(size * self.growth))
            if end > s.emitted:
                start = max(0, s.emitted - self.left)
                codes = s.window(start, end + lookahead)  # a view: forgetting below keeps it
                plans.append(Plan(key, codes, s.emitted - start, end - s.emitted, s.emitted * hop, False))
                s.next_chunk = size
                s.emitted = end
                s.forget_before(max(0, s.emitted - self.steady))  # the last window reaches back this far
        self.window_frames += sum(p.codes.shape[-1] for p in plans if p.codes is not None)
        return plans

    def cut(self, plans: list[Plan], waves) -> list[Chunk]:
        """The chunks of ``plans``, ``waves`` the decoded windows in plan order."""
        waves = iter(waves)
        hop = self.codec.hop_length
        empty = np.zeros(0, dtype=np.float32)
        return [Chunk(p.key, next(waves)[p.skip * hop : (p.skip + p.keep) * hop] if p.codes is not None else empty,
                      p.start, p.last) for p in plans]

    def begin(self, key: Hashable, context: np.ndarray, keep_from: int) -> None:
        """A request whose speech follows on from ``context`` ([K, T] codes of a voice prompt,
        ``VoicePrompt``): its windows see those frames before its own, and its chunks start at
        frame ``keep_from`` of them (the frames after it, the prompt's closing pause, come first
        in its audio). Its own frames are pushed after them as usual."""
        if key in self._streams:
            raise ValueError(f"{key}: begun after its frames came")
        context = np.asarray(context, dtype=np.int64)
        if not 0 <= keep_from <= context.shape[1]:
            raise ValueError(f"{key}: keep_from {keep_from} is outside the context's {context.shape[1]} frames")
        self._push(key, context)
        stream = self._streams[key]
        stream.emitted = keep_from
        stream.forget_before(max(0, keep_from - self.steady))

    def push(self, key: Hashable, codes: np.ndarray) -> list[Chunk]:
        """One request's new frames ``[K, n]``; returns the chunks now ready (any request)."""
        return self.step({key: codes})

    def finish(self, key: Hashable) -> list[Chunk]:
        """The request's codes are complete: returns the rest of its audio (ends with ``last``)."""
        return self.step(ended=[key])

    def cancel(self, key: Hashable) -> None:
        """Forget a request without decoding the rest (barge-in, abort)."""
        self._streams.pop(key, None)

    def pending(self) -> list[Hashable]:
        return list(self._streams)

    def _stream(self, key: Hashable) -> _Stream:
        if key not in self._streams:
            self._streams[key] = _Stream(next_chunk=self.first_chunk)
        return self._streams[key]

    def _push(self, key: Hashable, codes: np.ndarray) -> None:
        codes = np.asarray(codes)
        K = self.codec.num_codebooks
        if codes.ndim != 2 or codes.shape[0] != K:
            raise ValueError(f"{key}: expected new frames of shape [{K}, n], got {list(codes.shape)}")
        stream = self._stream(key)
        if stream.ended:
            raise ValueError(f"{key}: frames pushed after the end")
        if codes.shape[1]:
            stream.codes.append(codes.astype(np.int64, copy=False))
            stream.frames += codes.shape[1]
