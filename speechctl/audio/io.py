"""Audio file I/O: read any soundfile-supported audio as float32 mono, write wav/flac atomically.

Every problem the user can fix (a missing file, a directory, non-audio data, empty or NaN audio,
an unwritable output, an unknown format) raises :class:`speechctl.errors.InputError` with one line
that names the file. ``"-"`` stands for stdin (reading) or stdout (writing).
"""

from __future__ import annotations

import functools
import io
import json
import os
import secrets
import sys
from os import PathLike
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import soundfile as sf

from speechctl.errors import InputError


STDIO = "-"
STDIN_NAME = "stdin"
STDOUT_NAME = "stdout"
AUDIO_FORMATS = ("wav", "flac")
DEFAULT_AUDIO_FORMAT = "wav"
_SOUNDFILE_FORMAT = {"wav": "WAV", "flac": "FLAC"}
_PCM_SUBTYPE = "PCM_16"
_RESAMPLE_QUALITY = "HQ"
_MAX_REASON_CHARS = 120
_FLAC_HEADER_BYTES = 26  # "fLaC" + metadata block header + STREAMINFO up to the total-samples field


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_audio(path_or_dash: str | PathLike, target_rate: int) -> np.ndarray:
    """Read an audio file (or stdin for ``"-"``) as a float32 mono waveform at ``target_rate``.

    Multi-channel audio is averaged to mono; other sample rates are resampled with soxr (HQ).
    Raises InputError for a missing file, a directory, non-audio data, empty audio or NaN/inf
    samples.
    """
    if str(path_or_dash) == STDIO:
        return read_audio_bytes(sys.stdin.buffer.read(), target_rate, STDIN_NAME)
    path = Path(path_or_dash)
    name = str(path_or_dash)
    if not path.exists():
        raise InputError(f"{name}: no such file")
    if path.is_dir():
        raise InputError(f"{name}: is a directory, not an audio file")
    try:
        with open(path, "rb") as f:
            return _decode(f, target_rate, name)
    except OSError as e:
        raise InputError(f"{name}: cannot read: {_os_reason(e)}") from e


def read_audio_bytes(data: bytes, target_rate: int, name: str) -> np.ndarray:
    """Decode in-memory audio ``data`` like :func:`read_audio`; ``name`` is used in errors."""
    return _decode(io.BytesIO(data), target_rate, name)


def _decode(f: BinaryIO, target_rate: int, name: str) -> np.ndarray:
    """Decode the seekable binary file ``f`` to float32 mono at ``target_rate``."""
    _check_rate(target_rate)
    head = f.read(_FLAC_HEADER_BYTES)
    if not head:
        raise InputError(f"{name}: empty file (0 bytes), not an audio file")
    if _is_empty_flac(head):
        raise InputError(f"{name}: contains no audio (0 samples)")
    f.seek(0)
    try:
        samples, rate = sf.read(f, dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError) as e:
        raise InputError(f"{name}: not a supported audio file ({_soundfile_reason(e)})") from e
    if samples.shape[0] == 0:
        raise InputError(f"{name}: contains no audio (0 samples)")
    if not np.isfinite(samples).all():
        raise InputError(f"{name}: contains NaN or infinite samples")
    return _to_mono_rate(samples, rate, target_rate)


