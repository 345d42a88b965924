"""The manifest of a GGUF file: what a stage host verifies every fetched byte range against.

The file is cut into pieces along tensor boundaries: the header [0, data_offset) and each tensor's
bytes, each split into pieces of at most `piece_bytes` (so a multi-GB tensor resumes and verifies
in pieces, and a stage fetches exactly its tensors, never a neighbour's bytes). Each piece has a
SHA-256; the manifest also carries the whole file's SHA-256 and, per tensor, its piece span.
Alignment padding between tensors belongs to no piece (the loader never reads it).

The canonical encoding is compact sorted JSON; its SHA-256 is the manifest digest the run plan
carries, so a stage can trust a manifest fetched over any channel.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from swactor.modelfile.header import GgufHeader

VERSION = 1
MIN_PIECE = 256 << 10
MAX_PIECE = 16 << 20
READ_CHUNK = 8 << 20


class ManifestError(ValueError):
    """A manifest that does not decode, does not match its digest, or does not fit its file."""


@dataclass(frozen=True)
class Piece:
    offset: int
    length: int
    sha256: str

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Manifest:
    file_sha256: str
    size: int
    header_bytes: int
    piece_bytes: int
    pieces: tuple[Piece, ...]
    # Pieces [0, header_pieces) are the header.
    header_pieces: int
    # tensor name -> (first piece, piece count)
    tensors: dict[str, tuple[int, int]]

    def encode(self) -> bytes:
        doc = {"version": VERSION, "file_sha256": self.file_sha256, "size": self.size,
               "header_bytes": self.header_bytes, "piece_bytes": self.piece_bytes,
               "pieces": [[p.offset, p.length, p.sha256] for p in self.pieces],
               "header_pieces": self.header_pieces, "tensors": {k: list(v) for k, v in self.tensors.items()}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    @classmethod
    def decode(cls, data: bytes, expect_digest: str | None = None) -> Manifest:
        if expect_digest is not None and hashlib.sha256(data).hexdigest() != expect_digest:
            raise ManifestError(f"manifest digest {hashlib.sha256(data).hexdigest()} != expected {expect_digest}")
        try:
            doc = json.loads(data)
            if doc.get("version") != VERSION:
                raise ManifestError(f"manifest version {doc.get('version')!r} is not {VERSION}")
            m = cls(file_sha256=str(doc["file_sha256"]), size=int(doc["size"]), header_bytes=int(doc["header_bytes"]),
                    piece_bytes=int(doc["piece_bytes"]),
                    pieces=tuple(Piece(int(o), int(n), str(h)) for o, n, h in doc["pieces"]),
                    header_pieces=int(doc["header_pieces"]),
                    tensors={str(k): (int(v[0]), int(v[1])) for k, v in doc["tensors"].items()})
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(f"manifest does not decode: {e}") from None
        m.check()
        return m

    def check(self) -> None:
        prev = 0
        for i, p in enumerate(self.pieces):
            if p.offset < prev or p.length <= 0 or p.end > self.size or len(p.sha256) != 64:
                raise ManifestError(f"manifest piece {i} [{p.offset}, {p.end}) is out of order or outside the file")
            prev = p.end
        for name, (first, count) in self.tensors.items():
            if not (self.header_pieces <= first and count > 0 and first + count <= len(self.pieces)):
                raise ManifestError(f"manifest tensor {name!r} names pieces outside the manifest")

    def pieces_for(self, tensor_names: Iterable[str]) -> list[int]:
        """Piece indices of the header and of these tensors, in file order."""
        out = set(range(self.header_pieces))
        for name in tensor_names:
            if name not in self.tensors:
                raise ManifestError(f"tensor {name!r} is not in the manifest")
            first, count = self.tensors[name]
            out.update(range(first, first + count))
        return sorted(out)

    def tensor_of(self, piece: int) -> str:
        """The tensor a piece belongs to ("header" for the header's pieces)."""
        if piece < self.header_pieces:
            return "header"
        for name, (first, count) in self.tensors.items():
            if first <= piece < first + count:
                return name
        return f"piece {piece}"


def auto_piece_bytes(size: int) -> int:
    """About 2048 pieces per file, a power of two between 256 KiB and 16 MiB."""
    want = max(1, size // 2048)
    return min(MAX_PIECE, max(MIN_PIECE, 1 << (want - 1).bit_length()))


def _split(start: int, end: int, piece: int) -> list[tuple[int, int]]:
    return [(o, min(piece, end - o)) for o in range(start, end, piece)]


def layout(header: GgufHeader, size: int, piece_bytes: int) -> tuple[list[tuple[int, int]], int, dict[str, tuple[int, int]]]:
    """(piece offsets and lengths, header piece count, tensor -> piece span) for a file of `size` bytes."""
    if header.data_offset > size:
        raise ManifestError(f"the header ({header.data_offset} bytes) is longer than the file ({size} bytes)")
    spans = _split(0, header.data_offset, piece_bytes)
    header_pieces = len(spans)
    tensors: dict[str, tuple[int, int]] = {}
    prev_end, prev_name = header.data_offset, "the header"
    for t in sorted(header.tensors, key=lambda t: t.offset):
        start = header.data_offset + t.offset
        if t.nbytes < 0:
            raise ManifestError(f"tensor {t.name!r} has {t.type_name}, whose size is unknown")
        if start < prev_end:
            raise ManifestError(f"tensor {t.name!r} at byte {start} overlaps {prev_name}")
        if start + t.nbytes > size:
            raise ManifestError(f"tensor {t.name!r} ends at byte {start + t.nbytes}, beyond the file's {size}")
        if t.nbytes == 0:
            continue
        parts = _split(start, start + t.nbytes, piece_bytes)
        tensors[t.name] = (len(spans), len(parts))
        spans += parts
        prev_end, prev_name = start + t.nbytes, f"tensor {t.name!r}"
    return spans, header_pieces, tensors


def build_manifest(path: Path, header: GgufHeader, piece_bytes: int | None = None,
                   progress: Callable[[int, int], None] | None = None) -> Manifest:
    """Hash the whole file once: its SHA-256 and every piece's. `progress(done, size)` per chunk read."""
    size = os.stat(path).st_size
    piece_bytes = piece_bytes or auto_piece_bytes(size)
    spans, header_pieces, tensors = layout(header, size, piece_bytes)
    whole = hashlib.sha256()
    digests: list[str] = []
    i, current = 0, hashlib.sha256()
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    pos = 0
    with open(path, "rb", buffering=0) as f:
        while pos < size:
            n = f.readinto(buf)
            if not n:
                raise ManifestError(f"{path} shrank while it was hashed (at byte {pos} of {size})")
            chunk, end = view[:n], pos + n
            whole.update(chunk)
            while i < len(spans) and spans[i][0] < end:
                off, length = spans[i]
                lo, hi = max(off, pos), min(off + length, end)
                if hi > lo:
                    current.update(chunk[lo - pos:hi - pos])
                if off + length > end:
                    break
                digests.append(current.hexdigest())
                current = hashlib.sha256()
                i += 1
            pos = end
            if progress is not None:
                progress(pos, size)
    pieces = tuple(Piece(o, n, h) for (o, n), h in zip(spans, digests, strict=True))
    return Manifest(whole.hexdigest(), size, header.data_offset, piece_bytes, pieces, header_pieces, tensors)
