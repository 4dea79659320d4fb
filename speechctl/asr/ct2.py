"""Read a CTranslate2 ``model.bin`` into numpy arrays, without depending on ctranslate2.

The binary layout (format version 6, written by ``ctranslate2/specs/model_spec.py``
``ModelSpec._serialize``), all integers little-endian::

    u32 version | str spec_name | u32 spec_revision | u32 n_variables
    n_variables x { str name | u8 ndim | ndim x u32 dim | u8 dtype | u32 nbytes | nbytes of data }
    u32 n_aliases | n_aliases x { str alias | str target }

where ``str`` is a u16 length (counting a trailing NUL), the UTF-8 bytes and the NUL. dtype ids:
0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. Scalars (``ndim`` 0) hold settings
such as ``encoder/num_heads``. An alias (for example ``decoder/projection/weight`` ->
``decoder/embeddings/weight``, a tied output projection) names a variable stored once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechctl.errors import ModelError

SUPPORTED_VERSION = 6
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


@dataclass
class Ct2Model:
    """The contents of a model.bin: ``variables`` name -> array (weights keep their stored
    dtype; bfloat16 becomes float32), ``aliases`` alias -> target name."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]

    def get(self, name: str) -> np.ndarray:
        """A variable by name, following an alias."""
        return self.variables[self.aliases.get(name, name)]

    def scalar(self, name: str) -> int:
        return int(self.get(name).reshape(()))


class _Reader:
    def __init__(self, data: bytes, name: str):
        self.data, self.pos, self.name = data, 0, name

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise ModelError(f"{self.name}: truncated CTranslate2 file (at byte {self.pos})")
        view = memoryview(self.data)[self.pos : self.pos + n]
        self.pos += n
        return view

    def u(self, fmt: str) -> int:
        (value,) = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))
        return value

    def string(self) -> str:
        raw = bytes(self.take(self.u("H")))
        if not raw.endswith(b"\0"):
            raise ModelError(f"{self.name}: corrupt CTranslate2 string at byte {self.pos}")
        return raw[:-1].decode("utf-8")


def read_ct2(path: str | Path) -> Ct2Model:
    """Parse ``path`` (a CTranslate2 model.bin). ModelError if it is not a version-6 file or is
    truncated."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror or e}") from None
    r = _Reader(data, str(path))
    version = r.u("I")
    if version != SUPPORTED_VERSION:
        raise ModelError(f"{path}: CTranslate2 format version {version}, expected {SUPPORTED_VERSION}")
    spec, revision = r.string(), r.u("I")
    variables = {}
    for _ in range(r.u("I")):
        name = r.string()
        shape = tuple(r.u("I") for _ in range(r.u("B")))
        dtype_id, nbytes = r.u("B"), r.u("I")
        if dtype_id not in _DTYPES:
            raise ModelError(f"{path}: variable {name}: unknown dtype id {dtype_id}")
        variables[name] = _array(r.take(nbytes), _DTYPES[dtype_id], shape, f"{path}: {name}")
    aliases = {}
    for _ in range(r.u("I")):
        alias = r.string()
        aliases[alias] = r.string()
    if r.pos != len(data):
        raise ModelError(f"{path}: {len(data) - r.pos} unexpected bytes after the aliases")
    missing = [a for a, target in aliases.items() if target not in variables]
    if missing:
        raise ModelError(f"{path}: aliases to missing variables: {missing}")
    return Ct2Model(spec, revision, variables, aliases)


def _array(raw: memoryview, dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
    if dtype == "bfloat16":  # the top half of a float32
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        flat = bits.view(np.float32)
    else:
        flat = np.frombuffer(raw, dtype=dtype)
    if flat.size != int(np.prod(shape, dtype=np.int64)):
        raise ModelError(f"{where}: {flat.size} values for shape {list(shape)}")
    return flat.reshape(shape)
