"""A stage host's weights cache: sparse copies of GGUF files, holding only verified pieces.

Per file (keyed by its SHA-256) in the cache directory:
- `<sha256>.gguf`: the file's full size, laid out like the original, holes where nothing is held,
  so the compute core's loader maps it unchanged;
- `<sha256>.manifest`: the manifest it is checked against;
- `<sha256>.ranges`: the sidecar record of verified pieces (JSON lines: a head line naming file and
  manifest, then `{"add": [...]}` / `{"drop": [...]}` lines). A piece is appended only after its
  bytes were written and fdatasync'd, so a crash never leaves a recorded piece unwritten.

Pieces recorded by an earlier process are `claimed`: they are re-hashed from disk before a stage
uses them (once per process), then `verified`. A piece that fails is punched out (a hole again)
and dropped from the record: nothing unverified stays readable as if it were good. The cache has
a size limit: whole files nobody uses (no lease, no fetch, not pinned as the worker's resident
weights) are evicted least recently used first.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.modelfile.manifest import Manifest, ManifestError

COMPACT_SIDECAR_BYTES = 1 << 20
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


class CacheFull(Exception):
    """Not enough room under the cache limit even after evicting every file not in use."""


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Deallocate [offset, offset+length): it reads as zeros again (zeros written where punching is unsupported)."""
    if length <= 0:
        return
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return
    zeros = bytes(min(length, 1 << 20))
    pos = offset
    while pos < offset + length:
        pos += os.pwrite(fd, zeros[:min(len(zeros), offset + length - pos)], pos)


@dataclass
class CacheEntry:
    sha256: str
    manifest: Manifest
    manifest_digest: str
    path: Path
    sidecar: Path
    verified: set[int] = field(default_factory=set)
    claimed: set[int] = field(default_factory=set)
    users: int = 0
    jobs: set[object] = field(default_factory=set)  # stagefetch._Job in progress for this file
    last_used_us: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # general.architecture of the file, once its verified header was parsed (stagefetch: a run's stage pieces); the
    # same sha256 always has the same header, so a warm run does not parse it again
    architecture: str | None = None

    def piece_bytes(self, pieces: set[int] | list[int]) -> int:
        return sum(self.manifest.pieces[i].length for i in pieces)

    @property
    def held_bytes(self) -> int:
        return self.piece_bytes(self.verified | self.claimed)


