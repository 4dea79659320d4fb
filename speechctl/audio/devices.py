"""The audio device layer of ``speechctl chat`` and ``speechctl tts --stream``: one small interface,
a sound-card implementation (sounddevice/PortAudio) and a queue implementation (files, tests).

An :class:`AudioDevice` has a microphone that the caller polls (``read``) and a speaker that
plays chunks in the background (``play``), can be silenced at once (``stop``: barge-in) and
waited for (``drain``). ``sounddevice`` is imported only when a :class:`SoundDeviceAudio` is made;
no PortAudio library or no sound device is a one-line :class:`AudioDeviceError`.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from speechctl.errors import SpeechctlError


class AudioDeviceError(SpeechctlError):
    """No usable sound device (no PortAudio library, no microphone or speaker)."""


class AudioDevice(ABC):
    """Mono float32 audio in at ``input_rate`` and out at ``output_rate``."""

    input_rate: int
    output_rate: int

    @abstractmethod
    def read(self, wait: bool) -> np.ndarray | None:
        """Microphone samples captured since the last call (maybe none); with ``wait``, block
        until some arrive. ``None``: the input has ended (files and queues; a live mic never
        ends)."""

    @abstractmethod
    def play(self, audio: np.ndarray) -> None:
        """Queue samples for the speaker; returns at once."""

    @abstractmethod
    def stop(self) -> None:
        """Silence the speaker now and drop everything queued."""

    @abstractmethod
    def playing(self) -> bool:
        """Queued audio has not finished playing."""

    @abstractmethod
    def drain(self) -> None:
        """Wait until everything queued has played."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------
# Files, scripts and tests
# ---------------------------------------------------------------------------------------------


