"""The stage node's weight fetch (docs/distribution.md): the asyncio shell between the
StageController's FetchWeights / CancelFetch actions and the node-wide FetchPool.

One fetch per run being provisioned (runs in flight of the same weights each ask; the pool shares the work); its outcome comes back as StageController inputs (the pool's FetchStarted
and FetchProgress as they are, then WeightsFetched or WeightsFetchFailed) tagged with the run. The lease on the
cache file is held until that run's stage stopped, and the file stays pinned as the worker's
resident weights (never evicted while the compute process maps it) until another file replaces it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Protocol

from swactor.common.events import get_logger
from swactor.distribution.request import FetchProgress, FetchRequest, FetchStarted
from swactor.distribution.stagefetch import FetchFailed, Lease
from swactor.v1 import stage_pb2
from swactor.worker import stage_fsm


class WeightsFetcher(Protocol):
    """swactor.distribution.stagefetch.FetchPool, as the node uses it."""

    async def acquire(self, req: FetchRequest, on_started: Callable[[FetchStarted], None] | None = None,
                      on_progress: Callable[[FetchProgress], None] | None = None) -> Lease: ...

    def release(self, lease: Lease) -> None: ...


StageInput = Callable[[int, stage_fsm.Input], None]


class WeightsShell:
    def __init__(self, pool: WeightsFetcher | None, feed: StageInput) -> None:
        self.pool = pool
        self.feed = feed
        self._tasks: dict[int, asyncio.Task[None]] = {}  # run_id -> its fetch
        self._leases: dict[int, Lease] = {}
        self.log = get_logger(component="stage_weights")

    def fetch(self, run_id: int, req: FetchRequest) -> None:
        self.cancel(run_id)
        self._tasks[run_id] = asyncio.ensure_future(self._run(run_id, req))
        self._tasks[run_id].add_done_callback(lambda t: self._tasks.pop(run_id, None) if self._tasks.get(run_id) is t
                                              else None)

    def cancel(self, run_id: int | None = None) -> None:
        """Cancel run `run_id`'s fetch (None: every fetch)."""
        for rid in list(self._tasks) if run_id is None else [run_id]:
            task = self._tasks.pop(rid, None)
            if task is not None and not task.done():
                task.cancel()

    def release(self, run_id: int) -> None:
        lease = self._leases.pop(run_id, None)
        if lease is not None and self.pool is not None:
            self.pool.release(lease)

    def distrust(self, run_id: int = 0, sha256: str = "") -> None:
        """The run's weights (or the file `sha256`) failed to load or read: the next fetch re-checks the cache
        copy from disk and fetches again what is gone or bad (distribution/cache.py), so the node's next run
        does not fail alike."""
        lease = self._leases.get(run_id)
        cache = getattr(self.pool, "cache", None)
        if cache is not None and (sha256 or lease is not None):
            cache.distrust(sha256 or lease.entry.sha256)  # type: ignore[union-attr]

    async def _run(self, run_id: int, req: FetchRequest) -> None:
        if self.pool is None:
            self.feed(run_id, stage_fsm.WeightsFetchFailed(
                "Unavailable", "this node has no weights cache configured, so it cannot fetch from a URL"))
            return
        report = partial(self.feed, run_id)
        try:
            lease = await self.pool.acquire(req, report, report)
        except FetchFailed as e:
            if e.reason == "CacheIo":
                self.distrust(sha256=req.sha256)
            self.feed(run_id, stage_fsm.WeightsFetchFailed(e.reason, e.detail))
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must still fault the stage, by name
            self.log.exception("weights_fetch_crashed", run_id=run_id)
            self.feed(run_id, stage_fsm.WeightsFetchFailed("Internal", f"{type(e).__name__}: {e}"))
            return
        self._leases[run_id] = lease
        pinned = getattr(getattr(self.pool, "cache", None), "pinned", None)
        if isinstance(pinned, set):
            pinned.clear()
            pinned.add(lease.entry.sha256)
        self.feed(run_id, stage_fsm.WeightsFetched(lease.path, lease.bytes_total, lease.bytes_fetched, lease.seconds))


def cache_listing(pool: WeightsFetcher | None) -> stage_pb2.ListWeightsResponse:
    """What the node's weights cache holds (StageControl.ListWeights)."""
    cache = getattr(pool, "cache", None)
    if cache is None:
        return stage_pb2.ListWeightsResponse()
    out = stage_pb2.ListWeightsResponse(limit_bytes=cache.limit_bytes, used_bytes=cache.used_bytes(),
                                        cache_dir=str(cache.root))
    for e in cache.listing():
        held = e.verified | e.claimed
        out.files.add(sha256=e.sha256, size=e.manifest.size, bytes_held=e.held_bytes, pieces_held=len(held),
                      pieces_total=len(e.manifest.pieces), last_used_us=e.last_used_us,
                      in_use=bool(e.users or e.jobs or e.sha256 in cache.pinned),
                      bytes_fetching=sum(getattr(j, "remaining_bytes", 0) for j in list(e.jobs)))
    return out
