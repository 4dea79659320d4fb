"""Where streamed audio goes as it arrives: stdout (wav or raw PCM), a file, or the speaker.

A wav stream on stdout starts with a header whose sizes say "unknown" (0xFFFFFFFF, as streaming
tools write it; libsndfile, sox, ffmpeg and aplay read such a stream to its end) and continues
with 16-bit PCM per chunk, flushed at once. When stdout turns out to be a seekable file (``> a.wav``)
the sizes are fixed at the end. ``--raw`` drops the header (s16le mono at the model's rate).
"""

from __future__ import annotations

import struct
import sys
import time
from typing import BinaryIO

import numpy as np

from speechctl.errors import InputError

UNKNOWN = 0xFFFFFFFF


def wav_header(rate: int, data_bytes: int = UNKNOWN) -> bytes:
    """A 44-byte PCM16 mono wav header; ``data_bytes`` UNKNOWN for a stream of unknown length."""
    riff = UNKNOWN if data_bytes == UNKNOWN else 36 + data_bytes
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + fmt + b"data" + struct.pack("<I", data_bytes)


def pcm16(audio: np.ndarray) -> bytes:
    """Little-endian 16-bit PCM, converted like libsndfile (``write_audio``): floor(x * 32768),
    clipped, so a stream and a file of the same samples hold the same integers."""
    samples = np.nan_to_num(np.asarray(audio, np.float64))
    return np.clip(np.floor(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()


class Sink:
    """Takes float32 chunks in order. ``first_audio`` is the perf_counter time of the first one."""

    def __init__(self):
        self.samples = 0
        self.first_audio: float | None = None

    def write(self, audio: np.ndarray) -> None:
        if len(audio) and self.first_audio is None:
            self.first_audio = time.perf_counter()
        self.samples += len(audio)
        self._write(audio)

    def _write(self, audio: np.ndarray) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PcmStreamSink(Sink):
    """Wav (or raw PCM16) to a binary stream, flushed per chunk."""

    def __init__(self, stream: BinaryIO, rate: int, raw: bool = False, name: str = "stdout"):
        super().__init__()
        self.stream, self.rate, self.raw, self.name = stream, rate, raw, name
        if not raw:
            self._put(wav_header(rate))

    def _put(self, data: bytes) -> None:
        try:
            self.stream.write(data)
            self.stream.flush()
        except BrokenPipeError:
            raise InputError(f"{self.name}: cannot write: the reading end was closed") from None

    def _write(self, audio: np.ndarray) -> None:
        self._put(pcm16(audio))

    def close(self) -> None:
        if self.raw:
            return
        try:  # a seekable stream (stdout redirected to a file): write the real sizes
            end = self.stream.tell()
            self.stream.seek(0)
            self.stream.write(wav_header(self.rate, self.samples * 2))
            self.stream.seek(end)
            self.stream.flush()
        except (OSError, ValueError):
            pass


class FileSink(Sink):
    """A wav/flac file written as chunks arrive (soundfile fixes the header when it closes)."""

    def __init__(self, path: str, rate: int, fmt: str):
        import soundfile as sf

        super().__init__()
        try:
            self.file = sf.SoundFile(path, "w", samplerate=rate, channels=1, format=fmt.upper(), subtype="PCM_16")
        except (sf.SoundFileError, RuntimeError, OSError) as e:
            raise InputError(f"{path}: cannot write: {str(e).splitlines()[0]}") from None

    def _write(self, audio: np.ndarray) -> None:
        self.file.write(np.clip(np.nan_to_num(np.asarray(audio, np.float32)), -1.0, 1.0))

    def close(self) -> None:
        self.file.close()


class SpeakerSink(Sink):
    """The default speaker (sounddevice); ``close`` waits until everything has played."""

    def __init__(self, rate: int):
        from speechctl.audio.devices import SoundDeviceAudio

        super().__init__()
        self.device = SoundDeviceAudio(None, rate)

    def _write(self, audio: np.ndarray) -> None:
        self.device.play(audio)

    def close(self) -> None:
        try:
            self.device.drain()
        finally:
            self.device.close()

    def abort(self) -> None:
        self.device.stop()
        self.device.close()


def open_sink(output: str | None, rate: int, fmt: str = "wav", raw: bool = False) -> Sink:
    """``None``: the speaker; ``"-"``: stdout (wav, or raw PCM16); else a file of ``fmt``."""
    if output is None:
        return SpeakerSink(rate)
    if output == "-":
        if fmt != "wav" and not raw:
            raise InputError("stdout: a stream can be wav or raw PCM (--raw), not " + fmt)
        return PcmStreamSink(sys.stdout.buffer, rate, raw=raw)
    return FileSink(output, rate, fmt)
