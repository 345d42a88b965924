"""The inside of a stage's fetch (stagefetch.FetchPool drives it): one `Job` per set of pieces on its
own thread and its lanes' HTTP connections (taken from, and handed back to, the pool's kept
connections: connections.py), a `PieceWriter` that hashes each piece as it arrives and writes it
in place, a `Recorder` thread that makes verified pieces durable and records them, and the
`Meter` that turns all that into progress events.
"""

from __future__ import annotations

import asyncio
import collections
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
MIN_SPAN = 512 << 10         # the smallest request a SpanQueue cuts (one piece when pieces are larger)
RECORD_EVERY_S = 0.05
RECORD_EVERY_BYTES = 8 << 20


class FetchFailed(NamedReason):
    """A stage's fetch failed; `reason` is a fetcher reason or one of this module's."""


def spans(manifest: Manifest, pieces: list[int]) -> list[tuple[int, int, list[int]]]:
    """Consecutive pieces as (start, end, pieces) requests: gaps up to COALESCE_GAP are read through when they are
    padding (between pieces next to each other in the manifest), never over a piece held already or not wanted."""
    out: list[tuple[int, int, list[int]]] = []
    for i in sorted(pieces):
        p = manifest.pieces[i]
        if (out and out[-1][2][-1] == i - 1 and p.offset - out[-1][1] <= COALESCE_GAP
                and p.end - out[-1][0] <= MAX_SPAN):
            start, _, members = out[-1]
            out[-1] = (start, p.end, [*members, i])
        else:
            out.append((p.offset, p.end, [i]))
    return out


class SpanQueue:
    """A job's spans, handed to its lanes one request at a time (any thread). Each request is cut from the front
    at piece boundaries: about what is left over twice the lanes, between MIN_SPAN and MAX_SPAN. Large while much
    is left (few requests), small at the end, so that the lanes run out of work together: over a long round trip
    a connection left alone with the last 16 MiB carries its share of the window, not the link's rate."""

    def __init__(self, manifest: Manifest, pieces: list[int], lanes: int) -> None:
        self.manifest, self.lanes = manifest, max(1, lanes)
        self._spans = collections.deque(spans(manifest, pieces))
        self._left = sum(end - start for start, end, _ in self._spans)
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int, list[int]] | None:
        with self._lock:
            if not self._spans:
                return None
            start, end, members = self._spans[0]
            want = min(MAX_SPAN, max(MIN_SPAN, self._left // (2 * self.lanes)))
            pieces = self.manifest.pieces
            k = 1
            while k < len(members) and pieces[members[k]].end - start <= want:
                k += 1
            if k == len(members):
                self._spans.popleft()
                span = (start, end, members)
            else:
                span = (start, pieces[members[k - 1]].end, members[:k])
                self._spans[0] = (pieces[members[k]].offset, end, members[k:])
            self._left -= span[1] - span[0]
            return span


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
        self.recorded: set[int] = set()  # pieces it verified and handed to the record (before they show as verified)
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
        with self.lock:
            self.cancelled = True
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
        work = SpanQueue(self.entry.manifest, sorted(self.pieces), self.pool.lanes)
        errors: list[BaseException] = []
        lanes = [threading.Thread(target=self._lane, args=(fd, recorder, work, errors), daemon=True)
                 for _ in range(min(self.pool.lanes, len(self.pieces)) - 1)]
        try:
            for t in lanes:
                t.start()
            self._lane(fd, recorder, work, errors)
            for t in lanes:
                t.join()
            recorder.close(check=False)
            outcome = self._outcome(errors[0] if errors else recorder.error)
            # the connections go back before the fetch is said done: a fetch its waiter starts next finds them kept
            # (handed back after, it opened new ones: a TLS handshake and a slow start each over a WAN)
            self._hand_back()
            self._finish(outcome)
        finally:
            self._hand_back()
            recorder.close(check=False)
            os.close(fd)

    def _hand_back(self) -> None:
        """The lanes' connections to the pool's next request (a cancelled job's are closed: cancel aborts them)."""
        with self.lock:
            clients, self.clients = self.clients, []
            keep = not self.cancelled
        for c in clients:
            if keep:
                self.pool.connections.give(c)
            else:
                c.close()

    def _lane(self, fd: int, recorder: Recorder, work: SpanQueue, errors: list[BaseException]) -> None:
        """One connection taking spans from `work` until none is left; from the model server each next span's request
        is pipelined behind the body being read (RangeClient.ahead): the connection never waits a round trip between
        two."""
        def take() -> tuple[int, int, list[int]] | None:
            return None if errors or self.cancelled else work.take()

        span = take()
        if span is None:
            return  # no work left for this lane: no connection taken either
        writer = PieceWriter(self, fd, recorder)
        with self.lock:
            self.writers.append(writer)
        following: list[tuple[int, int, list[int]]] = []

        def ahead() -> tuple[int, int] | None:
            nxt = take()
            if nxt is None:
                return None
            following.append(nxt)
            return nxt[0], nxt[1]

        client: fetcher.RangeClient | None = None
        try:
            client = self.pool.connections.take(self.target, lambda: self.cancelled or bool(errors))
            with self.lock:
                self.clients.append(client)
                cancelled = self.cancelled
            if cancelled:
                client.abort()
            # pipelined only to the model server, which answers in order by construction; a source URL's server
            # (a CDN, a proxy) may not, and a lane then waits one round trip per span (spans are up to 16 MiB)
            client.ahead = None if self.from_source else ahead
            while span is not None:
                start, end, members = span
                writer.begin(start, members)
                client.read_range(start, end, writer.write)
                span = following.pop() if following else take()
            writer.flush()
        except Exception as e:
            writer.abandon()
            with self.lock:
                errors.append(e)
                others = [c for c in self.clients if c is not client]
            for c in others:  # one lane's failure ends the fetch
                c.abort()
            if client is not None:
                client.close()
        finally:
            if client is not None:
                client.ahead = None

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
            self.job.recorded.update(pieces)
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
                 emit: Callable[[FetchProgress], None] | None, interval_s: float, t0: float | None = None) -> None:
        self.entry, self.pieces, self.total, self.cached = entry, set(pieces), total, cached
        self.emit, self.interval_s = emit, interval_s
        self.last = time.monotonic()
        self.t0 = self.last if t0 is None else t0  # when the bytes it counts began to come (the rate's start)

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
