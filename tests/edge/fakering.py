"""An in-process stand-in for a ring-rs ring (unit tests only): bytearray data, pending-bit wakes.

`FakeRing` has ring-rs' handle API (the test drives the far end with it) and the same pending-bit
wake protocol; `FakeProducerEnd` / `FakeConsumerEnd` give the driver's pumps the
`swactor.common.ringport` end API over it, so the pumps are tested in one process without the arena.
A wake signals an eventfd (for drivers on an event loop), or with `eventfds=False` only sets
`readable_signal` / `writable_signal` (for the core tests, which deliver wakes themselves).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from swactor.common.ringerrors import RingBroken, RingClosed
from swactor.v1 import common_pb2 as pb


class FakeRing:
    def __init__(self, ring_id: int, capacity: int, *, eventfds: bool = True) -> None:
        self.ring_id = ring_id
        self.capacity = capacity
        self.buf = bytearray(capacity)
        self.commit = 0
        self.consume = 0
        self.state = "open"
        flags = os.EFD_NONBLOCK | os.EFD_CLOEXEC
        self.readable_fd = os.eventfd(0, flags) if eventfds else -1
        self.writable_fd = os.eventfd(0, flags) if eventfds else -1
        self.readable_signal = False  # the consumer was woken and has not acked yet
        self.writable_signal = False
        self._consumer_waiting = False
        self._producer_waiting = False
        self.released = False

    def _wake_consumer(self) -> None:
        self.readable_signal = True
        if self.readable_fd >= 0:
            os.eventfd_write(self.readable_fd, 1)

    def _wake_producer(self) -> None:
        self.writable_signal = True
        if self.writable_fd >= 0:
            os.eventfd_write(self.writable_fd, 1)

    # -- producer --
    def free(self) -> int:
        self._check()
        return self.capacity - (self.commit - self.consume)

    def write(self, data: bytes | memoryview) -> int:
        self._check()
        n = min(len(data), self.free())
        done = 0
        while done < n:
            idx = (self.commit + done) % self.capacity
            k = min(n - done, self.capacity - idx)
            self.buf[idx : idx + k] = data[done : done + k]
            done += k
        self.commit += n
        if n and self._consumer_waiting:
            self._consumer_waiting = False
            self._wake_consumer()
        return n

    def arm_writable(self) -> bool:
        if self.state != "open" or self.free() > 0:
            return True
        self._producer_waiting = True
        return False

    def ack_writable(self) -> None:
        self.writable_signal = False
        if self.writable_fd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self.writable_fd)

    def close(self) -> None:
        if self.state == "open":
            self.state = "closed"
        self._wake_consumer()
        self._wake_producer()

    def fault(self) -> None:
        self.state = "faulted"
        self._wake_consumer()
        self._wake_producer()

    def release(self) -> None:
        self.released = True

    # -- consumer --
    def avail(self) -> int:
        return self.commit - self.consume

    def readable_view(self, max_bytes: int) -> memoryview:
        self._check()
        avail = self.avail()
        if avail == 0 and self.state == "closed":
            raise RingClosed(f"ring {self.ring_id} closed")
        idx = self.consume % self.capacity
        n = min(avail, self.capacity - idx, max_bytes)
        return memoryview(self.buf)[idx : idx + n]

    def advance_consume(self, n: int) -> None:
        assert 0 <= n <= self.avail()
        self.consume += n
        if n and self._producer_waiting:
            self._producer_waiting = False
            self._wake_producer()

    def arm_readable(self) -> bool:
        if self.state != "open" or self.avail() > 0:
            return True
        self._consumer_waiting = True
        return False

    def ack_readable(self) -> None:
        self.readable_signal = False
        if self.readable_fd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self.readable_fd)

    def read(self, max_bytes: int) -> bytes:
        """Test-side consumer helper: copy out and consume up to max_bytes."""
        out = bytearray()
        while len(out) < max_bytes:
            view = self.readable_view(max_bytes - len(out))
            if not view:
                break
            out += view
            self.advance_consume(len(view))
        return bytes(out)

    def _check(self) -> None:
        if self.state == "faulted":
            raise RingBroken(pb.RING_FAULT_RING_STATE_INVALID, f"ring {self.ring_id} is faulted")


class _FakeEnd:
    wake_shared = True  # both sides of a FakeRing signal the same eventfds

    def __init__(self, ring: FakeRing) -> None:
        self.ring = ring
        self.ring_id, self.capacity = ring.ring_id, ring.capacity

    def is_open(self) -> bool:
        return self.ring.state == "open"


class FakeProducerEnd(_FakeEnd):
    """ringport.ProducerEnd over a FakeRing: the recv pump's side."""

    def fileno(self) -> int:
        return self.ring.writable_fd

    def free(self) -> int:
        return self.ring.free()

    def write(self, data: bytes | memoryview) -> int:
        return self.ring.write(data)

    def arm_wait(self) -> int | None:
        return None if self.ring.arm_writable() else self.ring.writable_fd

    def ack(self) -> None:
        self.ring.ack_writable()

    def close_stream(self) -> None:
        self.ring.close()

    def release(self) -> None:
        self.ring.release()


class FakeConsumerEnd(_FakeEnd):
    """ringport.ConsumerEnd over a FakeRing: the send pump's side."""

    def fileno(self) -> int:
        return self.ring.readable_fd

    def readable(self, max_bytes: int) -> memoryview:
        return self.ring.readable_view(max_bytes)

    def advance_consume(self, n: int) -> None:
        self.ring.advance_consume(n)

    def arm_wait(self) -> int | None:
        return None if self.ring.arm_readable() else self.ring.readable_fd

    def ack(self) -> None:
        self.ring.ack_readable()

    def release(self) -> None:
        self.ring.release()


class FakeRingSource:
    def __init__(self) -> None:
        self.rings: dict[int, FakeRing] = {}

    def add(self, ring: FakeRing) -> FakeRing:
        self.rings[ring.ring_id] = ring
        return ring

    def _get(self, ring_id: int) -> FakeRing:
        try:
            return self.rings[ring_id]
        except KeyError:
            raise KeyError(f"no ring {ring_id}") from None

    async def open_producer(self, ring_id: int, layout: object) -> FakeProducerEnd:
        return FakeProducerEnd(self._get(ring_id))

    async def open_consumer(self, ring_id: int, layout: object) -> FakeConsumerEnd:
        return FakeConsumerEnd(self._get(ring_id))


async def wait_fd(fd: int) -> None:
    """Wait until `fd` is readable (one wake hint)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        loop.remove_reader(fd)


async def produce_all(ring: FakeRing, data: bytes) -> None:
    """Test-side worker: write all of `data` into an egress ring, waiting for space."""
    view = memoryview(data)
    while view:
        n = ring.write(view)
        view = view[n:]
        if view and not ring.arm_writable():
            await wait_fd(ring.writable_fd)
            ring.ack_writable()
