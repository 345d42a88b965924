"""The rings this driver pumps: attached in the host arena, opened as `swactor.common.ringport` ends.

The driver is one holder of the arena (swactor.arena.client): it maps the arena once, attaches
to each ring it pumps (AttachRing role PUMP) and detaches with proof PUMP_STOPPED when the pump
releases the ring after StopEdge. Each pumped ring gets a fresh pair of wake eventfds; the ring's
other process (worker, token endpoint, test client) fetches them from the wake-fd socket
(wakefd.py) and opens its own end with them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import swactor_ring as sr
from swactor.common.events import get_logger
from swactor.common.ringport import ConsumerEnd, ProducerEnd, open_consumer, open_producer
from swactor.v1 import arena_pb2, common_pb2

if TYPE_CHECKING:
    from swactor.arena.client import ArenaHold, AsyncArenaClient

log = get_logger(component="COMPONENT_EDGE_DRIVER")


class RingSource(Protocol):
    """Opens pump-side ends of rings leased on this host (arena mapping + eventfds)."""

    async def open_producer(self, ring_id: int, layout: common_pb2.RingLayout) -> ProducerEnd: ...

    async def open_consumer(self, ring_id: int, layout: common_pb2.RingLayout) -> ConsumerEnd: ...


class WakeFds:
    """The readable/writable eventfds of the rings this driver pumps, for the wake-fd socket."""

    def __init__(self) -> None:
        self.by_ring: dict[int, tuple[int, int]] = {}

    def create(self, ring_id: int) -> tuple[int, int]:
        self.drop(ring_id)
        fds = (sr.eventfd(), sr.eventfd())
        self.by_ring[ring_id] = fds
        return fds

    def drop(self, ring_id: int) -> None:
        for fd in self.by_ring.pop(ring_id, ()):
            os.close(fd)


class ArenaRingSource:
    """RingSource over the host arena: attach, open with fresh wake eventfds, detach on release."""

    def __init__(self, hold: ArenaHold, client: AsyncArenaClient) -> None:
        self.hold = hold
        self.client = client
        self.arena = hold.map()
        self.wake = WakeFds()
        self._tasks: set[asyncio.Task[None]] = set()

    async def _attach(self, ring_id: int, layout: common_pb2.RingLayout) -> common_pb2.RingLayout:
        attached = await self.client.attach(ring_id, arena_pb2.ATTACH_ROLE_PUMP)
        if layout.ByteSize() and attached != layout:
            await self.client.detach(ring_id, arena_pb2.DETACH_PROOF_PUMP_STOPPED)
            raise ValueError(f"ring {ring_id}: layout in the request differs from the arena's lease")
        return attached

    async def open_producer(self, ring_id: int, layout: common_pb2.RingLayout) -> ProducerEnd:
        return await self._open(open_producer, ring_id, layout)

    async def open_consumer(self, ring_id: int, layout: common_pb2.RingLayout) -> ConsumerEnd:
        return await self._open(open_consumer, ring_id, layout)

    async def _open(self, opener: Callable[..., Any], ring_id: int, layout: common_pb2.RingLayout) -> Any:
        attached = await self._attach(ring_id, layout)
        rfd, wfd = self.wake.create(ring_id)
        try:
            return opener(self.arena, attached, readable_fd=rfd, writable_fd=wfd, on_release=self._release)
        except Exception:
            self._release(ring_id)
            raise

    def _release(self, ring_id: int) -> None:
        self.wake.drop(ring_id)
        task = asyncio.ensure_future(self._detach(ring_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _detach(self, ring_id: int) -> None:
        try:
            await self.client.detach(ring_id, arena_pb2.DETACH_PROOF_PUMP_STOPPED)
        except Exception as e:  # the arena may be gone at shutdown; the holder exit reclaims
            log.warning("edge.ring_detach_failed", ring_id=ring_id, detail=str(e))

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()
