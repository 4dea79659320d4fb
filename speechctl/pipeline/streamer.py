"""Drive a :class:`speechctl.api.Speech` engine step by step and stream what its requests say.

    streamer = SpeechStreamer(speech, first_chunk=2)
    streamer.submit(TtsJob(id="a", text="Hello"))       # or submit_request(id, StreamRequest)
    while streamer.busy():
        for event in streamer.step():                    # one engine step
            ...  # TtsChunk(id, audio, sample_rate, start, last, error) | TextPiece(id, text)

Requests run as ``stream`` requests: the engine reports their new tokens on all streams;
:class:`speechctl.models.audio_stream.AudioStreamReader` turns them into code frames as soon as
each frame is complete on every stream, and one :class:`StreamingDecoder` plans the ready chunks
of all requests, decoded in one batched codec call; the step's finished one-shot requests' whole
waveforms in another, after the chunks (``DecodeQueue``'s urgent and bulk batches). A TTS
request's tokens are reported when its next chunk can go (``frames_wanted``,
``SpeechEngine.report_after``), not at every step: at 64 streamed requests a piece per request
per step was most of what streaming cost the host beside one-shot (vLLM's outputs, the engine's
pieces, the reader's reads). So a request's chunks concatenate to what ``Speech.run`` returns
for it, while its first audio comes a few steps after it started.

On CUDA that decode runs on the codec's worker thread (``codecs/worker.py``), so the engine's
next step does not wait for it: a step hands out the audio decoded since the last, the chunks
in the order the steps planned them and a one-shot waveform when it is ready (a step with no
request left in the engine waits for the rest). On the CPU it runs in the step, where the two
would compete for the same cores.
Stepping is cooperative (the caller calls ``step``), so several engines can share a thread.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from speechctl.codecs.streaming import Plan, StreamingDecoder
from speechctl.codecs.worker import DecodeQueue
from speechctl.errors import EngineError, SpeechctlError
from speechctl.models.audio_stream import AudioEvent, AudioStreamReader, TextEvent
from speechctl.models.prompting import VoicePrompt
from speechctl.pieces import Sequence


@dataclass
class TextPiece:
    """New text of a request's reply (unified speech LMs answer in text and audio)."""

    id: str
    text: str


@dataclass(eq=False)
class _Live:
    """A request in flight (also its tag in the engine: compared by identity)."""

    id: str
    reader: AudioStreamReader
    text_ids: list[int] = field(default_factory=list)
    text_sent: int = 0  # characters of the decoded text already reported
    samples: int = 0  # audio samples reported so far (all segments)
    open_segment: int | None = None  # the segment being decoded (decoder key (id, segment))
    stream: bool = True  # False: one-shot, its audio decoded whole when it finishes
    audio_only: bool = False  # its reply is audio from the first step (TTS): pieces may come a chunk at a time
    dropped: bool = False  # cancelled or failed: audio still being decoded for it is dropped
    submitted_step: int = 0  # the streamer's step count when it was submitted
    submitted_at: float = 0.0  # perf_counter time it was submitted
    first_output: tuple[int, float] | None = None  # (step, time) the engine first reported on it
    first_planned: tuple[int, float] | None = None  # (step, time) its first chunk went to the codec
    prompt: VoicePrompt | None = None  # the voice prompt its speech follows on from (``Speech.continuation``)


@dataclass(eq=False)
class _Decoding:
    """One step's audio in flight, in two parts the codec decodes apart (``DecodeQueue``): its
    streamed chunks (``StreamingDecoder`` plans; their windows' future, urgent) and the streamed
    requests they close; its finished one-shot requests (their whole waveforms' future, bulk),
    which it closes too. Each part is handed out when decoded, the chunks in step order."""

    plans: list[Plan]
    lives: dict  # plan key -> _Live (None: gone before the step, as a cancelled request's was)
    streamed_closing: list[_Live]
    whole: list[_Live]
    windows: Future
    wholes: Future
    chunks_out: bool = False
    wholes_out: bool = False


