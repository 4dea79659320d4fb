"""One-shot audio decoded while it is generated, so that little of it is left for after the last step.

``Speech.run_requests`` hands out each TTS request's whole waveform. Decoded only once a request
finished, requests that end together leave all their audio to the codec after the engine's last
step: 64 fixed-length Higgs 3B requests of 256 frames left ~0.43 s of decoding after an LM run of
1.06 s on the H200 (end to end / LM 0.712, fiftieth session; docs/benchmarks/throughput.md).

``WindowedDecode`` runs such requests as ``stream`` requests that report their tokens a chunk
at a time (``SpeechEngine.report_after``), and decodes each chunk's window as soon as its frames
and its right context exist (``StreamingDecoder``: exact windows, every sample final), on the
codec's worker thread beside the engine's steps (``DecodeQueue``'s bulk batches). When a request
ends only its last chunk is left to decode; its result is its chunks joined, which equals its
whole decode up to float rounding (``codecs/streaming.py``), with the codes it generated.

Used where the codec decodes on its own thread (CUDA) and has a bounded receptive field; on the
CPU a decode runs in the step loop, and windows would add their context's work to it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from speechctl.codecs.streaming import Plan, StreamingDecoder
from speechctl.codecs.worker import DecodeQueue
from speechctl.errors import EngineError
from speechctl.models.audio_stream import AudioStreamReader, TextEvent

# Frames of a chunk. Smaller chunks leave less to decode after a request's last step (its last
# chunk, with the codec's left context) and decode more context twice on the way (Higgs'
# tokenizer: 11 + 11 frames of context, 34 % more work at 64, 17 % at 128).
CHUNK_FRAMES = 64


@dataclass(eq=False)
class _Request:
    tag: object
    reader: AudioStreamReader
    codes: list[np.ndarray] = field(default_factory=list)  # its frames as they came
    waves: list[np.ndarray] = field(default_factory=list)  # its decoded chunks in order
    undecoded: int = 0  # its chunks planned, not yet decoded


@dataclass(eq=False)
class _Batch:
    plans: list[Plan]
    owners: list[_Request]  # per plan
    future: Future


class WindowedDecode:
    """The windowed one-shot decode of a ``Speech``'s TTS requests (module doc)."""

    def __init__(self, prompts, decodes: DecodeQueue, chunk: int = CHUNK_FRAMES):
        self.prompts = prompts
        self.decodes = decodes
        self.decoder = StreamingDecoder(decodes.codec, first_chunk=chunk, growth=1.0, max_chunk=chunk)
        decodes.codec.record_decode_graphs(self.decoder.window_lengths(), padded=True)
        self._requests: dict[int, _Request] = {}  # id(tag) -> request, from its first piece on
        self._batches: deque[_Batch] = deque()
        self._finished: deque[_Request] = deque()  # in the order they finished

    @staticmethod
    def usable(decodes: DecodeQueue) -> bool:
        """Whether windows pay off: the codec decodes beside the steps and its windows are bounded."""
        from speechctl.codecs.batching import bounded

        return decodes.threaded and bounded(decodes.codec.decode_context)

    def prepare(self, request):
        """``request`` as the engine should run it: a TTS request streamed (its audio starts at
        its first step); others as they are."""
        return dataclasses.replace(request, stream=True) if request.starts_in_audio else request

    def take(self, out, engine) -> bool:
        """An engine output of a TTS request: a streamed piece (``piece``) or the end of a
        streamed request (``finish``) taken, True; False for a request it never saw (the caller
        decodes its audio whole). Raises ``EngineError`` as those do."""
        if not out.finished:
            self.piece(out, engine)
            return True
        return self.finish(out)

    def piece(self, out, engine) -> None:
        """A streamed request's new tokens: its frames read, the windows now ready sent to the
        codec, its next piece asked for when its next chunk can go. Raises ``EngineError`` for
        tokens that do not read as audio (the caller fails the request)."""
        request = self._requests.get(id(out.tag))
        if request is None:
            request = self._requests[id(out.tag)] = _Request(out.tag, AudioStreamReader(self.prompts, starts_in_audio=True))
        key = id(out.tag)
        frames = self._read(request, request.reader.feed(out.token_ids, out.aux, self.decoder.frames_wanted(key)))
        self._plan({key: frames} if frames is not None else {}, [])
        engine.report_after(out, self.decoder.frames_wanted(key))

    def finish(self, out) -> bool:
        """A finished output: False where it is not one of this decode's requests (it never
        streamed a piece: the caller decodes it whole). Else its rest is read and its last window
        planned; raises ``EngineError`` for tokens that do not read as audio."""
        key = id(out.tag)
        request = self._requests.get(key)
        if request is None:
            return False
        try:
            frames = self._read(request, request.reader.feed(out.token_ids, out.aux, 1) + request.reader.finish())
        except EngineError:
            self.drop([out.tag])
            raise
        self._finished.append(request)
        self._plan({key: frames} if frames is not None else {}, [key])
        del self._requests[key]  # (after planning: its last chunk's owner)
        return True

    def drop(self, tags) -> None:
        """Requests that will not finish (aborted, failed): forget them, their audio unwanted."""
        for tag in tags:
            request = self._requests.pop(id(tag), None)
            if request is not None:
                self.decoder.cancel(id(tag))

    def ready(self, wait: bool = False) -> Iterator[tuple[object, np.ndarray, np.ndarray]]:
        """(tag, codes [K, T], waveform) of the finished requests whose windows are all decoded
        (all of them, waiting, with ``wait``), in the order they finished."""
        while self._batches and (wait or self._batches[0].future.done()):
            batch = self._batches.popleft()
            for owner, chunk in zip(batch.owners, self.decoder.cut(batch.plans, batch.future.result())):
                owner.waves.append(chunk.audio)
                owner.undecoded -= 1
        while self._finished and self._finished[0].undecoded == 0:
            request = self._finished.popleft()
            K = self.decodes.codec.num_codebooks
            codes = np.concatenate(request.codes, axis=1) if request.codes else np.zeros((K, 0), np.int64)
            yield request.tag, codes, np.concatenate(request.waves) if request.waves else np.zeros(0, np.float32)

    def __len__(self) -> int:
        """Requests streamed or finished whose results are not handed out yet."""
        return len(self._requests) + len(self._finished)

    def _read(self, request: _Request, events) -> np.ndarray | None:
        """The new frames among a reader's events (None: none), kept with the request's codes."""
        new = []
        for event in events:
            if isinstance(event, TextEvent):
                raise EngineError("a TTS request generated text where audio belongs")
            if event.segment != 0:
                raise EngineError("a TTS request generated a second audio segment")
            if event.frames.shape[1]:
                new.append(event.frames)
        if not new:
            return None
        frames = np.concatenate(new, axis=1) if len(new) > 1 else new[0]
        request.codes.append(frames)
        return frames

    def _plan(self, frames: dict, ended: list) -> None:
        plans = self.decoder.plan(frames, ended)
        if not plans:
            return
        owners = [self._requests[plan.key] for plan in plans]
        for owner in owners:
            owner.undecoded += 1
        windows = [p.codes for p in plans if p.codes is not None]
        self._batches.append(_Batch(plans, owners, self.decodes.decode(windows)))