def blocks_of(audio: np.ndarray, rate: int, block_ms: int = 20) -> Iterator[np.ndarray]:
    """Cut a waveform into microphone-sized blocks."""
    size = max(1, rate * block_ms // 1000)
    audio = np.asarray(audio, dtype=np.float32)
    for start in range(0, len(audio), size):
        yield audio[start : start + size]


class QueueAudio(AudioDevice):
    """A device with a scripted microphone and a recording speaker, in virtual time.

    The microphone is an iterable of blocks (a list, or a generator that looks at this device to
    decide what to say next, e.g. to speak while a reply plays). Each ``read`` returns the next
    block and advances the speaker's clock by the same duration: playback consumes queued audio
    at the rate the microphone delivers it, with no sleeping. ``played`` holds every chunk given
    to ``play``; ``heard`` counts output samples that were played before a ``stop``/the end;
    ``stops`` and ``dropped`` count barge-ins and the samples they cut off.
    """

    def __init__(self, blocks: Iterable[np.ndarray], input_rate: int, output_rate: int | None = None):
        self.input_rate = int(input_rate)
        self.output_rate = int(output_rate or input_rate)
        self._blocks = iter(blocks)
        self._queue: deque[np.ndarray] = deque()  # not yet played
        self.played: list[np.ndarray] = []
        self.heard = 0
        self.stops = 0
        self.dropped = 0
        self.reads = 0
        self.ended = False

    def read(self, wait: bool) -> np.ndarray | None:
        block = next(self._blocks, None)
        if block is None:
            self.ended = True
            return None
        self.reads += 1
        self._advance(len(block) * self.output_rate // self.input_rate)
        return np.asarray(block, dtype=np.float32)

    def _advance(self, samples: int) -> None:
        while samples > 0 and self._queue:
            head = self._queue[0]
            take = min(samples, len(head))
            self.heard += take
            samples -= take
            if take == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[take:]

    def play(self, audio: np.ndarray) -> None:
        audio = np.asarray(audio, dtype=np.float32)
        if len(audio):
            self.played.append(audio)
            self._queue.append(audio)

    def stop(self) -> None:
        queued = sum(len(a) for a in self._queue)
        if queued:
            self.stops += 1
            self.dropped += queued
        self._queue.clear()

    def playing(self) -> bool:
        return bool(self._queue)

    def queued_samples(self) -> int:
        return sum(len(a) for a in self._queue)

    def drain(self) -> None:
        self._advance(self.queued_samples())


# ---------------------------------------------------------------------------------------------
# The sound card
# ---------------------------------------------------------------------------------------------


def import_sounddevice():
    """``sounddevice``, or a one-line AudioDeviceError saying what is missing."""
    try:
        import sounddevice
    except ImportError:
        raise AudioDeviceError("the sounddevice package is not installed (pip install sounddevice)") from None
    except OSError:  # the package is there, the PortAudio shared library is not
        raise AudioDeviceError("no PortAudio library: install it (Debian/Ubuntu: apt install libportaudio2) or use files (-o FILE, --input/--output)") from None
    return sounddevice


class SoundDeviceAudio(AudioDevice):
    """The default microphone and speaker through PortAudio (``sounddevice`` callbacks).

    The input callback queues blocks of ``block_ms``; the output callback plays queued chunks
    and outputs silence when there is nothing to play.
    """

    def __init__(self, input_rate: int | None, output_rate: int, *, block_ms: int = 20, input_device=None, output_device=None):
        sd = import_sounddevice()
        self.input_rate = int(input_rate or output_rate)
        self.output_rate = int(output_rate)
        self._mic: queue.Queue[np.ndarray] = queue.Queue()
        self._out: deque[np.ndarray] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._streams = []
        try:
            if input_rate is not None:
                self._streams.append(
                    sd.InputStream(
                        samplerate=self.input_rate,
                        channels=1,
                        dtype="float32",
                        blocksize=max(1, self.input_rate * block_ms // 1000),
                        device=input_device,
                        callback=self._on_input,
                    )
                )
            self._streams.append(
                sd.OutputStream(samplerate=self.output_rate, channels=1, dtype="float32", device=output_device, callback=self._on_output)
            )
            for stream in self._streams:
                stream.start()
        except (sd.PortAudioError, ValueError) as e:
            self.close()
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AudioDeviceError(f"no usable sound device: {reason}") from None

    def _on_input(self, indata, frames, time, status) -> None:
        self._mic.put(indata[:, 0].copy())

    def _on_output(self, outdata, frames, time, status) -> None:
        filled = 0
        with self._lock:
            while filled < frames and self._out:
                head = self._out[0]
                take = min(frames - filled, len(head))
                outdata[filled : filled + take, 0] = head[:take]
                filled += take
                if take == len(head):
                    self._out.popleft()
                else:
                    self._out[0] = head[take:]
            if not self._out:
                self._idle.set()
        outdata[filled:, 0] = 0.0

    def read(self, wait: bool) -> np.ndarray | None:
        blocks = []
        if wait:
            while not blocks:
                try:  # short timeouts keep Ctrl-C responsive
                    blocks.append(self._mic.get(timeout=0.1))
                except queue.Empty:
                    pass
        while True:
            try:
                blocks.append(self._mic.get_nowait())
            except queue.Empty:
                break
        return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)

    def play(self, audio: np.ndarray) -> None:
        audio = np.asarray(audio, dtype=np.float32)
        if len(audio):
            with self._lock:
                self._out.append(audio)
                self._idle.clear()

    def stop(self) -> None:
        with self._lock:
            self._out.clear()
            self._idle.set()

    def playing(self) -> bool:
        return not self._idle.is_set()

    def drain(self) -> None:
        import time

        while not self._idle.wait(timeout=0.1):  # wakes up for Ctrl-C
            pass
        if self._streams:  # the last buffer is still in the device
            time.sleep(float(self._streams[-1].latency))

    def close(self) -> None:
        for stream in self._streams:
            try:
                stream.stop()
                stream.close()
            except Exception:  # closing a half-opened stream: nothing left to do
                pass
        self._streams = []
