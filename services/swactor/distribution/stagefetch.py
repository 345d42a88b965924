"""A stage host fetching its GGUF byte ranges from the orchestrator's model server (issue 14).

`FetchPool.acquire(request)` gives the stage a cache file holding, verified, the header and exactly
the tensors of its layer range (support.stage_tensors); `release(lease)` hands it back. Fetches are
shared per piece: a request for pieces another fetch is already getting waits for that fetch
instead of starting its own. Each fetch (`Job`) is one thread with one HTTP connection (blocking
I/O off the event loop): it requests spans of consecutive missing pieces, hashes each piece as it
arrives, writes it in place, and records verified pieces in batches (cache.record). A fetch nobody
waits for any more is cancelled; what it verified stays, so the next request resumes from there.

With `FetchRequest.source_url` the pieces come from the model's own http(s) URL instead (the manifest
still from the model server): the orchestrator's uplink is then not the pool's limit. A fetch from the
source that fails for a reason in `SOURCE_FALLBACK_REASONS` is continued, once, from the model server
(`Origin.fall_back`: the one place that decides).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swactor.common.events import get_logger
from swactor.distribution import fetcher
from swactor.distribution.cache import CacheEntry, CacheFull, WeightsCache, is_disk_full
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
        entry = await self._entry(req)
        entry.users += 1
        self.cache.touch(entry)
        origin = Origin(req, bool(req.source_url))
        try:
            m = entry.manifest
            fetched = await self._ensure(entry, origin, list(range(m.header_pieces)), None)
            pieces = await asyncio.to_thread(self._stage_pieces, entry, req)
            await asyncio.to_thread(self.cache.recheck, entry, pieces)
            total = entry.piece_bytes(pieces)
            # Cached = held before this call (the header it just fetched is not).
            cached = entry.piece_bytes([i for i in pieces if i in entry.verified]) - fetched
            if on_started is not None:
                on_started(FetchStarted(total, cached))
            fetched += await self._ensure(entry, origin, pieces, Meter(entry, pieces, total, cached, on_progress,
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
        try:
            with open(entry.path, "rb") as f:
                prefix = f.read(m.header_bytes)
        except OSError as e:  # the cache file went away or cannot be read under this process
            raise FetchFailed("CacheIo", f"{entry.path}: {e.strerror or e}") from None
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

    async def _ensure(self, entry: CacheEntry, origin: Origin, pieces: list[int], meter: Meter | None) -> int:
        """Until every piece is verified: start a job for the missing pieces no job holds, wait on
        the jobs that hold the rest (a cancelled job too, until its thread is out; a job from the
        source that failed and falls back, too: its pieces are claimed again). Returns the bytes this
        call's own jobs fetched."""
        req = origin.req
        await asyncio.to_thread(self.cache.recheck, entry, pieces)
        fetched = 0
        while True:
            missing = {i for i in pieces if i not in entry.verified}
            if not missing:
                if meter is not None:
                    meter.report(final=True)
                return fetched
            busy = [j for j in entry.jobs if isinstance(j, Job) and j.pieces & missing]
            claimed = set().union(*(j.pieces for j in busy))
            mine = sorted(missing - claimed)
            own: Job | None = None
            if mine:
                try:
                    await asyncio.to_thread(self.cache.make_room, entry.piece_bytes(mine), entry.sha256)
                except CacheFull as e:
                    raise FetchFailed("CacheFull", str(e)) from None
                if origin.from_source:
                    own = Job(self, entry, mine, self.source_target_for(req.source_url), from_source=True)
                else:
                    own = Job(self, entry, mine, self._target(req))
                entry.jobs.add(own)
                own.thread.start()
                busy.append(own)
                self.log.info("weights_fetch_started", sha256=entry.sha256[:16], pieces=len(mine),
                              bytes=entry.piece_bytes(mine), origin="source" if own.from_source else "server")
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
                failed = [(j, j.done.exception()) for j in busy if j.done.exception() is not None]
                for j, error in failed:
                    if not origin.fall_back(j, error, self.log):
                        raise error  # type: ignore[misc]
            finally:
                for j in busy:
                    j.waiters -= 1
                    if j.waiters <= 0 and not j.done.done():
                        j.cancel()


