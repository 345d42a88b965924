"""A stage host fetching its GGUF byte ranges from the orchestrator's model server (issue 14).

`FetchPool.acquire(request)` gives the stage a cache file holding, verified, the header and exactly
the tensors of its layer range (support.stage_tensors); `release(lease)` hands it back. Fetches are
shared per piece: a request for pieces another fetch is already getting waits for that fetch
instead of starting its own. Each fetch (`_Job`) is one thread with one HTTP connection (blocking
I/O off the event loop): it requests spans of consecutive missing pieces, hashes each piece as it
arrives, writes it in place, and records verified pieces in batches (cache.record). A fetch nobody
waits for any more is cancelled; what it verified stays, so the next request resumes from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swactor.common.events import get_logger
from swactor.distribution import fetcher
from swactor.distribution.cache import CacheEntry, CacheFull, WeightsCache, is_disk_full, punch_hole
from swactor.distribution.request import FetchRequest
from swactor.modelfile import support
from swactor.modelfile.header import GgufFormatError, parse_header
from swactor.modelfile.manifest import Manifest, ManifestError

MANIFEST_LIMIT = 256 << 20
COALESCE_GAP = 64 << 10      # read through alignment padding rather than start a new request
MAX_SPAN = 512 << 20         # one request at most: a restart after a dropped connection loses little
RECORD_EVERY_S = 0.25
RECORD_EVERY_BYTES = 32 << 20

# FetchFailed.reason values beyond fetcher's: ChecksumMismatch, ManifestMismatch, DiskFull, CacheFull, MalformedGGUF.


class FetchFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class FetchStarted:
    bytes_total: int   # the stage's header + tensor bytes
    bytes_cached: int  # already held and verified when the fetch started


@dataclass(frozen=True)
class FetchProgress:
    bytes_done: int
    bytes_total: int
    rate_bps: int
    eta_s: float


@dataclass(frozen=True)
class Lease:
    entry: CacheEntry
    path: str
    bytes_total: int
    bytes_fetched: int
    seconds: float


def spans(manifest: Manifest, pieces: list[int]) -> list[tuple[int, int, list[int]]]:
    """Consecutive pieces as (start, end, pieces) requests: gaps up to COALESCE_GAP are read through."""
    out: list[tuple[int, int, list[int]]] = []
    for i in sorted(pieces):
        p = manifest.pieces[i]
        if out and p.offset - out[-1][1] <= COALESCE_GAP and p.end - out[-1][0] <= MAX_SPAN:
            start, _, members = out[-1]
            out[-1] = (start, p.end, [*members, i])
        else:
            out.append((p.offset, p.end, [i]))
    return out


class _Job:
    """One fetch of a set of pieces on its own thread."""

    def __init__(self, pool: FetchPool, entry: CacheEntry, pieces: list[int], target: fetcher.Target) -> None:
        self.pool, self.entry, self.pieces = pool, entry, set(pieces)
        self.client = pool.client_factory(target)
        self.done: asyncio.Future[None] = pool.loop.create_future()
        self.waiters = 0
        self.total_bytes = self.remaining_bytes = entry.piece_bytes(pieces)
        self.received = 0
        self.cancelled = False
        self.thread = threading.Thread(target=self._run, name=f"fetch-{entry.sha256[:8]}", daemon=True)

    @property
    def in_flight_bytes(self) -> int:
        """Received but not yet recorded (approximate: gap bytes count too)."""
        return max(0, self.received - (self.total_bytes - self.remaining_bytes))

    def cancel(self) -> None:
        self.cancelled = True
        self.client.abort()

    def _finish(self, error: BaseException | None) -> None:
        def settle() -> None:
            self.entry.jobs.discard(self)
            if not self.done.done():
                if error is None:
                    self.done.set_result(None)
                else:
                    self.done.set_exception(error)
            self.pool.changed()
        self.pool.call_soon(settle)

    def _run(self) -> None:
        try:
            fd = os.open(self.entry.path, os.O_RDWR)
        except OSError as e:
            self._finish(FetchFailed("DiskFull" if is_disk_full(e) else "CacheIo", f"{self.entry.path}: {e.strerror}"))
            return
        writer = _PieceWriter(self, fd)
        try:
            for start, end, members in spans(self.entry.manifest, sorted(self.pieces)):
                writer.begin(start, members)
                self.client.read_range(start, end, writer.write)
            writer.flush()
            self._finish(None)
        except fetcher.FetchError as e:
            writer.abandon()
            self._finish(None if self.cancelled else FetchFailed(e.reason, e.detail))
        except FetchFailed as e:
            writer.abandon()
            self._finish(e)
        except OSError as e:
            writer.abandon()
            reason = "DiskFull" if is_disk_full(e) else "CacheIo"
            self._finish(FetchFailed(reason, f"writing {self.entry.path}: {e.strerror or e}"))
        except Exception as e:  # a bug must still end the wait, visibly
            writer.abandon()
            self._finish(FetchFailed("Internal", f"{type(e).__name__}: {e}"))
        finally:
            self.client.close()
            os.close(fd)


class _PieceWriter:
    """The sink of one span: piece bytes hashed and written in place, verified pieces recorded in batches."""

    def __init__(self, job: _Job, fd: int) -> None:
        self.job, self.fd = job, fd
        self.manifest = job.entry.manifest
        self.pending: list[int] = []
        self.pending_bytes = 0
        self.last_record = time.monotonic()
        self.members: list[int] = []
        self.k = 0
        self.pos = 0
        self.hash: Any = None

    def begin(self, start: int, members: list[int]) -> None:
        self.members, self.k, self.pos = members, 0, start
        self._next_piece()

    def _next_piece(self) -> None:
        self.hash = hashlib.sha256() if self.k < len(self.members) else None

    def write(self, chunk: memoryview) -> None:
        pos, end = self.pos, self.pos + len(chunk)
        while self.hash is not None:
            p = self.manifest.pieces[self.members[self.k]]
            lo, hi = max(p.offset, pos), min(p.end, end)
            if lo >= end:
                break  # the chunk ends in the gap before this piece
            if hi > lo:
                part = chunk[lo - pos:hi - pos]
                self.hash.update(part)
                written = 0
                while written < len(part):
                    written += os.pwrite(self.fd, part[written:], lo + written)
            if hi < p.end:
                break
            self._piece_done(self.members[self.k])
            self.k += 1
            self._next_piece()
        self.pos = end
        self.job.received += len(chunk)
        if time.monotonic() - self.last_record >= RECORD_EVERY_S or self.pending_bytes >= RECORD_EVERY_BYTES:
            self.flush()

    def _piece_done(self, i: int) -> None:
        p = self.manifest.pieces[i]
        if self.hash.hexdigest() != p.sha256:
            self.flush()
            self.job.pool.cache.drop(self.job.entry, self.fd, [i])
            raise FetchFailed("ChecksumMismatch", f"tensor {self.manifest.tensor_of(i)!r}: bytes [{p.offset}, {p.end}) "
                                                  f"do not match the manifest (sha256 {self.hash.hexdigest()[:16]}…, "
                                                  f"expected {p.sha256[:16]}…); the range was dropped from the cache")
        self.pending.append(i)
        self.pending_bytes += p.length

    def flush(self) -> None:
        if self.pending:
            self.job.pool.cache.record(self.job.entry, self.fd, self.pending)
            self.job.remaining_bytes -= self.pending_bytes
            self.pending, self.pending_bytes = [], 0
            self.job.pool.call_soon(self.job.pool.changed)
        self.last_record = time.monotonic()

    def abandon(self) -> None:
        """After a failure: keep what was verified, punch out the piece that was half written."""
        with contextlib.suppress(OSError):
            self.flush()
        if self.hash is not None and self.k < len(self.members):
            p = self.manifest.pieces[self.members[self.k]]
            with contextlib.suppress(OSError):
                punch_hole(self.fd, p.offset, p.length)


class FetchPool:
    def __init__(self, cache: WeightsCache, target_for: Callable[[str, str], fetcher.Target], *,
                 stall_timeout_s: float = 30.0, progress_interval_s: float = 0.5,
                 client_factory: Callable[[fetcher.Target], fetcher.RangeClient] | None = None) -> None:
        self.cache = cache
        self.target_for = target_for
        self.stall_timeout_s = stall_timeout_s
        self.progress_interval_s = progress_interval_s
        self.client_factory = client_factory or (lambda t: fetcher.RangeClient(t, stall_timeout_s=stall_timeout_s))
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by acquire
        self._changed = asyncio.Event()
        self.log = get_logger(component="fetch_pool")

    def changed(self) -> None:
        self._changed.set()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """From a fetch thread: run `fn` on the pool's loop (dropped if the loop is gone: nobody waits)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn)

    # ---- the stage's view ----

    async def acquire(self, req: FetchRequest, on_started: Callable[[FetchStarted], None] | None = None,
                      on_progress: Callable[[FetchProgress], None] | None = None) -> Lease:
        self.loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        entry = await self._entry(req)
        entry.users += 1
        self.cache.touch(entry)
        try:
            m = entry.manifest
            fetched = await self._ensure(entry, req, list(range(m.header_pieces)), None)
            pieces = await asyncio.to_thread(self._stage_pieces, entry, req)
            await asyncio.to_thread(self.cache.recheck, entry, pieces)
            total = entry.piece_bytes(pieces)
            # Cached = held before this call (the header it just fetched is not).
            cached = entry.piece_bytes([i for i in pieces if i in entry.verified]) - fetched
            if on_started is not None:
                on_started(FetchStarted(total, cached))
            fetched += await self._ensure(entry, req, pieces, _Meter(entry, pieces, total, cached, on_progress,
                                                                     self.progress_interval_s))
        except BaseException:
            self.release_entry(entry)
            raise
        return Lease(entry, str(entry.path), total, fetched, time.monotonic() - t0)

    def release(self, lease: Lease) -> None:
        self.release_entry(lease.entry)

    def release_entry(self, entry: CacheEntry) -> None:
        entry.users = max(0, entry.users - 1)
        self.cache.touch(entry)

    # ---- manifest and header ----

    def _target(self, req: FetchRequest, suffix: str = "") -> fetcher.Target:
        return self.target_for(req.url + suffix, req.tls_name)

    async def _entry(self, req: FetchRequest) -> CacheEntry:
        known = self.cache.entries.get(req.sha256)
        if known is not None and known.manifest_digest == req.manifest_sha256:
            return known

        def fetch_manifest() -> tuple[bytes, Manifest]:
            client = self.client_factory(self._target(req, "/manifest"))
            try:
                raw = client.get(MANIFEST_LIMIT)
            except fetcher.FetchError as e:
                raise FetchFailed(e.reason, f"manifest: {e.detail}") from None
            finally:
                client.close()
            try:
                m = Manifest.decode(raw, expect_digest=req.manifest_sha256)
            except ManifestError as e:
                raise FetchFailed("ManifestMismatch", f"{req.url}/manifest: {e}") from None
            if m.file_sha256 != req.sha256 or m.size != req.size:
                raise FetchFailed("ManifestMismatch", f"{req.url}/manifest describes {m.file_sha256[:16]}… "
                                                      f"({m.size} bytes), the plan {req.sha256[:16]}… ({req.size} bytes)")
            return raw, m

        raw, manifest = await asyncio.to_thread(fetch_manifest)
        try:
            return await asyncio.to_thread(self.cache.open, raw, manifest)
        except CacheFull as e:
            raise FetchFailed("CacheFull", str(e)) from None
        except OSError as e:
            raise FetchFailed("DiskFull" if is_disk_full(e) else "CacheIo", f"{self.cache.root}: {e.strerror or e}") from None

    def _stage_pieces(self, entry: CacheEntry, req: FetchRequest) -> list[int]:
        m = entry.manifest
        with open(entry.path, "rb") as f:
            prefix = f.read(m.header_bytes)
        try:
            header = parse_header(prefix)
        except (GgufFormatError, Exception) as e:
            raise FetchFailed("MalformedGGUF", f"the verified header does not parse: {e}") from None
        names = set(m.tensors)
        arch = support.ARCHITECTURES.get(str(header.get("general.architecture", "")))
        if arch is None:  # not one we know: every tensor of the blocks and every global tensor
            wanted = [t for t in names if not t.startswith("blk.")]
            wanted += [t for t in names if t.startswith("blk.") and req.layer_start <= int(t.split(".")[1]) < req.layer_end]
        else:
            wanted = support.stage_tensors(arch, names, req.layer_start, req.layer_end, req.num_layers)
        return m.pieces_for(wanted)

    # ---- fetching ----

    async def _ensure(self, entry: CacheEntry, req: FetchRequest, pieces: list[int], meter: _Meter | None) -> int:
        """Until every piece is verified: start a job for the missing pieces no job holds, wait on
        the jobs that hold the rest (a cancelled job too, until its thread is out). Returns the bytes
        this call's own jobs fetched."""
        await asyncio.to_thread(self.cache.recheck, entry, pieces)
        fetched = 0
        while True:
            missing = {i for i in pieces if i not in entry.verified}
            if not missing:
                if meter is not None:
                    meter.report(final=True)
                return fetched
            busy = [j for j in entry.jobs if isinstance(j, _Job) and j.pieces & missing]
            claimed = set().union(*(j.pieces for j in busy))
            mine = sorted(missing - claimed)
            own: _Job | None = None
            if mine:
                try:
                    await asyncio.to_thread(self.cache.make_room, entry.piece_bytes(mine), entry.sha256)
                except CacheFull as e:
                    raise FetchFailed("CacheFull", str(e)) from None
                own = _Job(self, entry, mine, self._target(req))
                entry.jobs.add(own)
                own.thread.start()
                busy.append(own)
                self.log.info("weights_fetch_started", sha256=entry.sha256[:16], pieces=len(mine),
                              bytes=entry.piece_bytes(mine))
            for j in busy:
                j.waiters += 1
            try:
                while not all(j.done.done() for j in busy):
                    self._changed.clear()
                    waiter = asyncio.ensure_future(self._changed.wait())
                    await asyncio.wait([waiter, *(j.done for j in busy if not j.done.done())],
                                       return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if meter is not None:
                        meter.report()
                if own is not None:
                    fetched += own.total_bytes - own.remaining_bytes
                for j in busy:
                    if j.done.exception() is not None:
                        raise j.done.exception()  # type: ignore[misc]
            finally:
                for j in busy:
                    j.waiters -= 1
                    if j.waiters <= 0 and not j.done.done():
                        j.cancel()


class _Meter:
    """Progress of one acquire: events at most every `interval_s`, bytes done = verified pieces + bytes in flight."""

    def __init__(self, entry: CacheEntry, pieces: list[int], total: int, cached: int,
                 emit: Callable[[FetchProgress], None] | None, interval_s: float) -> None:
        self.entry, self.pieces, self.total, self.cached = entry, set(pieces), total, cached
        self.emit, self.interval_s = emit, interval_s
        self.t0 = self.last = time.monotonic()

    def report(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.emit is None or (not final and now - self.last < self.interval_s):
            return
        self.last = now
        done = self.entry.piece_bytes(self.pieces & self.entry.verified)
        inflight = sum(j.in_flight_bytes for j in list(self.entry.jobs) if isinstance(j, _Job))
        done = min(self.total, done + (0 if final else inflight))
        rate = (done - self.cached) / max(1e-6, now - self.t0)
        eta = (self.total - done) / rate if rate > 0 else -1.0
        self.emit(FetchProgress(done, self.total, int(rate), 0.0 if final else eta))
