"""The unified stage: one multi-stream speech LM hears the user's audio and answers in text and audio.

The utterance is encoded by the model's codec and enters the prompt as codec codes
(``MultiStreamPrompts.chat``: ``<bos> <|audio_bos|> <|audio|> <|audio_eos|>``); the model's reply
streams back through :class:`SpeechStreamer`: text pieces as they are generated and audio chunks
of every audio segment as soon as they are decodable.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from speechctl.pipeline.asr import resample
from speechctl.pipeline.stage import Piece, Stage
from speechctl.pipeline.streamer import SpeechStreamer, TextPiece


class UnifiedStage(Stage):
    """Input: audio pieces of an utterance (``last`` on the final one). Output: text pieces and
    audio pieces of the reply; an audio piece with ``last`` ends the turn.

    ``reply_in_audio``: the prompt ends with ``<|audio_bos|>`` so the reply opens with speech
    (otherwise the model chooses); ``max_seconds`` bounds each audio segment and ``max_tokens``
    the text."""

    name = "unified"

    def __init__(self, speech, *, reply_in_audio: bool = False, text_sampling=None, audio_sampling=None, seed: int | None = None, max_tokens: int = 256, max_seconds: float = 10.0, **chunking):
        from speechctl.engine.params import DEFAULT_AUDIO, DEFAULT_TEXT

        super().__init__()
        self.speech = speech
        self.streamer = SpeechStreamer(speech, **chunking)
        self.sample_rate = self.input_rate = speech.sample_rate
        self.reply_in_audio = reply_in_audio
        self.text_sampling = text_sampling or DEFAULT_TEXT
        self.audio_sampling = audio_sampling or DEFAULT_AUDIO
        self.seed, self.max_tokens, self.max_seconds = seed, max_tokens, max_seconds
        self._ids = itertools.count()
        self._audio: dict[int, list[np.ndarray]] = {}
        self._live: tuple[str, int] | None = None  # (request id, turn)

    def working(self) -> bool:
        return self._live is not None

    def step(self) -> list[Piece]:
        from speechctl.jobs import TtsChunk

        out: list[Piece] = []
        while self.inbox:
            piece = self.inbox.popleft()
            parts = self._audio.setdefault(piece.turn, [])
            if not piece.empty:
                parts.append(resample(piece.data, piece.sample_rate, self.sample_rate))
            if piece.last:
                audio = np.concatenate(self._audio.pop(piece.turn)) if parts else np.zeros(0, np.float32)
                if len(audio) == 0:
                    out.append(self.emit(piece.turn, "audio", audio, last=True, sample_rate=self.sample_rate))
                else:
                    self._start(piece.turn, audio)
        if self._live is None:
            return out
        id, turn = self._live
        for event in self.streamer.step():
            if isinstance(event, TextPiece):
                out.append(self.emit(turn, "text", event.text))
            elif isinstance(event, TtsChunk):
                if event.error:
                    out.append(self.emit(turn, "error", event.error))
                out.append(self.emit(turn, "audio", event.audio, last=event.last, sample_rate=self.sample_rate))
                if event.last:
                    self._live = None
        return out

    def _start(self, turn: int, audio: np.ndarray) -> None:
        self.streamer.cancel()
        (codes,) = self.speech.codec.encode([audio])
        frames = max(1, math.ceil(self.max_seconds * self.speech.codec.frame_rate))
        request = self.speech.prompts.chat(
            codes,
            reply_in_audio=self.reply_in_audio,
            text_sampling=self.text_sampling,
            audio_sampling=self.audio_sampling,
            seed=self.seed,
            # text tokens, plus room for one whole audio segment with its flush steps
            max_tokens=self.max_tokens + frames + self.speech.engine.spec.pattern.max_delay + 2,
            max_frames=frames,
        )
        id = f"u{next(self._ids)}"
        self.streamer.submit_request(id, request)
        self._live = (id, turn)

    def cancel(self) -> None:
        super().cancel()
        self.streamer.cancel()
        self._audio.clear()
        self._live = None
