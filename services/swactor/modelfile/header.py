"""A GGUF header parsed from a byte prefix of the file (no file, no memory map).

Model distribution judges a model and plans byte ranges from the header alone, which for a remote
file is all it has: `parse_header(prefix)` either returns the header or raises `NeedMoreBytes`
saying how long a prefix to try next (`read_header` drives that loop over any range reader).
Values come out as plain Python values (lists for arrays), as `GGUFReader.fields[k].contents()`
gives them. It is the project's one GGUF header parser: the orchestrator judges and plans from it,
stage hosts fetch by it, the compute core memory-maps tensors at the offsets it gives.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
FIRST_READ = 1 << 20
MAX_HEADER_BYTES = 1 << 30  # no real tokenizer comes near this; a bigger "header" is a malformed file


class GgufFormatError(ValueError):
    """The bytes are not a GGUF header this parser reads; the message says where."""


class NeedMoreBytes(Exception):
    def __init__(self, at_least: int) -> None:
        super().__init__(f"the header needs at least {at_least} bytes")
        self.at_least = at_least


@dataclass(frozen=True)
class TensorInfo:
    name: str
    # GGUF order (ne0 first), as in the file.
    dims: tuple[int, ...]
    qtype: int
    # Relative to the data section.
    offset: int
    # -1 when the type is not a GGML type gguf knows (the judge refuses such a file).
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type id {self.qtype}"


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    # Where the data section starts: the header (with its padding) is [0, data_offset).
    data_offset: int

    def tensor_map(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")


class _Cursor:
    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise NeedMoreBytes(end)
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise NeedMoreBytes(self.pos + size)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self, what: str) -> str:
        n = self.unpack("<Q")
        if n > MAX_HEADER_BYTES:
            raise GgufFormatError(f"{what}: string length {n} at byte {self.pos - 8} is not plausible")
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError:
            raise GgufFormatError(f"{what}: string at byte {self.pos - n} is not UTF-8") from None

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row: a tokenizer's vocabulary and merges, the bulk of a header (150k-entry ones), so
        one tight loop instead of a `string` call each (6x quicker on SmolLM2's header)."""
        buf, pos, end_of_buf = self.buf, self.pos, len(self.buf)
        unpack_length = _LENGTH.unpack_from
        out = []
        try:
            for _ in range(count):
                if pos + 8 > end_of_buf:
                    raise NeedMoreBytes(pos + 8)
                (n,) = unpack_length(buf, pos)
                if n > MAX_HEADER_BYTES:
                    raise GgufFormatError(f"{what}: string length {n} at byte {pos} is not plausible")
                pos += 8
                if pos + n > end_of_buf:
                    raise NeedMoreBytes(pos + n)
                out.append(str(buf[pos:pos + n], "utf-8"))
                pos += n
        except UnicodeDecodeError:
            raise GgufFormatError(f"{what}: string at byte {pos} is not UTF-8") from None
        self.pos = pos
        return out

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == STRING:
            return self.string(key)
        if vtype == ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if count > MAX_HEADER_BYTES:
                raise GgufFormatError(f"{key}: array of {count} elements is not plausible")
            if etype in _NUMPY:
                width = np.dtype(_NUMPY[etype]).itemsize
                return np.frombuffer(self.take(count * width), dtype=_NUMPY[etype]).tolist()
            if etype == STRING:
                return self.strings(count, key)
            if etype == ARRAY:
                return [self.value(etype, key) for _ in range(count)]
            raise GgufFormatError(f"{key}: unknown array element type {etype}")
        raise GgufFormatError(f"{key}: unknown value type {vtype}")


def _tensor_bytes(dims: tuple[int, ...], qtype: int, name: str) -> int:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        return -1
    n = 1
    for d in dims:
        n *= d
    if n % block:
        raise GgufFormatError(f"tensor {name!r}: {n} elements are not a whole number of {block}-element blocks")
    return n // block * size


def parse_header(prefix: bytes | memoryview) -> GgufHeader:
    """The header of a GGUF file whose first bytes are `prefix`; NeedMoreBytes if it is longer."""
    c = _Cursor(prefix)
    if bytes(c.take(4)) != GGUF_MAGIC:
        raise GgufFormatError("not a GGUF file (magic is not 'GGUF')")
    version = c.unpack("<I")
    if version not in (2, 3):
        raise GgufFormatError(f"GGUF version {version} is not supported (2 or 3; a big-endian file reads as a huge version)")
    n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
    if n_tensors > 1 << 24 or n_kv > 1 << 24:
        raise GgufFormatError(f"{n_tensors} tensors / {n_kv} metadata keys is not plausible")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string("metadata key")
        meta[key] = c.value(c.unpack("<I"), key)
    tensors = []
    for _ in range(n_tensors):
        name = c.string("tensor name")
        n_dims = c.unpack("<I")
        if not 1 <= n_dims <= 4:
            raise GgufFormatError(f"tensor {name!r}: {n_dims} dimensions")
        dims = tuple(c.unpack("<Q") for _ in range(n_dims))
        qtype, offset = c.unpack("<I"), c.unpack("<Q")
        tensors.append(TensorInfo(name, dims, qtype, offset, _tensor_bytes(dims, qtype, name)))
    alignment = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise GgufFormatError(f"general.alignment {alignment} is not a power of two")
    data_offset = -(-c.pos // alignment) * alignment
    return GgufHeader(version, meta, tuple(tensors), alignment, data_offset)


def read_header(read_prefix: Callable[[int], bytes], *, first: int = FIRST_READ,
                limit: int = MAX_HEADER_BYTES) -> tuple[GgufHeader, bytes]:
    """Parse the header through `read_prefix(n)` (the file's first n bytes, fewer at its end),
    asking for longer prefixes until it fits. Returns the header and the prefix read."""
    want = first
    while True:
        prefix = read_prefix(want)
        try:
            return parse_header(prefix), prefix
        except NeedMoreBytes as e:
            if len(prefix) < want:
                raise GgufFormatError(f"the file ends at byte {len(prefix)} inside its header") from None
            if e.at_least > limit:
                raise GgufFormatError(f"the header is larger than {limit} bytes") from None
            want = min(limit, max(2 * want, e.at_least))