class WeightsCache:
    def __init__(self, root: Path, limit_bytes: int = 0) -> None:
        """limit_bytes 0 = no limit but the disk."""
        self.root = root
        self.limit_bytes = limit_bytes
        self.entries: dict[str, CacheEntry] = {}
        self.pinned: set[str] = set()  # the worker's resident weights: its mapping keeps them alive
        self.lock = threading.Lock()
        self.log = get_logger(component="weights_cache")
        root.mkdir(parents=True, exist_ok=True)
        for sidecar in sorted(root.glob("*.ranges")):
            self._load(sidecar.stem)

    # ---- files ----

    def _paths(self, sha256: str) -> tuple[Path, Path, Path]:
        return self.root / f"{sha256}.gguf", self.root / f"{sha256}.manifest", self.root / f"{sha256}.ranges"

    def _load(self, sha256: str) -> CacheEntry | None:
        data, man, sidecar = self._paths(sha256)
        try:
            raw = man.read_bytes()
            manifest = Manifest.decode(raw)
            lines = sidecar.read_text().splitlines()
            head = json.loads(lines[0])
            if head.get("sha256") != sha256 or head.get("manifest_sha256") != hashlib.sha256(raw).hexdigest() \
                    or data.stat().st_size != manifest.size:
                raise ManifestError("sidecar, manifest and data file disagree")
            held: set[int] = set()
            for line in lines[1:]:
                try:
                    rec = json.loads(line)
                except ValueError:
                    break  # a torn last line: what came before it stands
                held |= {int(i) for i in rec.get("add", [])}
                held -= {int(i) for i in rec.get("drop", [])}
            held = {i for i in held if 0 <= i < len(manifest.pieces)}
        except (OSError, ValueError, IndexError, ManifestError) as e:
            self.log.warning("weights_cache_entry_discarded", sha256=sha256, detail=str(e))
            self._remove_files(sha256)
            return None
        entry = CacheEntry(sha256, manifest, hashlib.sha256(raw).hexdigest(), data, sidecar, claimed=held,
                           last_used_us=int(sidecar.stat().st_mtime_ns // 1000))
        self.entries[sha256] = entry
        return entry

    def _remove_files(self, sha256: str) -> None:
        for p in self._paths(sha256):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def open(self, manifest_bytes: bytes, manifest: Manifest) -> CacheEntry:
        """The entry for this file and manifest (created sparse when new; an entry of another manifest
        of the same file is started over)."""
        digest = hashlib.sha256(manifest_bytes).hexdigest()
        with self.lock:
            entry = self.entries.get(manifest.file_sha256)
            if entry is not None and entry.manifest_digest == digest:
                return entry
            if entry is not None:
                if entry.users or entry.jobs:
                    raise CacheFull(f"{manifest.file_sha256[:12]} is in use under another manifest")
                self._evict_locked(entry, "manifest changed")
            data, man, sidecar = self._paths(manifest.file_sha256)
            fd = os.open(data, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o640)
            try:
                os.ftruncate(fd, manifest.size)  # sparse: no block is allocated until written
            finally:
                os.close(fd)
            tmp = man.with_suffix(".manifest.tmp")
            tmp.write_bytes(manifest_bytes)
            os.replace(tmp, man)
            head = json.dumps({"sha256": manifest.file_sha256, "size": manifest.size, "manifest_sha256": digest})
            self._write_atomic(sidecar, head + "\n")
            entry = CacheEntry(manifest.file_sha256, manifest, digest, data, sidecar, last_used_us=wall_us())
            self.entries[entry.sha256] = entry
            return entry

    @staticmethod
    def _write_atomic(path: Path, text: str) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # ---- the record ----

    def record(self, entry: CacheEntry, fd: int, pieces: list[int]) -> None:
        """Pieces whose bytes are written and checked: make the bytes durable, then record them."""
        if not pieces:
            return
        os.fdatasync(fd)
        with entry.lock:
            _append_durably(entry.sidecar, {"add": sorted(pieces)})
            entry.verified.update(pieces)
            entry.claimed.difference_update(pieces)
            if entry.sidecar.stat().st_size > COMPACT_SIDECAR_BYTES:
                self._compact(entry)

    def _compact(self, entry: CacheEntry) -> None:
        head = json.dumps({"sha256": entry.sha256, "size": entry.manifest.size, "manifest_sha256": entry.manifest_digest})
        held = sorted(entry.verified | entry.claimed)
        self._write_atomic(entry.sidecar, head + "\n" + json.dumps({"add": held}) + "\n")

    def drop(self, entry: CacheEntry, fd: int, pieces: list[int]) -> None:
        """Punch these pieces out of the data file and out of the record."""
        for i in pieces:
            p = entry.manifest.pieces[i]
            punch_hole(fd, p.offset, p.length)
        with entry.lock:
            _append_durably(entry.sidecar, {"drop": sorted(pieces)})
            entry.verified.difference_update(pieces)
            entry.claimed.difference_update(pieces)

    def recheck(self, entry: CacheEntry, pieces: list[int]) -> list[int]:
        """Re-hash claimed pieces from disk: good ones become verified, bad ones are dropped (returned)."""
        todo = sorted(set(pieces) & entry.claimed)
        if not todo:
            return []
        good, bad = [], []
        fd = os.open(entry.path, os.O_RDWR)
        try:
            for i in todo:
                p = entry.manifest.pieces[i]
                data = os.pread(fd, p.length, p.offset)
                (good if hashlib.sha256(data).hexdigest() == p.sha256 else bad).append(i)
            with entry.lock:
                entry.verified.update(good)
                entry.claimed.difference_update(good)
            if bad:
                self.log.warning("weights_cache_pieces_failed_recheck", sha256=entry.sha256, pieces=len(bad),
                                 tensor=entry.manifest.tensor_of(bad[0]))
                self.drop(entry, fd, bad)
        finally:
            os.close(fd)
        return bad

    def distrust(self, sha256: str) -> None:
        """A read or load of this file failed after its pieces were verified (it was removed, cut short or
        rewritten under the cache): forget that this process verified them, so the next fetch re-hashes them
        from disk and fetches again what is gone or bad. A missing or short file is put back at full size
        (sparse) first."""
        with self.lock:
            entry = self.entries.get(sha256)
        if entry is None:
            return
        with entry.lock:
            try:
                fd = os.open(entry.path, os.O_RDWR | os.O_CREAT, 0o640)
                try:
                    if os.fstat(fd).st_size != entry.manifest.size:
                        os.ftruncate(fd, entry.manifest.size)
                finally:
                    os.close(fd)
            except OSError as e:  # the next fetch fails by name (CacheIo) and distrusts it again
                self.log.warning("weights_cache_file_unusable", sha256=sha256, detail=str(e))
            entry.claimed |= entry.verified
            entry.verified.clear()
        self.log.warning("weights_cache_distrusted", sha256=sha256, pieces=len(entry.claimed))

    # ---- use, room, eviction ----

    def touch(self, entry: CacheEntry) -> None:
        entry.last_used_us = wall_us()
        with contextlib.suppress(OSError):
            os.utime(entry.sidecar)

    def used_bytes(self) -> int:
        """What the limit is measured against: bytes held plus bytes still being fetched."""
        with self.lock:
            entries = list(self.entries.values())
        return sum(e.held_bytes + sum(getattr(j, "remaining_bytes", 0) for j in list(e.jobs)) for e in entries)

    def make_room(self, need: int, keep: str) -> list[str]:
        """Evict unused files, least recently used first, until `need` more bytes fit; CacheFull if they cannot."""
        evicted = []
        while self.limit_bytes and (used := self.used_bytes()) + need > self.limit_bytes:
            with self.lock:
                idle = [e for e in self.entries.values()
                        if e.sha256 != keep and not e.users and not e.jobs and e.sha256 not in self.pinned]
                if not idle:
                    raise CacheFull(f"the weights cache {self.root} holds {used} of its {self.limit_bytes} bytes "
                                    f"in files in use; {need} more are needed")
                victim = min(idle, key=lambda e: e.last_used_us)
                self._evict_locked(victim, "lru")
            evicted.append(victim.sha256)
        return evicted

    def _evict_locked(self, entry: CacheEntry, why: str) -> None:
        self.log.info("weights_cache_evicted", sha256=entry.sha256, bytes=entry.held_bytes, why=why)
        self.entries.pop(entry.sha256, None)
        self._remove_files(entry.sha256)

    def listing(self) -> list[CacheEntry]:
        with self.lock:
            return sorted(self.entries.values(), key=lambda e: -e.last_used_us)


def is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def _append_durably(sidecar: Path, record: dict[str, list[int]]) -> None:
    """One line more in the cache entry's record, on disk before the caller trusts it."""
    with open(sidecar, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