def _to_mono_rate(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """Average (frames, channels) ``samples`` to mono; resample ``rate`` -> ``target_rate``."""
    mono = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
    if rate != target_rate:
        import soxr  # only needed when resampling

        mono = soxr.resample(mono, rate, target_rate, quality=_RESAMPLE_QUALITY)
    return np.ascontiguousarray(mono, dtype=np.float32)


def _is_empty_flac(head: bytes) -> bool:
    """True for a FLAC stream whose STREAMINFO declares 0 samples (libsndfile cannot read it)."""
    if len(head) < _FLAC_HEADER_BYTES or not head.startswith(b"fLaC") or head[4] & 0x7F != 0:
        return False
    return int.from_bytes(head[18:26], "big") & ((1 << 36) - 1) == 0


def _soundfile_reason(e: Exception) -> str:
    """soundfile's reason for failing, shortened to one line (no 'Error opening <object>:')."""
    reason = getattr(e, "error_string", None) or str(e)
    lines = [line.strip() for line in str(reason).splitlines() if line.strip()]
    reason = (lines[0] if lines else type(e).__name__).rstrip(".")
    if len(reason) > _MAX_REASON_CHARS:
        reason = reason[: _MAX_REASON_CHARS - 3] + "..."
    return reason


def _os_reason(e: OSError) -> str:
    """The short reason of an OSError ('Permission denied'), without errno and path."""
    return e.strerror or str(e)


def _check_rate(rate: int) -> None:
    """Reject a non-positive sample rate (a programming error, not a user one)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise ValueError(f"sample rate must be a positive int, got {rate!r}")


def duration_seconds(waveform: np.ndarray, rate: int) -> float:
    """Duration in seconds of a mono ``waveform`` (or (frames, channels) array) at ``rate``."""
    _check_rate(rate)
    return len(waveform) / rate


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_audio(
    path_or_dash: str | PathLike, waveform: np.ndarray, sample_rate: int, fmt: str | None = None
) -> None:
    """Write ``waveform`` (float, mono or (frames, channels)) as 16-bit PCM wav or flac.

    The format is ``fmt`` if given, else the file extension (``.wav``/``.flac``); ``"-"`` writes
    to stdout (default wav). Files are written atomically (temp file + rename). Samples are
    clipped to [-1, 1]; NaN becomes 0. An empty waveform still makes a valid (empty) file.
    """
    _check_rate(sample_rate)
    fmt = resolve_audio_format(path_or_dash, fmt)
    samples = _prepare_samples(waveform)
    encode = functools.partial(_encode, samples=samples, rate=sample_rate, fmt=fmt)
    if str(path_or_dash) == STDIO:
        buf = io.BytesIO()
        encode(buf)
        _write_stdout(buf.getvalue())
    else:
        atomic_write(path_or_dash, encode)


def resolve_audio_format(path_or_dash: str | PathLike, fmt: str | None = None) -> str:
    """The audio format ("wav" or "flac") for writing to ``path_or_dash``; InputError if none fits.

    An explicit ``fmt`` wins, but an output whose extension names the other format is refused.
    """
    name = str(path_or_dash)
    ext = "" if name == STDIO else Path(name).suffix.lower().lstrip(".")
    if fmt is not None:
        fmt = fmt.lower()
        if fmt not in AUDIO_FORMATS:
            raise InputError(f"{name}: unsupported audio format {fmt!r} (use wav or flac)")
        if ext in AUDIO_FORMATS and ext != fmt:
            raise InputError(f"{name}: extension .{ext} does not match format {fmt!r}")
        return fmt
    if name == STDIO:
        return DEFAULT_AUDIO_FORMAT
    if ext not in AUDIO_FORMATS:
        shown = f".{ext}" if ext else "no extension"
        raise InputError(f"{name}: unsupported output extension ({shown}); use .wav or .flac")
    return ext


def _prepare_samples(waveform: np.ndarray) -> np.ndarray:
    """float32 copy of ``waveform`` with NaN -> 0 and values clipped to [-1, 1]."""
    samples = np.asarray(waveform, dtype=np.float32)
    if samples.ndim not in (1, 2):
        raise ValueError(f"waveform must be 1-D or (frames, channels), got shape {samples.shape}")
    samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(samples, -1.0, 1.0)


def _encode(f: BinaryIO, samples: np.ndarray, rate: int, fmt: str) -> None:
    """Encode ``samples`` as 16-bit PCM ``fmt`` into the seekable binary file ``f``."""
    if fmt == "flac" and samples.shape[0] == 0:
        channels = samples.shape[1] if samples.ndim == 2 else 1
        f.write(_empty_flac(rate, channels))
        return
    sf.write(f, samples, rate, format=_SOUNDFILE_FORMAT[fmt], subtype=_PCM_SUBTYPE)


def _empty_flac(rate: int, channels: int, bits_per_sample: int = 16) -> bytes:
    """A valid FLAC stream with no audio frames (libsndfile writes 0 bytes for empty input)."""
    packed = (rate << 44) | ((channels - 1) << 41) | ((bits_per_sample - 1) << 36)  # 0 samples
    streaminfo = (
        (4096).to_bytes(2, "big") * 2  # min/max block size
        + bytes(6)  # min/max frame size: unknown
        + packed.to_bytes(8, "big")
        + bytes(16)  # MD5 of no audio: unset
    )
    return b"fLaC" + bytes([0x80]) + len(streaminfo).to_bytes(3, "big") + streaminfo


def _write_stdout(data: bytes) -> None:
    """Write ``data`` to binary stdout and flush."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError as e:
        raise InputError(f"{STDOUT_NAME}: cannot write: the reading end was closed") from e


# --------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------


def atomic_write(path: str | PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """Atomically create or replace ``path`` with what ``write(f)`` writes to a binary file.

    ``write`` fills a temp file in the same directory, which is fsynced and renamed over
    ``path`` (``os.replace``). On any failure the temp file is removed and ``path`` keeps its
    old content (or still does not exist). OS errors become one-line InputErrors.
    """
    target = Path(path)
    try:
        fd, tmp = _create_temp(target)
    except OSError as e:
        raise InputError(f"{path}: cannot write: {_describe_write_error(target, e)}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        _remove_quietly(tmp)
        if isinstance(e, OSError):
            raise InputError(f"{path}: cannot write: {_describe_write_error(target, e)}") from e
        raise
    _fsync_dir(target.parent)


def check_writable(path: str | PathLike) -> None:
    """Fail now, with the one-line error ``atomic_write`` would give, if ``path`` cannot be
    written (a missing directory, no permission): before a model loads and generates for
    nothing. ``-`` (stdout) always passes."""
    if str(path) == STDIO:
        return
    target = Path(path)
    try:
        fd, tmp = _create_temp(target)
    except OSError as e:
        raise InputError(f"{path}: cannot write: {_describe_write_error(target, e)}") from e
    os.close(fd)
    _remove_quietly(tmp)


def write_text_atomic(path: str | PathLike, text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``path``."""
    data = text.encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


def write_npy_atomic(path: str | PathLike, array: np.ndarray) -> None:
    """``array`` as a ``.npy`` file (numpy's own format), written atomically."""
    atomic_write(path, lambda f: np.save(f, np.asarray(array), allow_pickle=False))


def write_json_atomic(path: str | PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented UTF-8 JSON (with a final newline) to ``path``."""
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def _create_temp(target: Path) -> tuple[int, Path]:
    """Create a fresh hidden temp file next to ``target``; return (fd, path).

    ``os.open`` with mode 0o666 lets the umask decide the permissions, like a normal create
    (``tempfile.mkstemp`` would make the final file 0600).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temp file next to {target}")


def _describe_write_error(target: Path, e: OSError) -> str:
    """A short reason for a failed write, naming a missing output directory plainly."""
    if isinstance(e, FileNotFoundError) and not target.parent.exists():
        return f"directory {str(target.parent)!r} does not exist"
    if isinstance(e, IsADirectoryError) or target.is_dir():
        return "is a directory"
    return _os_reason(e)


def _remove_quietly(path: Path) -> None:
    """Remove ``path`` if it exists, ignoring errors (cleanup after a failure)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(directory: Path) -> None:
    """Best effort: fsync ``directory`` so a completed rename survives a power loss."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
