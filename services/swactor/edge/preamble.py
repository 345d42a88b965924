"""The uni-stream preamble (spec §23): fixed width, then the stream is raw ring bytes.

    magic  4 bytes  b"swE1"   (protocol and version)
    edge_id 8 bytes big-endian u64, non-zero
"""

from __future__ import annotations

import struct

MAGIC = b"swE1"
PREAMBLE_LEN = 12
_STRUCT = struct.Struct(">4sQ")


class MalformedPreamble(ValueError):
    """The first bytes of a stream are not a swactor edge preamble."""


def encode(edge_id: int) -> bytes:
    if not 0 < edge_id < 2**64:
        raise ValueError(f"edge_id {edge_id} is outside 1..2^64-1")
    return _STRUCT.pack(MAGIC, edge_id)


def decode(data: bytes) -> int:
    """The edge_id of a complete preamble (exactly PREAMBLE_LEN bytes)."""
    if len(data) != PREAMBLE_LEN:
        raise MalformedPreamble(f"preamble is {len(data)} bytes, expected {PREAMBLE_LEN}")
    magic, edge_id = _STRUCT.unpack(data)
    if magic != MAGIC:
        raise MalformedPreamble(f"bad preamble magic {magic!r}")
    if edge_id == 0:
        raise MalformedPreamble("preamble edge_id is 0")
    return int(edge_id)


class PreambleReader:
    """Accumulates the first bytes of a stream; `feed` returns (edge_id, rest) once complete."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> tuple[int, bytes] | None:
        self._buf += data
        if len(self._buf) < PREAMBLE_LEN:
            if not MAGIC.startswith(self._buf[: len(MAGIC)]):
                raise MalformedPreamble(f"bad preamble magic {self._buf[:4]!r}")
            return None
        edge_id = decode(self._buf[:PREAMBLE_LEN])
        rest = self._buf[PREAMBLE_LEN:]
        self._buf = b""
        return edge_id, rest