class SpeechStreamer:
    """Streaming TTS (and unified speech replies) on one ``Speech`` (see module doc)."""

    def __init__(self, speech, *, first_chunk: int = 2, growth: float = 2.0, max_chunk: int | None = None,
                 first_lookahead: int | None = None, decode_thread: bool | None = None):
        """``decode_thread``: decode on the codec's worker thread (None: on CUDA only). The
        chunking arguments are ``StreamingDecoder``'s."""
        self.speech = speech
        self.engine = speech.engine
        self.decoder = StreamingDecoder(speech.codec, first_chunk=first_chunk, growth=growth, max_chunk=max_chunk,
                                        first_lookahead=first_lookahead)
        # (CUDA) before a first chunk waits for one, or a one-shot request's audio for its length's
        speech.codec.record_decode_graphs(self.decoder.window_lengths(), padded=True)
        self._decodes = DecodeQueue(speech.codec, thread=decode_thread)
        self._in_flight: deque[_Decoding] = deque()
        self._live: dict[str, _Live] = {}
        self._closing: dict[str, _Live] = {}  # out of the engine, audio still being decoded
        self._failed: list = []
        self._sequences: dict[tuple, Sequence] = {}  # (job id, piece) -> its long job
        # where the steps' wall time went (benchmarks read it): the engine's step, the codec
        # (planning its decodes, waiting for them where they run in the step or nothing is left
        # in the engine, handing out their audio), and the rest (each request's tokens to its reader)
        self.seconds = {"engine": 0.0, "codec": 0.0, "host": 0.0}
        self.steps = 0
        self.engine_steps = 0  # of them, those that stepped the engine (not only handing out audio)
        self.first_outputs = 0  # requests whose prefill the engine finished (their first output came)
        self.pieces = 0  # streamed requests' pieces the engine handed out before their end
        # per streamed request, its wait for first audio: the steps until it was handed out, of
        # them the steps until its first chunk was planned (the engine's part), and the seconds
        # from then (the codec's part; on the CPU the decode runs in the step that planned it);
        # and in seconds, from its submission to the engine's first output for it (its prefill
        # and any queueing), from there to its first chunk planned (the decode steps the delay
        # pattern and the codec's right context ask for)
        self.first_audio: list[dict] = []

    @property
    def codec_busy_s(self) -> float:
        """Seconds the codec spent decoding this streamer's audio (on its worker thread on CUDA:
        time the steps did not wait for, unless the audio came late)."""
        return self._decodes.busy_s

    def codec_activity(self) -> tuple[bool, int]:
        """(a decode runs now, decodes started so far): a step during which the codec decoded
        started with one running or saw the count grow (the workload bench splits step times so)."""
        return self._decodes.decoding, self._decodes.decodes_started

    @property
    def sample_rate(self) -> int:
        return self.speech.sample_rate

    # -- requests -------------------------------------------------------------------------------

    def submit(self, job, stream: bool = True) -> None:
        """A ``TtsJob``: validated, its voice prompt encoded, queued in the engine. With
        ``stream`` False it runs one-shot beside the streamed ones: its whole audio comes as one
        chunk when it finishes (decoded with the step's other finished one-shot jobs)."""
        from speechctl.jobs import validate

        error = validate(job)
        if error:
            self._failed.append(self._chunk(job.id, error=error))
            return
        codes = self.speech.codec.encode([job.voice])[0] if job.voice is not None else None
        requests = self.speech.requests_of(job, codes)
        prompt = self.speech.continuation(job)
        if len(requests) == 1:
            self.submit_request(job.id, requests[0], stream=stream, prompt=prompt)
            return
        # A long text: its pieces stream together, passed on in order (speechctl.pieces)
        sequence = Sequence(job.id, requests[0].tag.whole.pieces, self.sample_rate)
        for request in requests:
            piece_id = (job.id, request.tag.index)
            self._sequences[piece_id] = sequence
            self.submit_request(piece_id, request, stream=stream, prompt=prompt)

    def submit_request(self, id: str, request, stream: bool = True, prompt: VoicePrompt | None = None) -> None:
        """A prepared ``StreamRequest`` (TTS, unified chat, fixed-length benchmarks); ``prompt``:
        the voice prompt a request that ``continues`` one follows on from (its audio's context)."""
        if id in self._live:
            raise SpeechctlError(f"{id}: a request with this id is already running")
        if request.continues != (prompt is not None):
            raise SpeechctlError(f"{id}: a request that continues a voice prompt comes with it, and only such a one")
        live = _Live(id, AudioStreamReader(self.speech.prompts, request.starts_in_audio), stream=stream,
                     audio_only=request.starts_in_audio, submitted_step=self.steps, submitted_at=time.perf_counter(),
                     prompt=prompt)
        if prompt is not None and stream:  # its first segment's windows see the prompt's frames first
            live.open_segment = 0
            self.decoder.begin((id, 0), prompt.codes, prompt.codes.shape[1] - prompt.lead_frames)
        self._live[id] = live
        self.engine.submit(dataclasses.replace(request, stream=stream, tag=live))

    def cancel(self, ids=None) -> None:
        """Stop requests (all by default; a long job's id stops all its pieces) now: aborted in the
        engine, their audio dropped."""
        if ids is not None:
            ids = list(ids) + [key for key in self._sequences if key[0] in set(ids)]
        else:
            self._sequences.clear()
        chosen = [self._live[i] for i in (list(self._live) if ids is None else ids) if i in self._live]
        if chosen:
            self.engine.abort(chosen)
        for live in chosen:
            if live.open_segment is not None:
                self.decoder.cancel((live.id, live.open_segment))
            del self._live[live.id]
            live.dropped = True
        for i in list(self._closing) if ids is None else ids:
            if i in self._closing:
                self._closing.pop(i).dropped = True

    def busy(self) -> bool:
        return bool(self._live or self._failed or self._in_flight)

    # -- stepping -------------------------------------------------------------------------------

    def step(self) -> list:
        """One engine step; returns ``TtsChunk``s and ``TextPiece``s in the order they happened
        per request. A request ends with a ``TtsChunk`` whose ``last`` is set (empty audio; its
        ``error`` is set if it failed)."""
        events, self._failed = self._failed, []
        started = time.perf_counter()
        stepping = bool(self._live)  # (else only audio still being decoded is handed out)
        outputs = self.engine.step() if stepping else []
        stepped = time.perf_counter()
        frames: dict = {}
        ended: list = []
        finished: list[_Live] = []
        whole: list[tuple[_Live, np.ndarray]] = []  # one-shot requests finished in this step
        pieces: list = []  # (live, piece) of the streamed requests that go on
        for out in outputs:
            live = out.tag
            if not isinstance(live, _Live) or self._live.get(live.id) is not live:
                continue  # cancelled meanwhile
            if out.error:
                self._fail(live, f"{live.id}: {out.error}", events)
                continue
            if live.first_output is None:
                live.first_output = (self.steps, stepped)
                self.first_outputs += 1
            self.pieces += live.stream and not out.finished
            if not live.stream:
                try:
                    (codes,) = self.speech.prompts.audio_segments(out, starts_in_audio=True)
                except (SpeechctlError, ValueError) as e:
                    self._fail(live, f"{live.id}: {e}", events)
                    continue
                whole.append((live, codes))
                continue
            try:
                wanted = self.decoder.frames_wanted((live.id, live.reader.segment))
                for event in live.reader.feed(out.token_ids, out.aux, wanted):
                    if isinstance(event, TextEvent):
                        live.text_ids += event.token_ids
                    else:
                        self._audio(live, event, frames, ended)
                if out.finished:
                    for event in live.reader.finish():
                        self._audio(live, event, frames, ended)
            except EngineError as e:
                self._fail(live, f"{live.id}: {e}", events)
                continue
            text = self._new_text(live)
            if text:
                events.append(TextPiece(live.id, text))
            if out.finished:
                finished.append(live)
            elif live.audio_only:
                pieces.append((live, out))
        for key in [k for k in frames if k[0] not in self._live]:  # failed in this step
            del frames[key]
        ended = [k for k in ended if k[0] in self._live]
        decoding = time.perf_counter()
        plans = self.decoder.plan(frames, ended)
        for live, out in pieces:  # the next piece when its next chunk can go, not every step
            if live.reader.in_audio and self._live.get(live.id) is live:
                self.engine.report_after(out, self.decoder.frames_wanted((live.id, live.reader.segment)))
        windows = [p.codes for p in plans if p.codes is not None]
        for live in finished + [live for live, _ in whole]:  # out of the engine; closed once its audio is handed out
            self._closing[live.id] = self._live.pop(live.id)
        lives = {p.key: self._live.get(p.key[0]) or self._closing.get(p.key[0]) for p in plans}
        for plan in plans:
            live = lives[plan.key]
            if plan.codes is not None and live is not None and live.first_planned is None:
                live.first_planned = (self.steps, time.perf_counter())
        if plans or finished or whole:
            wholes = [live.prompt.decodable(codes, self.speech.codec.hop_length)[0] if live.prompt else codes
                      for live, codes in whole]
            self._in_flight.append(_Decoding(plans, lives, finished, [live for live, _ in whole],
                                             self._decodes.decode(windows, urgent=True),
                                             self._decodes.decode(wholes)))
        events += self._decoded(wait=not self._live)
        engine, codec = stepped - started, time.perf_counter() - decoding
        self.steps += 1
        self.engine_steps += stepping
        self.seconds["engine"] += engine
        self.seconds["codec"] += codec
        self.seconds["host"] += time.perf_counter() - started - engine - codec
        return self._in_order(events) if self._sequences else events

    def _decoded(self, wait: bool) -> list:
        """The audio decoded so far (all of it, waiting, with ``wait``): the streamed chunks in
        step order, each one-shot request's waveform when decoded; each request's audio, then
        the empty chunk that closes it."""
        events = []
        in_order = True  # every earlier step's chunks handed out
        for step in self._in_flight:
            # each part marked out before it is read: a codec failure raised here is not raised again
            if in_order and not step.chunks_out and (wait or step.windows.done()):
                step.chunks_out = True
                events += self._chunks_of(step)
            in_order = in_order and step.chunks_out
            if not step.wholes_out and (wait or step.wholes.done()):
                step.wholes_out = True
                events += self._wholes_of(step)
        while self._in_flight and self._in_flight[0].chunks_out and self._in_flight[0].wholes_out:
            self._in_flight.popleft()
        return events

    def _chunks_of(self, step: _Decoding) -> list:
        events = []
        waves = step.windows.result()  # a codec failure is the caller's, as a decode in the step was
        for chunk in self.decoder.cut(step.plans, waves):
            live = step.lives[chunk.key]
            if live is not None and not live.dropped and len(chunk.audio):
                if live.samples == 0 and live.first_planned is not None:
                    planned, at = live.first_planned
                    output_step, output_at = live.first_output
                    self.first_audio.append({"id": live.id, "submitted_at": live.submitted_at,
                                             "steps_to_audio": self.steps - live.submitted_step + 1,
                                             "steps_to_output": output_step - live.submitted_step + 1,
                                             "steps_to_plan": planned - live.submitted_step + 1,
                                             "to_output_s": output_at - live.submitted_at,
                                             "output_to_plan_s": at - output_at,
                                             "decode_wait_s": time.perf_counter() - at})
                events.append(self._chunk(live.id, chunk.audio, live.samples, last=False))
                live.samples += len(chunk.audio)
        return events + self._closed(step.streamed_closing)

    def _wholes_of(self, step: _Decoding) -> list:
        events = []
        for live, wave in zip(step.whole, step.wholes.result()):
            if live.prompt is not None:  # (from the prompt's closing pause on)
                wave = wave[live.prompt.samples_before(self.speech.codec.hop_length) :]
            if not live.dropped:
                events.append(self._chunk(live.id, wave, 0, last=False))
                live.samples = len(wave)
        return events + self._closed(step.whole)

    def _closed(self, lives: list[_Live]) -> list:
        """The empty chunks that close ``lives`` (their audio handed out)."""
        events = []
        for live in lives:
            if not live.dropped:
                del self._closing[live.id]
                events.append(self._chunk(live.id, start=live.samples, last=True))
        return events

    def _in_order(self, events: list) -> list:
        """Pieces' chunks as their long jobs' chunks, in piece order (``pieces.Sequence``)."""
        out = []
        for event in events:
            sequence = self._sequences.get(event.id) if isinstance(event.id, tuple) else None
            if sequence is None:
                out.append(event)
                continue
            emitted = sequence.push(event.id[1], event)
            out.extend(emitted)
            if sequence.failed or any(c.last for c in emitted):
                pieces = [k for k, s in self._sequences.items() if s is sequence]
                self.cancel([k for k in pieces if k in self._live or k in self._closing])
                for key in pieces:
                    del self._sequences[key]
        return out

    def _audio(self, live: _Live, event: AudioEvent, frames: dict, ended: list) -> None:
        key = (live.id, event.segment)
        live.open_segment = None if event.ended else event.segment
        if event.frames.shape[1]:
            frames[key] = np.concatenate([frames[key], event.frames], axis=1) if key in frames else event.frames
        elif key not in frames:
            frames[key] = event.frames
        if event.ended:
            ended.append(key)

    def _new_text(self, live: _Live) -> str:
        if not live.text_ids:
            return ""
        text = self.speech.prompts.tokenizer.decode(live.text_ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a multi-byte character not complete yet
            text = text.rstrip("\ufffd")
        new, live.text_sent = text[live.text_sent :], max(live.text_sent, len(text))
        return new

    def _fail(self, live: _Live, error: str, events: list) -> None:
        self.engine.abort([live])  # (a no-op for a request that has finished)
        if live.open_segment is not None:
            self.decoder.cancel((live.id, live.open_segment))
        self._live.pop(live.id, None)
        live.dropped = True  # audio of earlier steps still being decoded
        events.append(self._chunk(live.id, error=error))

    def _chunk(self, id: str, audio: np.ndarray | None = None, start: int = 0, last: bool = True, error: str | None = None):
        from speechctl.jobs import TtsChunk

        audio = np.zeros(0, np.float32) if audio is None else audio
        return TtsChunk(id, audio, self.sample_rate, start, last, error)
