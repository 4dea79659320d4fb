"""espeak-ng through its library, one fork per sentence: the CLI's bytes, fast, with word timings.

``espeak-ng -v V -s S -p P --stdout`` spends most of a short sentence's time starting: loading its
shared libraries and its data (~10 ms of ~14 here). A server process (``python -m
recipes.voice.espeak_lib``, importing nothing heavy) does that once, as the CLI's ``main`` does
(``espeak_ng_Initialize``, synchronous output, the voice, then rate and pitch), and forks for each
sentence: the child synthesizes it as the CLI's first (only) line (``espeak_Synth`` of a 1000-byte
buffer, ``espeakCHARS_AUTO | espeakPHONEMES | espeakENDPAUSE``) and exits, so no sentence sees
another's state (the library keeps some between calls: an earlier in-process try matched the CLI
on a process's first sentence only). The samples are the CLI's, byte for byte (tested).

The library also reports where each word starts (``espeakEVENT_WORD``: the word's first character,
its length, its first sample), which the CLI does not print: the LM can be taught where in its text
each frame is (``lm_train.align_weight``).

After the speech, the child also writes the sentence's phonemes (``speechctl.phonemes``: what a
voice that reads phonemes reads), from the same library.

Protocol on the server's stdin/stdout: request ``<I`` text length + UTF-8 text; reply ``<iiiii``
(status, sample rate, samples, words, phoneme bytes), the int16 samples, ``words`` x ``<iii``
(character start, length, first sample), then the phonemes (ASCII).
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import warnings

from speechctl.phonemes import load_library, phonemes_with

_EVENT_WORD, _EVENT_END_OF_LIST = 1, 0
_SYNCHRONOUS = 0x0001  # ENOUTPUT_MODE_SYNCHRONOUS
_RATE, _PITCH = 1, 3  # espeakRATE, espeakPITCH
_POS_CHARACTER = 1
_FLAGS = 0x0000 | 0x0100 | 0x1000  # espeakCHARS_AUTO | espeakPHONEMES | espeakENDPAUSE (the CLI's)
_BUFFER = 1000  # the CLI reads stdin line by line into 1000 bytes and passes all of them


class EspeakError(RuntimeError):
    pass


class _Event(ctypes.Structure):  # espeak_EVENT (speak_lib.h)
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_int64)]


# -- the client -----------------------------------------------------------------------------------


class Synthesizer:
    """A server process speaking with fixed settings; ``synthesize(text)`` -> (int16 samples, rate,
    [n, 3] int32 words: character start, length, first sample, phonemes)."""

    def __init__(self, voice: str, words_per_minute: int, pitch: int, data: str | os.PathLike | None = None):
        command = [sys.executable, "-m", "recipes.voice.espeak_lib", voice, str(words_per_minute), str(pitch)]
        if data:
            command.append(str(data))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def synthesize(self, text: str):
        import numpy as np  # (not at the top: the server imports this module and forks; numpy would slow each fork)

        data = text.encode()
        if len(data) >= _BUFFER:
            raise EspeakError(f"{len(data)} bytes: the CLI would split this text into lines of {_BUFFER - 1}")
        self._proc.stdin.write(struct.pack("<I", len(data)) + data)
        self._proc.stdin.flush()
        status, rate, samples, words, phonemes = struct.unpack("<iiiii", self._read(20))
        if status != 0:
            raise EspeakError(f"espeak-ng failed on {text!r} (status {status})")
        pcm = np.frombuffer(self._read(2 * samples), dtype="<i2").copy()
        table = np.frombuffer(self._read(12 * words), dtype="<i4").reshape(words, 3).copy()
        return pcm, rate, table, self._read(phonemes).decode("ascii")

    def _read(self, n: int) -> bytes:
        out = self._proc.stdout.read(n)
        if len(out) != n:
            raise EspeakError(f"the espeak-ng server ended (exit {self._proc.poll()}): is libespeak-ng.so.1 loadable?")
        return out

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait()


# -- the server -----------------------------------------------------------------------------------


def _serve(voice: str, words_per_minute: int, pitch: int, data: str | None) -> None:
    lib = load_library()
    samples, words = [], []
    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                     ctypes.POINTER(_Event))

    @callback_type
    def callback(wav, n, events):
        i = 0
        while events[i].type != _EVENT_END_OF_LIST:
            e = events[i]
            if e.type == _EVENT_WORD:  # text_position counts characters from 1
                words.append((e.text_position - 1, e.length, e.sample))
            i += 1
        if wav and n > 0:
            samples.append(ctypes.string_at(wav, 2 * n))
        return 0

    # As the CLI's main does, in its order.
    lib.espeak_ng_InitializePath(data.encode() if data else None)
    context = ctypes.c_void_p()
    if lib.espeak_ng_Initialize(ctypes.byref(context)) != 0 or lib.espeak_ng_InitializeOutput(_SYNCHRONOUS, 0, None) != 0:
        sys.exit("espeak-ng: initialization failed")
    rate = lib.espeak_ng_GetSampleRate()
    lib.espeak_SetSynthCallback(callback)
    if lib.espeak_SetVoiceByName(voice.encode()) != 0:
        sys.exit(f"espeak-ng: no voice {voice}")
    lib.espeak_SetParameter(_RATE, words_per_minute, 0)
    lib.espeak_SetParameter(_PITCH, pitch, 0)
    lib.espeak_SetPhonemeTrace(0, None)

    # espeak_ng_Initialize starts the library's event thread (here as in the CLI), so Python
    # 3.12 warns at every fork that the process is multi-threaded. That thread only serves
    # asynchronous output, which this process never asks for: it waits on its condition variable
    # (holding no lock) for the whole run, and the child, which synthesizes synchronously, never
    # needs it. The warning would be one log line per worker, every data stage.
    warnings.filterwarnings("ignore", message=r"This process \(pid=\d+\) is multi-threaded", category=DeprecationWarning)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        text = stdin.read(struct.unpack("<I", head)[0])
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one sentence, then gone
            os.close(read_end)
            buffer = ctypes.create_string_buffer(text, _BUFFER)
            status = lib.espeak_Synth(buffer, _BUFFER, 0, _POS_CHARACTER, 0, _FLAGS, None, None)
            status = status or lib.espeak_Synchronize()
            pcm = b"".join(samples)
            names = phonemes_with(lib, text.decode("utf-8", "replace")).encode("ascii", "replace") if status == 0 else b""
            reply = [struct.pack("<iiiii", status, rate, len(pcm) // 2, len(words), len(names)), pcm]
            reply += [struct.pack("<iii", *w) for w in words] + [names]
            view = memoryview(b"".join(reply))
            while view:
                view = view[os.write(write_end, view):]
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as f:
            reply = f.read()
        _, code = os.waitpid(pid, 0)
        if code != 0 or len(reply) < 20:
            reply = struct.pack("<iiiii", code or -1, rate, 0, 0, 0)
        stdout.write(reply)
        stdout.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
