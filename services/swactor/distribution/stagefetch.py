"""A stage host fetching its GGUF byte ranges from the orchestrator's model server (issue 14).

`FetchPool.acquire(request)` gives the stage a cache file holding, verified, the header and exactly
the tensors of its layer range (support.stage_tensors); `release(lease)` hands it back. Fetches are
shared per piece: a request for pieces another fetch is already getting waits for that fetch
instead of starting its own. Each fetch (`Job`) is one thread and `lanes` HTTP connections (blocking
I/O off the event loop): it requests spans of consecutive missing pieces (pipelined), hashes each piece
as it arrives, writes it in place, and records verified pieces in batches (cache.record). A fetch nobody
waits for any more is cancelled; what it verified stays, so the next request resumes from there. The
connections are the pool's (connections.py): opened while the manifest comes, kept from the manifest to
the last span and on to the next acquire, so a long round trip is paid in handshakes and slow start once.

With `FetchRequest.source_url` the pieces come from the model's own http(s) URL instead (the manifest
still from the model server): the orchestrator's uplink is then not the pool's limit. A fetch from the
source that fails for a reason in `SOURCE_FALLBACK_REASONS` is continued, once, from the model server
(`Origin.fall_back`: the one place that decides).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swactor.common.events import get_logger
from swactor.distribution import fetcher
from swactor.distribution.cache import CacheEntry, CacheFull, WeightsCache, is_disk_full
from swactor.distribution.connections import Connections
from swactor.distribution.job import FetchFailed, Job, Meter
from swactor.distribution.request import FetchProgress, FetchRequest, FetchStarted
from swactor.modelfile import support
from swactor.modelfile.header import GgufFormatError, parse_header
from swactor.modelfile.manifest import Manifest, ManifestError

MANIFEST_LIMIT = 256 << 20

# A fetch from the model's own URL that failed for one of these is continued from the orchestrator's model server:
# each says the origin, or the way to it, failed (no route to the internet, a TLS interception, the file moved or
# gone, a server that ignores Range, a link that stalls or drops), not this host. ChecksumMismatch too: the origin's
# bytes are not the file the orchestrator verified (it changed since, or is another file); the orchestrator's copy
# is the verified one. Not DiskFull, CacheFull, CacheIo (this host's disk: the server would not help) or Cancelled.
SOURCE_FALLBACK_REASONS = frozenset({
    fetcher.UNREACHABLE, fetcher.TLS_FAILED, fetcher.NOT_FOUND, fetcher.HTTP_STATUS, fetcher.RANGE_IGNORED,
    fetcher.STALLED, fetcher.RANGE_NOT_SATISFIABLE, fetcher.TRUNCATED, fetcher.SIZE_CHANGED, fetcher.PROTOCOL,
    "ChecksumMismatch",
})

# FetchFailed.reason values beyond fetcher's: ChecksumMismatch, ManifestMismatch, DiskFull, CacheFull, MalformedGGUF.


def _block(tensor: str) -> int:
    """The block of a `blk.<i>.…` tensor (-1 for a name that does not say one)."""
    part = tensor.split(".")[1] if tensor.count(".") else ""
    return int(part) if part.isdigit() else -1


@dataclass
class Origin:
    """Where one acquire's pieces come from: the model's own URL (`req.source_url`) until a fetch from it fails,
    then, for the rest of the acquire, the orchestrator's model server (`req.url`)."""
    req: FetchRequest
    from_source: bool

    def fall_back(self, job: Job, error: BaseException, log: Any) -> bool:
        """Whether a failed job's pieces are to be fetched again (from the model server) rather than the failure
        raised: only a job from the source, failed for a SOURCE_FALLBACK_REASONS reason. The first such failure
        switches this acquire to the model server and logs `weights_source_fallback`."""
        if not (job.from_source and isinstance(error, FetchFailed) and error.reason in SOURCE_FALLBACK_REASONS):
            return False
        if self.from_source:
            self.from_source = False
            why = ("the source's bytes differ from the manifest (the file changed at the source?); the orchestrator's "
                   "copy is the verified one" if error.reason == "ChecksumMismatch" else "the source failed")
            log.warning("weights_source_fallback", reason=error.reason, detail=error.detail, source=self.req.source_url,
                        server=self.req.url, why=why)
        return True


