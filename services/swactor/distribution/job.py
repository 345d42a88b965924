"""The inside of a stage's fetch (stagefetch.FetchPool drives it): one `Job` per set of pieces on its
own thread and HTTP connection, a `PieceWriter` that hashes each piece as it arrives and writes it
in place, a `Recorder` thread that makes verified pieces durable and records them, and the
`Meter` that turns all that into progress events.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from swactor.common.reasons import NamedReason
from swactor.distribution import fetcher
from swactor.distribution.cache import CacheEntry, is_disk_full, punch_hole
from swactor.distribution.request import FetchProgress
from swactor.modelfile.manifest import Manifest

if TYPE_CHECKING:
    from swactor.distribution.stagefetch import FetchPool

COALESCE_GAP = 64 << 10      # read through alignment padding rather than start a new request
MAX_SPAN = 16 << 20          # one request at most: spans spread over the lanes, and a dropped connection loses little
RECORD_EVERY_S = 0.05
RECORD_EVERY_BYTES = 8 << 20


class FetchFailed(NamedReason):
    """A stage's fetch failed; `reason` is a fetcher reason or one of this module's."""


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


class Job:
    """One fetch of a set of pieces: a coordinating thread and up to `lanes` HTTP connections (each
    its own thread) taking spans from one queue, so decryption, hashing and writing of different
    spans overlap on different cores."""

    def __init__(self, pool: FetchPool, entry: CacheEntry, pieces: list[int], target: fetcher.Target, *,
                 from_source: bool = False) -> None:
        self.pool, self.entry, self.pieces, self.target = pool, entry, set(pieces), target
        # From the model's own URL rather than the model server: a failure may be retried from the server.
        self.from_source = from_source
        self.clients: list[fetcher.RangeClient] = []
        self.writers: list[PieceWriter] = []
        self.lock = threading.Lock()
        self.done: asyncio.Future[None] = pool.loop.create_future()
        self.waiters = 0
        self.total_bytes = self.remaining_bytes = entry.piece_bytes(pieces)
        self.cancelled = False
        self.thread = threading.Thread(target=self._run, name=f"fetch-{entry.sha256[:8]}", daemon=True)

    @property
    def received(self) -> int:
        return sum(w.received for w in list(self.writers))

    @property
    def in_flight_bytes(self) -> int:
        """Received but not yet recorded (approximate: gap bytes count too)."""
        return max(0, self.received - (self.total_bytes - self.remaining_bytes))

    def cancel(self) -> None:
        self.cancelled = True
        with self.lock:
            clients = list(self.clients)
        for c in clients:
            c.abort()

    def _finish(self, error: BaseException | None) -> None:
        def settle() -> None:
            if self in self.entry.jobs:
                self.pool.job_ended(self)
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
        recorder = Recorder(self, fd)
        work: queue.SimpleQueue[tuple[int, int, list[int]]] = queue.SimpleQueue()
        all_spans = spans(self.entry.manifest, sorted(self.pieces))
        for span in all_spans:
            work.put(span)
        errors: list[BaseException] = []
        lanes = [threading.Thread(target=self._lane, args=(fd, recorder, work, errors), daemon=True)
                 for _ in range(min(self.pool.lanes, len(all_spans)) - 1)]
        try:
            for t in lanes:
                t.start()
            self._lane(fd, recorder, work, errors)
            for t in lanes:
                t.join()
            recorder.close(check=False)
            self._finish(self._outcome(errors[0] if errors else recorder.error))
        finally:
            recorder.close(check=False)
            os.close(fd)

    def _lane(self, fd: int, recorder: Recorder, work: queue.SimpleQueue[tuple[int, int, list[int]]],
              errors: list[BaseException]) -> None:
        client = self.pool.client_factory(self.target)
        writer = PieceWriter(self, fd, recorder)
        with self.lock:
            self.clients.append(client)
            self.writers.append(writer)
        if self.cancelled:
            client.abort()
        try:
            while not errors:
                try:
                    start, end, members = work.get_nowait()
                except queue.Empty:
                    break
                writer.begin(start, members)
                client.read_range(start, end, writer.write)
            writer.flush()
        except Exception as e:
            writer.abandon()
            with self.lock:
                errors.append(e)
                others = [c for c in self.clients if c is not client]
            for c in others:  # one lane's failure ends the fetch
                c.abort()
        finally:
            client.close()

    def _outcome(self, error: BaseException | None) -> BaseException | None:
        """The job's result: None when it completed (or was cancelled), else a FetchFailed."""
        match error:
            case None:
                return None
            case fetcher.FetchError() if self.cancelled:
                return None
            case fetcher.FetchError(reason=reason, detail=detail):
                return FetchFailed(reason, detail)
            case FetchFailed():
                return error
            case OSError():
                reason = "DiskFull" if is_disk_full(error) else "CacheIo"
                return FetchFailed(reason, f"writing {self.entry.path}: {error.strerror or error}")
        return FetchFailed("Internal", f"{type(error).__name__}: {error}")  # a bug must still end the wait


class Recorder:
    """Records verified pieces on its own thread (fdatasync, then the sidecar line): the receiving
    thread never waits for the disk. A failure is raised by the next `submit` or by `close`."""

    def __init__(self, job: Job, fd: int) -> None:
        self.job, self.fd = job, fd
        self.queue: queue.SimpleQueue[tuple[list[int], int] | None] = queue.SimpleQueue()
        self.error: OSError | None = None
        self.thread = threading.Thread(target=self._run, name=f"record-{job.entry.sha256[:8]}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        done = False
        while not done:
            batches = [self.queue.get()]
            while not self.queue.empty():  # everything that queued during the last sync: one sync for all
                batches.append(self.queue.get())
            done = None in batches
            pieces = [i for b in batches if b is not None for i in b[0]]
            nbytes = sum(b[1] for b in batches if b is not None)
            if self.error is not None or not pieces:
                continue
            try:
                self.job.pool.cache.record(self.job.entry, self.fd, pieces)
            except OSError as e:
                self.error = e
                continue
            self.job.remaining_bytes -= nbytes
            self.job.pool.call_soon(self.job.pool.changed)

    def submit(self, pieces: list[int], nbytes: int) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put((pieces, nbytes))

    def close(self, check: bool = True) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        if check and self.error is not None:
            raise self.error


class PieceWriter:
    """The sink of one span: piece bytes hashed and written in place, verified pieces recorded in batches."""

    def __init__(self, job: Job, fd: int, recorder: Recorder) -> None:
        self.job, self.fd, self.recorder = job, fd, recorder
        self.received = 0
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
        self.received += len(chunk)
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
            self.recorder.submit(self.pending, self.pending_bytes)
            self.pending, self.pending_bytes = [], 0
        self.last_record = time.monotonic()

    def abandon(self) -> None:
        """After a failure: keep what was verified, punch out the piece that was half written."""
        with contextlib.suppress(OSError):
            self.flush()
        if self.hash is not None and self.k < len(self.members):
            p = self.manifest.pieces[self.members[self.k]]
            with contextlib.suppress(OSError):
                punch_hole(self.fd, p.offset, p.length)


class Meter:
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
        inflight = sum(j.in_flight_bytes for j in list(self.entry.jobs) if isinstance(j, Job))
        done = min(self.total, done + (0 if final else inflight))
        rate = (done - self.cached) / max(1e-6, now - self.t0)
        eta = (self.total - done) / rate if rate > 0 else -1.0
        self.emit(FetchProgress(done, self.total, int(rate), 0.0 if final else eta))
