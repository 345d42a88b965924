"""ArenaNode: the lease table wired to the real memfd, the fd hand-out socket and the log.

Everything runs on one asyncio loop (the spec's single ArenaManager mailbox): servicer methods
and hand-out callbacks call in here synchronously, so table operations never interleave.
"""

from __future__ import annotations

import asyncio
import grp
import os
import time
from collections.abc import Callable

from swactor.arena import fsm, journal
from swactor.arena.config import ArenaConfig
from swactor.arena.errors import ArenaError
from swactor.arena.fsm import ArenaInput, ArenaState
from swactor.arena.handout import HandoutServer
from swactor.arena.memory import PAGE_SIZE, ArenaBootError, ArenaMemory, RingRsAbi
from swactor.arena.model import (
    CancelReason,
    Event,
    Lease,
    LeaseCancelled,
    LeaseRejected,
    ReleaseProof,
    RingLeased,
    RingReclaimed,
    RingRequest,
    StateChanged,
    Stats,
)
from swactor.arena.peercred import PeerCred, authorize, supplementary_groups
from swactor.arena.ringids import RingIdStore, RingIdStoreError
from swactor.arena.table import LeaseTable
from swactor.common import systemd

Terminal = RingLeased | LeaseRejected | LeaseCancelled
STATUS_INTERVAL_S = 0.5


class ArenaNode:
    def __init__(self, config: ArenaConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self.memory: ArenaMemory | None = None
        self._ids: RingIdStore | None = None
        self.table: LeaseTable | None = None
        self.handout: HandoutServer | None = None
        self._waiters: dict[int, asyncio.Queue[Terminal]] = {}
        self._status_pending = False

    # ---- lifecycle ----

    def boot(self) -> None:
        """Booting -> Ready (memfd, truncate, mmap, id store all fine) or Failed with ArenaBootError."""
        cfg = self.config
        try:
            self._ids = RingIdStore(cfg.state_dir)
            self.memory = ArenaMemory(cfg.ceiling_bytes)
        except (RingIdStoreError, ArenaBootError) as e:
            self._boot_failed(str(e))
            raise ArenaBootError(str(e)) from None
        self.table = LeaseTable(
            cfg.ceiling_bytes,
            page_size=PAGE_SIZE,
            abi=RingRsAbi(),
            memory=self.memory,
            next_ring_id=self._ids,
        )
        self.apply(self.table.boot_succeeded(f"memfd of {journal.human_bytes(cfg.ceiling_bytes)} mapped"))

    def _boot_failed(self, detail: str) -> None:
        if self._ids is not None:
            self._ids.close()
        journal.emit(
            StateChanged(
                ArenaState.BOOTING, fsm.transition(ArenaState.BOOTING, ArenaInput.BOOT_FAILED), detail
            )
        )

    async def start_handout(self) -> None:
        assert self.memory is not None
        try:
            gid: int | None = grp.getgrnam(self.config.group).gr_gid
        except KeyError:
            gid = None
        own_uid = os.getuid()

        def allowed(cred: PeerCred) -> str | None:
            return authorize(cred, own_uid=own_uid, group_gid=gid, groups=supplementary_groups(cred.pid))

        self.handout = HandoutServer(
            self.config.fd_socket,
            memfd=self.memory.fd,
            arena_len=self.memory.size,
            page_size=PAGE_SIZE,
            authorize=allowed,
            on_join=lambda h, cred: self.apply(self._t.holder_joined(h, cred.pid, cred.uid)),
            on_disconnect=lambda h: self.apply(self._t.holder_disconnected(h)),
            on_gone=lambda h: self.apply(self._t.holder_gone(h, self._clock())),
        )
        await self.handout.start()

    def shutdown(self, detail: str) -> list[Event]:
        events = self._t.shutdown(detail)
        self.apply(events)
        return events

    async def close(self) -> None:
        if self.handout is not None:
            await self.handout.close()
        if self.memory is not None:
            self.memory.close()
        if self._ids is not None:
            self._ids.close()

    # ---- operations (the servicer's domain calls) ----

    @property
    def _t(self) -> LeaseTable:
        assert self.table is not None, "arena not booted"
        return self.table

    def lease(self, req: RingRequest) -> list[Event]:
        events = self._t.lease(req, self._clock())
        self.apply(events)
        return events

    def watch(self, request_id: int) -> asyncio.Queue[Terminal]:
        """Where the terminal update of a queued request will be put (register before awaiting)."""
        queue: asyncio.Queue[Terminal] = asyncio.Queue(maxsize=1)
        self._waiters[request_id] = queue
        return queue

    def unwatch(self, request_id: int) -> None:
        self._waiters.pop(request_id, None)

    def abandon(self, req: RingRequest, undelivered: Terminal | None) -> None:
        """A LeaseRing stream went away before its answer got out: undo what nobody will ever use."""
        try:
            if undelivered is None:
                self.apply(
                    self._t.cancel(req.request_id, req.holder_id, self._clock(), CancelReason.STREAM_CLOSED)
                )
            elif isinstance(undelivered, RingLeased):
                ring_id = undelivered.layout.ring_id
                self.apply(
                    self._t.release(ring_id, req.holder_id, ReleaseProof.NEVER_INSTALLED, self._clock())
                )
        except ArenaError:
            pass  # already answered, released or its holder is gone: nothing left to undo

    def cancel(self, request_id: int, holder_id: int) -> list[Event]:
        events = self._t.cancel(request_id, holder_id, self._clock())
        self.apply(events)
        return events

    def release(self, ring_id: int, holder_id: int, proof: int, when_detached: bool = False) -> list[Event]:
        events = self._t.release(ring_id, holder_id, proof, self._clock(), when_detached=when_detached)
        self.apply(events)
        return events

    def attach(self, ring_id: int, holder_id: int, role: int) -> Lease:
        lease, events = self._t.attach(ring_id, holder_id, role)
        self.apply(events)
        return lease

    def detach(self, ring_id: int, holder_id: int, proof: int) -> bool:
        events = self._t.detach(ring_id, holder_id, proof, self._clock())
        self.apply(events)
        return any(isinstance(e, RingReclaimed) and e.ring_id == ring_id for e in events)

    def stats(self) -> Stats:
        return self._t.stats()

    def now(self) -> float:
        return self._clock()

    # ---- events ----

    def apply(self, events: list[Event]) -> None:
        for ev in events:
            journal.emit(ev)
            if isinstance(ev, RingLeased | LeaseRejected | LeaseCancelled):
                waiter = self._waiters.get(ev.request.request_id)
                if waiter is not None and waiter.empty():
                    waiter.put_nowait(ev)
        if events:
            self._schedule_status()

    def status_line(self) -> str:
        allocated = self.memory.allocated_bytes() if self.memory is not None else None
        return journal.status_line(self._t.stats(), allocated)

    def _schedule_status(self) -> None:
        """STATUS= at most every STATUS_INTERVAL_S, always ending with the latest numbers."""
        if self._status_pending or not os.environ.get("NOTIFY_SOCKET"):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._status_pending = True

        def flush() -> None:
            self._status_pending = False
            systemd.notify_status(self.status_line())

        loop.call_later(STATUS_INTERVAL_S, flush)