@dataclass(frozen=True)
class Lease:
    entry: CacheEntry
    path: str
    bytes_total: int
    bytes_fetched: int
    seconds: float


class FetchPool:
    def __init__(self, cache: WeightsCache, target_for: Callable[[str, str], fetcher.Target], *,
                 stall_timeout_s: float = 30.0, progress_interval_s: float = 0.5, lanes: int = 4,
                 client_factory: Callable[[fetcher.Target], fetcher.RangeClient] | None = None,
                 source_target_for: Callable[[str], fetcher.Target] = fetcher.Target) -> None:
        self.cache = cache
        self.lanes = max(1, lanes)  # HTTP connections per fetch
        self.target_for = target_for  # the model server: (url, tls name) -> its mutual-TLS target
        # The model's own URL: https checked against the default trust store (it is a public server, not ours).
        self.source_target_for = source_target_for
        self.stall_timeout_s = stall_timeout_s
        self.progress_interval_s = progress_interval_s
        self.client_factory = client_factory or (lambda t: fetcher.RangeClient(t, stall_timeout_s=stall_timeout_s))
        # Connections kept from one request to the next: the manifest, the header's and the stage's spans of an
        # acquire share `lanes` of them per origin (connections.py).
        self.connections = Connections(self.client_factory)
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by acquire
        self._changed = asyncio.Event()
        self._received_by_ended_jobs = 0  # bytes the fetches that ended received (Job.settle adds them)
        self.log = get_logger(component="fetch_pool")

    @property
    def received_bytes(self) -> int:
        """Bytes of weights received from model servers since the pool started: the ended fetches' and the running
        ones' so far (a counter: it only grows)."""
        running = sum(j.received for e in list(self.cache.entries.values()) for j in list(e.jobs) if isinstance(j, Job))
        return self._received_by_ended_jobs + running

    def job_ended(self, job: Job) -> None:
        """On the pool's loop, as a fetch leaves its entry: what it received moves into the ended fetches' count."""
        self._received_by_ended_jobs += job.received

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
        try:
            entry = await self._entry(req)
        except BaseException:
            self.loop.call_later(self.connections.keep_s + 1.0, self.connections.prune)  # what `warm` opened
            raise
        entry.users += 1
        self.cache.touch(entry)
        origin = Origin(req, bool(req.source_url))
        own: list[Job] = []  # the jobs this acquire started: what it fetched is what they recorded
        held: set[Job] = set()  # the jobs this acquire waits on (one waiter each, until it ends)
        try:
            m = entry.manifest
            # The header, and with it the tensors the stage needs whatever the header says (certain_pieces): one job,
            # so the link stays busy while the header is parsed; the rest of the stage's pieces follow on the same
            # connections. Only once the header's pieces are in does this go on.
            head = list(range(m.header_pieces))
            started = time.monotonic()
            await self._ensure(entry, origin, self._certain_pieces(entry, req), None, own, held, enough=head)
            pieces = await asyncio.to_thread(self._stage_pieces, entry, req)
            await asyncio.to_thread(self.cache.recheck, entry, pieces)
            total = entry.piece_bytes(pieces)
            # Cached = held before this call (what its own jobs recorded since is not).
            mine = self._recorded(own)
            cached = entry.piece_bytes([i for i in pieces if i in entry.verified and i not in mine])
            if on_started is not None:
                on_started(FetchStarted(total, cached))
            await self._ensure(entry, origin, pieces, Meter(entry, pieces, total, cached, on_progress,
                                                            self.progress_interval_s, started), own, held)
            fetched = entry.piece_bytes(self._recorded(own) & entry.verified)
            await self._handed_back(entry, held)
        except BaseException:
            self.release_entry(entry)
            raise
        finally:
            self._let_go(held)
            self.loop.call_later(self.connections.keep_s + 1.0, self.connections.prune)
        return Lease(entry, str(entry.path), total, fetched, time.monotonic() - t0)

    @staticmethod
    def _recorded(jobs: list[Job]) -> set[int]:
        return set().union(*(j.recorded for j in jobs))

    @staticmethod
    async def _handed_back(entry: CacheEntry, held: set[Job]) -> None:
        """Until the jobs whose pieces are all in have ended: what is left of them is handing their connections back,
        and the fetch that follows this acquire (the next stage's on this host) is to find them kept, not open new
        ones (a TLS handshake and a slow start each over a WAN). Their pieces are verified the moment the last one is
        recorded, which a busy host can show before their threads are out."""
        finishing = [j.done for j in held if not j.done.done() and j.pieces <= entry.verified]
        if finishing:
            await asyncio.wait(finishing)

    @staticmethod
    def _let_go(held: set[Job]) -> None:
        """The acquire stops waiting on these jobs: a job nobody waits on any more is cancelled (unless all its
        pieces are in: it is only handing its connections back)."""
        for j in held:
            j.waiters -= 1
            if j.waiters <= 0 and not j.done.done() and not j.pieces <= j.entry.verified:
                j.cancel()
        held.clear()

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
            client: fetcher.RangeClient | None = None
            try:
                client = self.connections.take(self._target(req, "/manifest"))
                raw = client.get(MANIFEST_LIMIT)
            except fetcher.FetchError as e:
                if client is not None:
                    client.close()
                raise FetchFailed(e.reason, f"manifest: {e.detail}") from None
            self.connections.give(client)  # kept for the pieces when they come from the model server too
            try:
                m = Manifest.decode(raw, expect_digest=req.manifest_sha256)
            except ManifestError as e:
                raise FetchFailed("ManifestMismatch", f"{req.url}/manifest: {e}") from None
            if m.file_sha256 != req.sha256 or m.size != req.size:
                raise FetchFailed("ManifestMismatch", f"{req.url}/manifest describes {m.file_sha256[:16]}… "
                                                      f"({m.size} bytes), the plan {req.sha256[:16]}… ({req.size} bytes)")
            return raw, m

        # The pieces' connections open while the manifest is on its way (one of them carries the manifest when the
        # pieces come from the model server): over a long round trip the handshakes then cost nothing more.
        pieces_target = self.source_target_for(req.source_url) if req.source_url else self._target(req)
        self.connections.warm(pieces_target, self.lanes)
        raw, manifest = await asyncio.to_thread(fetch_manifest)
        try:
            return await asyncio.to_thread(self.cache.open, raw, manifest)
        except CacheFull as e:
            raise FetchFailed("CacheFull", str(e)) from None
        except OSError as e:
            raise FetchFailed("DiskFull" if is_disk_full(e) else "CacheIo", f"{self.cache.root}: {e.strerror or e}") from None

    def _certain_pieces(self, entry: CacheEntry, req: FetchRequest) -> list[int]:
        """The header's pieces and those of the tensors the stage reads whatever its header names: the stage's
        tensors under every architecture support.py knows (an unknown one takes all of these and more), from the
        manifest's tensor names alone. Nothing outside what _stage_pieces will say: no byte fetched for nothing."""
        m = entry.manifest
        names = set(m.tensors)
        every = [set(support.stage_tensors(arch, names, req.layer_start, req.layer_end, req.num_layers))
                 for arch in support.ARCHITECTURES.values()]
        blocks = {t for t in names if t.startswith("blk.") and req.layer_start <= _block(t) < req.layer_end}
        return m.pieces_for((set.intersection(*every) if every else blocks) & names)

    def _stage_pieces(self, entry: CacheEntry, req: FetchRequest) -> list[int]:
        m = entry.manifest
        names = set(m.tensors)
        arch = support.ARCHITECTURES.get(self._architecture(entry))
        if arch is None:  # not one we know: every tensor of the blocks and every global tensor
            wanted = [t for t in names if not t.startswith("blk.")]
            wanted += [t for t in names if t.startswith("blk.") and req.layer_start <= _block(t) < req.layer_end]
        else:
            wanted = support.stage_tensors(arch, names, req.layer_start, req.layer_end, req.num_layers)
        return m.pieces_for(wanted)

    @staticmethod
    def _architecture(entry: CacheEntry) -> str:
        """The file's general.architecture, from its verified header (parsed once per cache entry). The file is looked
        for every time: one removed under the pool is CacheIo here. (One cut short fails its load, and the node
        distrusts the copy: worker/weights.py.)"""
        try:
            os.stat(entry.path)
            if entry.architecture is not None:
                return entry.architecture
            with open(entry.path, "rb") as f:
                prefix = f.read(entry.manifest.header_bytes)
        except OSError as e:  # the cache file went away or cannot be read under this process
            raise FetchFailed("CacheIo", f"{entry.path}: {e.strerror or e}") from None
        try:
            header = parse_header(prefix)
        except (GgufFormatError, Exception) as e:
            raise FetchFailed("MalformedGGUF", f"the verified header does not parse: {e}") from None
        entry.architecture = str(header.get("general.architecture", ""))
        return entry.architecture

    # ---- fetching ----

    async def _ensure(self, entry: CacheEntry, origin: Origin, pieces: list[int], meter: Meter | None,
                      own: list[Job], held: set[Job], enough: list[int] | None = None) -> None:
        """Until every piece (with `enough`: every piece of `enough`) is verified: start a job for the missing
        pieces no job holds, wait on the jobs that hold the rest (a cancelled job too, until its thread is out; a
        job from the source that failed and falls back, too: its pieces are claimed again). The jobs it starts go
        to `own`; those it waits on to `held`, one waiter each, until the caller lets go of them (_let_go): with
        `enough` they may go on fetching the other pieces after this returns."""
        req = origin.req
        await asyncio.to_thread(self.cache.recheck, entry, pieces)
        need = pieces if enough is None else enough
        while True:
            # A job that failed (one waited on here, or one an earlier call left running): its pieces go to the
            # model server (Origin.fall_back) or its failure is this call's.
            for j in [j for j in held if j.done.done() and j.done.exception() is not None]:
                held.discard(j)
                j.waiters -= 1
                error = j.done.exception()
                if not origin.fall_back(j, error, self.log):  # type: ignore[arg-type]
                    raise error  # type: ignore[misc]
            if all(i in entry.verified for i in need):
                if meter is not None:
                    meter.report(final=True)
                return
            missing = {i for i in pieces if i not in entry.verified}
            busy = [j for j in entry.jobs if isinstance(j, Job) and j.pieces & missing]
            claimed = set().union(*(j.pieces for j in busy))
            mine = sorted(missing - claimed)
            if mine:
                try:
                    await asyncio.to_thread(self.cache.make_room, entry.piece_bytes(mine), entry.sha256)
                except CacheFull as e:
                    raise FetchFailed("CacheFull", str(e)) from None
                if origin.from_source:
                    job = Job(self, entry, mine, self.source_target_for(req.source_url), from_source=True)
                else:
                    job = Job(self, entry, mine, self._target(req))
                entry.jobs.add(job)
                own.append(job)
                job.thread.start()
                busy.append(job)
                self.log.info("weights_fetch_started", sha256=entry.sha256[:16], pieces=len(mine),
                              bytes=entry.piece_bytes(mine), origin="source" if job.from_source else "server")
            for j in busy:
                if j not in held:
                    held.add(j)
                    j.waiters += 1
            while not all(j.done.done() for j in busy):
                if enough is not None and all(i in entry.verified for i in need):
                    break
                self._changed.clear()
                waiter = asyncio.ensure_future(self._changed.wait())
                await asyncio.wait([waiter, *(j.done for j in busy if not j.done.done())],
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if meter is not None:
                    meter.report()
