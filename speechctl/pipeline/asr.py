"""The ASR stage: a whole utterance in, its transcript out (Whisper via ``speechctl.api.load_asr``).

Whisper reads an utterance at once (it is short: the chat loop cuts utterances at pauses), so this
stage makes one piece per turn: the transcript, marked ``last``. It runs in one ``step`` (about a
second on CPU for tiny.en, a few tens of milliseconds on a GPU).
"""

from __future__ import annotations

import numpy as np

from speechctl.pipeline.stage import Piece, Stage


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return np.asarray(audio, dtype=np.float32)
    import soxr

    return soxr.resample(np.asarray(audio, dtype=np.float32), rate, target, quality="HQ").astype(np.float32)


class AsrStage(Stage):
    """Input: audio pieces of an utterance (``last`` on the final one). Output: one text piece."""

    name = "asr"

    def __init__(self, asr):
        super().__init__()
        self.asr = asr  # WhisperAsr, or a Speech for speech-LM ASR: .sample_rate, .run(jobs)
        self.input_rate = asr.sample_rate
        self._audio: dict[int, list[np.ndarray]] = {}

    def working(self) -> bool:
        return False  # everything happens inside one step

    def step(self) -> list[Piece]:
        from speechctl.jobs import AsrJob

        out = []
        while self.inbox:
            piece = self.inbox.popleft()
            parts = self._audio.setdefault(piece.turn, [])
            if not piece.empty:
                parts.append(resample(piece.data, piece.sample_rate, self.asr.sample_rate))
            if not piece.last:
                continue
            audio = np.concatenate(self._audio.pop(piece.turn)) if parts else np.zeros(0, np.float32)
            if len(audio) == 0:
                out.append(self.emit(piece.turn, "text", "", last=True))
                continue
            (result,) = self.asr.run([AsrJob(id=f"turn{piece.turn}", audio=audio)])
            if result.error:
                out.append(self.emit(piece.turn, "error", result.error))
                out.append(self.emit(piece.turn, "text", "", last=True))
            else:
                out.append(self.emit(piece.turn, "text", result.text or "", last=True))
        return out

    def cancel(self) -> None:
        super().cancel()
        self._audio.clear()
