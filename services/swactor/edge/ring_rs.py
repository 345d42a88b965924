"""ring_port implemented with ring-rs (`swactor_ring`) over the arena memfd from the arena-manager.

The driver is one holder of the arena (swactor.arena.client): it maps the arena once, attaches
to each ring it pumps (AttachRing role PUMP) and detaches with proof PUMP_STOPPED after StopEdge.
Each pumped ring gets a fresh pair of wake eventfds; the ring's other process (worker, test
client) fetches them from the wake-fd socket (wakefd.py) and opens its handle with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import swactor_ring as sr
from swactor.common.events import get_logger
from swactor.edge.ring_port import RingClosed, RingFault
from swactor.v1 import arena_pb2, common_pb2

if TYPE_CHECKING:
    from swactor.arena.client import ArenaHold, AsyncArenaClient

log = get_logger(component="COMPONENT_EDGE_DRIVER")


def _fault(e: Exception) -> RingFault:
    return RingFault(str(e))


@contextlib.contextmanager
def _ring_errors_as_faults() -> Iterator[None]:
    """The pumps see one error type for a broken ring, whatever ring-rs called it."""
    try:
        yield
    except sr.RingError as e:
        raise _fault(e) from None


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


class RingRsProducer:
    """ProducerPort over swactor_ring.Producer (the recv-pump writes the ingress ring)."""

    def __init__(self, handle: sr.Producer, on_release: object) -> None:
        self._h: sr.Producer | None = handle
        self.ring_id = handle.ring_id
        self.capacity = handle.capacity
        self.writable_fd = handle.writable_fd
        self._on_release = on_release

    def _handle(self) -> sr.Producer:
        if self._h is None:
            raise RingFault(f"ring {self.ring_id} handle already released")
        return self._h

    def free(self) -> int:
        with _ring_errors_as_faults():
            return self._handle().free()

    def write(self, data: bytes | memoryview) -> int:
        with _ring_errors_as_faults():
            return self._handle().write(data)

    def arm_writable(self) -> bool:
        with _ring_errors_as_faults():
            return self._handle().arm_writable()

    def ack_writable(self) -> None:
        if self._h is not None:
            self._h.ack_wake()

    def close(self) -> None:
        if self._h is not None:
            try:
                self._h.close()
            except sr.RingError as e:
                log.warning("edge.ring_close_failed", ring_id=self.ring_id, detail=str(e))

    def fault(self) -> None:
        if self._h is not None:
            self._h.fault()

    def release(self) -> None:
        self._h = None
        self._on_release(self.ring_id)  # type: ignore[operator]


class RingRsConsumer:
    """ConsumerPort over swactor_ring.Consumer (the send-pump drains the egress ring)."""

    def __init__(self, handle: sr.Consumer, on_release: object) -> None:
        self._h: sr.Consumer | None = handle
        self.ring_id = handle.ring_id
        self.capacity = handle.capacity
        self.readable_fd = handle.readable_fd
        self._on_release = on_release

    def _handle(self) -> sr.Consumer:
        if self._h is None:
            raise RingFault(f"ring {self.ring_id} handle already released")
        return self._h

    def readable_view(self, max_bytes: int) -> memoryview:
        h = self._handle()
        try:
            span = h.readable_span(max_bytes)
        except sr.RingClosedError as e:
            if e.state == "closed":
                raise RingClosed(str(e)) from None
            raise _fault(e) from None
        except sr.RingError as e:
            raise _fault(e) from None
        if len(span) == 0 and h.state == sr.RingState.CLOSED:
            raise RingClosed(f"ring {self.ring_id} closed by its producer")
        return memoryview(span)

    def advance_consume(self, n: int) -> None:
        with _ring_errors_as_faults():
            self._handle().advance_consume(n)

    def arm_readable(self) -> bool:
        with _ring_errors_as_faults():
            return self._handle().arm_readable()

    def ack_readable(self) -> None:
        if self._h is not None:
            self._h.ack_wake()

    def fault(self) -> None:
        if self._h is not None:
            self._h.fault()

    def release(self) -> None:
        self._h = None
        self._on_release(self.ring_id)  # type: ignore[operator]


class ArenaRingSource:
    """RingSource over the host arena: attach, open with fresh wake eventfds, detach on release."""

    def __init__(self, hold: ArenaHold, client: AsyncArenaClient) -> None:
        self.hold = hold
        self.client = client
        self.arena = hold.map()
        self.wake = WakeFds()
        self._tasks: set[asyncio.Task[None]] = set()

    async def _layout(self, ring_id: int, layout: common_pb2.RingLayout) -> sr.RingLayout:
        from swactor.arena.client import ring_layout

        attached = await self.client.attach(ring_id, arena_pb2.ATTACH_ROLE_PUMP)
        if layout.ByteSize() and attached != layout:
            await self.client.detach(ring_id, arena_pb2.DETACH_PROOF_PUMP_STOPPED)
            raise ValueError(f"ring {ring_id}: layout in the request differs from the arena's lease")
        native = ring_layout(attached)
        native.validate(self.arena.size)
        return native

    async def open_producer(self, ring_id: int, layout: common_pb2.RingLayout) -> RingRsProducer:
        native = await self._layout(ring_id, layout)
        rfd, wfd = self.wake.create(ring_id)
        try:
            handle = sr.Producer(self.arena, native, readable_fd=rfd, writable_fd=wfd)
        except sr.RingError:
            self._release(ring_id)
            raise
        return RingRsProducer(handle, self._release)

    async def open_consumer(self, ring_id: int, layout: common_pb2.RingLayout) -> RingRsConsumer:
        native = await self._layout(ring_id, layout)
        rfd, wfd = self.wake.create(ring_id)
        try:
            handle = sr.Consumer(self.arena, native, readable_fd=rfd, writable_fd=wfd)
        except sr.RingError:
            self._release(ring_id)
            raise
        return RingRsConsumer(handle, self._release)

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
