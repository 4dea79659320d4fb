"""User-facing errors: one line that names the item and what is wrong."""


class SpeechctlError(Exception):
    """An error the user can act on. The CLI prints it as one line, never a traceback."""


class InputError(SpeechctlError):
    """Bad input: a missing or unreadable file, empty text, unsupported audio, a bad manifest line."""


class ModelError(SpeechctlError):
    """An unknown model name or a checkpoint directory speechctl cannot load."""


class EngineError(SpeechctlError):
    """The engine failed a request (for example an invariant of multi-stream decoding broke)."""
