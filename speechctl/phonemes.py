"""espeak-ng's phonemes of a text: what a voice that reads phonemes instead of letters reads.

    h@l'oU , w'3:ld .          <- "Hello, world."

espeak-ng's own ASCII phoneme names (``espeak-ng -x``), one word per space, stress marks before
the stressed syllable; after each clause, as a word of its own, the text's punctuation that ended
it (espeak-ng speaks a comma, a full stop and a question differently, and its phoneme output
drops them; inside a word the same characters are phoneme marks: ``:`` long, ``,`` secondary
stress, ``?`` a glottal stop, ``;`` palatal). Read through libespeak-ng
(``espeak_TextToPhonemes``), so the recipe that trains such a voice on espeak-ng's speech and the
engine that runs it phonemize alike. Imports nothing heavy (ctypes): the recipe's synthesis
server imports it and forks for every sentence.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading

from speechctl.errors import ModelError

READS = ("text", "phonemes")  # what a multi-stream voice reads of a text (config.json: speechctl.text_input)
_CLAUSE_ENDS = ",.?!:;"
_SYNCHRONOUS = 0x0001  # ENOUTPUT_MODE_SYNCHRONOUS: no audio device


def load_library() -> ctypes.CDLL:
    """libespeak-ng (Debian's ``libespeak-ng1``), its phoneme call declared (once per load)."""
    lib = ctypes.CDLL("libespeak-ng.so.1")
    lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
    lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
    return lib


MISSING = "this voice reads espeak-ng's phonemes: install espeak-ng (Debian/Ubuntu: apt-get install espeak-ng)"


def missing() -> str | None:
    """Why this process cannot phonemize (``MISSING``: libespeak-ng is not installed); None when
    it can (the library loads)."""
    try:
        load_library()
    except OSError:
        return MISSING
    return None


def phonemes_with(lib, text: str) -> str:
    """The phonemes of ``text`` by ``lib`` (``load_library``'s, initialized, its voice set)."""
    data = text.encode()
    buffer = ctypes.create_string_buffer(data)
    base = ctypes.addressof(buffer)
    pointer = ctypes.c_void_p(base)
    clauses = []
    while pointer.value:
        start = pointer.value - base
        names = (lib.espeak_TextToPhonemes(ctypes.byref(pointer), 0, 0) or b"").decode("ascii", "replace").strip()
        # The pointer stops just past the next clause's first character (NULL after the last
        # clause): the clause's punctuation is the last one before the spaces ahead of it.
        last = not pointer.value
        segment = data[start: len(data) if last else pointer.value - base].decode("utf-8", "replace")
        found = re.search(r"([,.?!:;])[\"')\]]*\s*$" if last else r"([,.?!:;])[\"')\]]*\s+\S{0,3}$", segment)
        end = found.group(1) if found else ""
        if names:
            clauses.append(f"{names} {end}" if end else names)
    return " ".join(clauses)


def word_spans(phonemes: str) -> list[tuple[int, int]]:
    """(start, length) of each word of ``phonemes`` (the clauses' punctuation left out)."""
    spans, position = [], 0
    for word in phonemes.split(" "):
        if word and word not in _CLAUSE_ENDS:
            spans.append((position, len(word)))
        position += len(word) + 1
    return spans


_LIBRARY = {}  # the process's libespeak-ng, initialized once: {"lib": ..., "voice": ...}
_LOCK = threading.Lock()  # the library is not re-entrant: one caller at a time


def phonemize(text: str, voice: str = "en-us") -> str:
    """The phonemes of ``text`` in espeak-ng's ``voice``, by this process's libespeak-ng (Debian's
    ``libespeak-ng1``; ``ESPEAK_NG_DATA`` where its data is elsewhere)."""
    with _LOCK:
        if not _LIBRARY:
            try:
                lib = load_library()
            except OSError as e:
                raise ModelError(MISSING) from e
            data = os.environ.get("ESPEAK_NG_DATA")
            lib.espeak_ng_InitializePath(data.encode() if data else None)
            context = ctypes.c_void_p()
            if lib.espeak_ng_Initialize(ctypes.byref(context)) != 0 or lib.espeak_ng_InitializeOutput(_SYNCHRONOUS, 0, None) != 0:
                raise ModelError("espeak-ng: its library did not initialize (is its data installed?)")
            _LIBRARY.update(lib=lib, voice=None)
        if _LIBRARY["voice"] != voice:
            if _LIBRARY["lib"].espeak_SetVoiceByName(voice.encode()) != 0:
                raise ModelError(f"espeak-ng has no voice {voice!r}")
            _LIBRARY["voice"] = voice
        return phonemes_with(_LIBRARY["lib"], text)
