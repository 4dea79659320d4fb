"""The live chat loop: listen, detect the end of an utterance, answer through the pipeline while
playing the reply as it streams out, and start over; new speech during a reply interrupts it.

    loop = ChatLoop(pipeline, device, VadConfig(threshold_db=-40, silence_ms=700))
    turns = loop.run()          # until the input ends, max_turns, or Ctrl-C

Everything runs in the caller's thread: each round reads the microphone (blocking only when
nothing is being answered), feeds the VAD, and steps the pipeline once. The device is an
:class:`speechctl.audio.devices.AudioDevice`, so the same loop runs on a sound card or on a
scripted queue (tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from speechctl.pipeline.stage import Piece, Pipeline, Turn
from speechctl.pipeline.vad import EnergyVad, Skipped, SpeechStart, Utterance, VadConfig


@dataclass
class ChatTurn:
    """One user utterance and what became of it. Latencies are seconds from the moment the end
    of the utterance was detected (the VAD's hangover of silence comes before that)."""

    index: int
    speech_ms: int
    transcript: str | None = None  # ASR stage (None in unified mode)
    reply: str = ""
    reply_samples: int = 0
    sample_rate: int | None = None
    skipped: bool = False  # an empty utterance (too short, or no words recognized): no reply
    interrupted: bool = False  # barge-in: new speech stopped this reply
    first_audio_s: float | None = None
    last_audio_s: float | None = None
    errors: tuple[str, ...] = ()
    pipeline_turn: Turn | None = None

    @property
    def reply_seconds(self) -> float:
        return self.reply_samples / self.sample_rate if self.sample_rate else 0.0


def turn_summary(turn: Turn, index: int = 0, speech_ms: int = 0) -> ChatTurn:
    """A ChatTurn from a pipeline turn (text of the ASR stage, reply of the stage after it)."""
    texts = turn.texts
    reply = texts.get("lm", texts.get("unified", ""))
    chat = ChatTurn(
        index,
        speech_ms,
        transcript=texts.get("asr", "" if "asr" in turn.times else None),
        reply=reply.strip(),
        reply_samples=int(sum(len(a) for a in turn.audio)),
        sample_rate=turn.sample_rate,
        interrupted=turn.cancelled,
        errors=tuple(turn.errors),
        pipeline_turn=turn,
    )
    chat.first_audio_s = turn.first_audio()
    last = turn.times[turn.audio_stage].last_out
    chat.last_audio_s = None if last is None or not chat.reply_samples else last - turn.started
    chat.skipped = not chat.reply_samples and not chat.reply and not turn.cancelled
    return chat


class ChatLoop:
    """See module doc. ``on_event(kind, value)`` reports: "speech" (None), "skipped" (ChatTurn),
    "transcript" (str), "reply" (text piece), "barge-in" (ChatTurn), "turn" (ChatTurn, when its
    reply has been generated), "error" (str)."""

    def __init__(self, pipeline: Pipeline, device, vad: VadConfig | None = None, *, barge_in: bool = True, on_event=None):
        self.pipeline = pipeline
        self.device = device
        self.vad_config = vad or VadConfig()
        self.barge_in = barge_in
        self.on_event = on_event or (lambda kind, value: None)
        self.turns: list[ChatTurn] = []
        self._current: tuple[ChatTurn, Turn] | None = None  # being answered
        self._played: ChatTurn | None = None  # answered; its reply may still be playing

    def run(self, max_turns: int | None = None) -> list[ChatTurn]:
        """Chat until the input ends or ``max_turns`` turns were answered; then let the last reply
        finish playing. Ctrl-C (KeyboardInterrupt) stops everything at once and propagates."""
        vad = EnergyVad(self.device.input_rate, self.vad_config)
        ended = False
        try:
            while True:
                if not ended:
                    block = self.device.read(wait=not self.pipeline.busy())
                    events = vad.flush() if block is None else vad.push(block)
                    ended = block is None
                    for event in events:
                        self._on_vad(event)
                if self.pipeline.busy():
                    self._step()
                answered = sum(1 for t in self.turns if not t.skipped and not t.interrupted)
                if not self.pipeline.busy() and (ended or (max_turns is not None and answered >= max_turns)):
                    self.device.drain()
                    return self.turns
        finally:
            self.pipeline.cancel()
            self.device.stop()

    def _on_vad(self, event) -> None:
        if isinstance(event, SpeechStart):
            self.on_event("speech", None)
            if self.barge_in and (self.pipeline.busy() or self.device.playing()):
                self._interrupt()
        elif isinstance(event, Skipped):
            turn = ChatTurn(len(self.turns), event.speech_ms, skipped=True)
            self.turns.append(turn)
            self.on_event("skipped", turn)
        elif isinstance(event, Utterance):
            if self.pipeline.busy() or self.device.playing():
                if not self.barge_in:
                    return  # half duplex: what the mic hears during a reply is ignored (echo)
                self._interrupt()
            piece = Piece(0, "audio", event.audio, last=True, sample_rate=self.device.input_rate)
            turn = ChatTurn(len(self.turns), event.speech_ms)
            self.turns.append(turn)
            self._current = (turn, self.pipeline.start(piece))

    def _interrupt(self) -> None:
        """Barge-in: stop the reply of the current turn, being generated or still playing."""
        playing = self.device.playing()
        self.device.stop()
        if self.pipeline.busy():
            self.pipeline.cancel()
        if self._current is not None:
            self._current[0].interrupted = True
            self.on_event("barge-in", self._finish())
        elif playing and self._played is not None:
            self._played.interrupted = True
            self.on_event("barge-in", self._played)
        self._played = None

    def _step(self) -> None:
        for piece in self.pipeline.step():
            if piece.kind == "audio" and piece.stage == self.pipeline.output_stage and not piece.empty:
                self.device.play(piece.data)
            elif piece.kind == "text" and not piece.empty:
                self.on_event("transcript" if piece.stage == "asr" else "reply", str(piece.data))
            elif piece.kind == "error":
                self.on_event("error", str(piece.data))
        if not self.pipeline.busy() and self._current is not None:
            self._played = self._finish()  # generated; it may still be playing
            self.on_event("turn", self._played)

    def _finish(self) -> ChatTurn:
        turn, pipeline_turn = self._current
        self._current = None
        summary = turn_summary(pipeline_turn, turn.index, turn.speech_ms)
        summary.interrupted = turn.interrupted
        summary.skipped = summary.skipped and not turn.interrupted
        self.turns[turn.index] = summary
        return summary


def run_one_turn(pipeline: Pipeline, audio: np.ndarray, sample_rate: int, on_audio=None) -> ChatTurn:
    """Answer one utterance (a file) without a microphone. ``on_audio(chunk)`` gets the reply's
    audio as it streams out (a speaker); all of it is in ``result.pipeline_turn.reply_audio``."""
    piece = Piece(0, "audio", np.asarray(audio, np.float32), last=True, sample_rate=sample_rate, t=time.perf_counter())
    turn = pipeline.start(piece)
    while pipeline.busy():
        for out in pipeline.step():
            if on_audio is not None and out.kind == "audio" and out.stage == pipeline.output_stage and not out.empty:
                on_audio(out.data)
    turn.done = True
    return turn_summary(turn, 0, int(1000 * len(audio) / sample_rate))
