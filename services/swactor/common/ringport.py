"""The one Python face of a ring end (spec §21-22): `swactor_ring` handles behind one adapter with one
error type, for every process that touches a ring: the edge-driver's pumps, the compute process and
the orchestrator's token endpoints.

    end = open_consumer(arena, layout, readable_fd=r, writable_fd=w)   # or open_producer
    span = end.readable(max_bytes)     # zero-copy memoryview (may be empty); RingClosed at the end
    end.advance_consume(len(span))     # the span is released first: ring-rs refuses to advance under it
    fd = end.arm_wait()                # None: progress is possible now; else poll fd, then end.ack()
    lost = await wait_ready(end)       # the same on an event loop, looked at again every WAKE_CHECK_S

Python does no cursor arithmetic: spans, advances, state and wake bits are ring-rs calls. Every
ring-rs failure of a ring end becomes `RingBroken(reason, detail)` with the §37 RingFaultReason;
the orderly end of a producer's data is `RingClosed`, which is not an error (both in `ringerrors`).

A sleeping end is also looked at again every WAKE_CHECK_S: an end that can progress while its eventfd
was never signalled lost its wake-up (`wake_lost`: the other end's process signals other eventfds, or a
signal went missing), and every process that sleeps on ring eventfds says so as `ring_wake_missed` and
goes on, so a lost wake-up costs that interval instead of a run (the edge driver's pumps, the compute
process's loop, the orchestrator's token endpoints).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable
from typing import Any, TypeVar

import swactor_ring as sr
from swactor.common.reasons import from_ring_rs
from swactor.common.ringerrors import RingBroken, RingClosed
from swactor.v1 import common_pb2 as pb

# The ring helper ABI this runtime speaks: ring-rs' header version (RING_VERSION).
ABI_VERSION: int = sr.RING_VERSION

_E = TypeVar("_E", bound="_End")
WAKE_CHECK_S = 1.0  # how often an end asleep on its eventfd is looked at again without a signal


def map_arena(fd: int, size: int) -> Any:
    return sr.Arena.from_fd(fd, size)


def native_layout(layout: Any) -> Any:
    """ring-rs' RingLayout of any §18 layout value with its seven fields (`common.layout.Layout`, a
    common.proto RingLayout)."""
    return sr.RingLayout(layout.ring_id, layout.arena_offset, layout.total_len, layout.header_offset,
                         layout.data_offset, layout.data_capacity, layout.alignment)


def broken(e: Exception, default_reason: int = pb.RING_FAULT_RING_STATE_INVALID) -> RingBroken:
    """A ring-rs (or buffer) error as RingBroken, keeping ring-rs' RingFaultReason when it names one."""
    if isinstance(e, sr.RingClosedError):
        return RingBroken(pb.RING_FAULT_RING_STATE_INVALID, f"ring is {getattr(e, 'state', 'not open')}: {e}")
    return RingBroken(from_ring_rs(pb.RingFaultReason, getattr(e, "reason", None), default_reason), str(e))


class _End:
    """What both ends share: the handle, its eventfds, the live span export, release and reopen."""

    _ARM: str  # the ring-rs call that sets this side's waiting bit

    def __init__(self, handle: Any, arena: Any, layout: Any, on_release: Callable[[int], None] | None,
                 wake_shared: bool = False) -> None:
        self._h: Any = handle
        self.arena = arena
        self.layout = layout
        self.ring_id: int = handle.ring_id
        self.capacity: int = handle.capacity
        self._on_release = on_release
        self._view: memoryview | None = None
        self.wake_shared = wake_shared  # its eventfds are the other end's too (opened or reopened on given ones)

    def _handle(self) -> Any:
        if self._h is None:
            raise RingBroken(pb.RING_FAULT_RING_STATE_INVALID, f"ring {self.ring_id}: handle already released")
        return self._h

    def _do(self, op: str, *args: Any) -> Any:
        """ring-rs handle method `op`; its errors (and BufferError: a span still exported) as RingBroken."""
        try:
            return getattr(self._handle(), op)(*args)
        except (sr.RingError, BufferError) as e:
            raise broken(e) from None

    def _release_view(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None

    def _span(self, span: Any) -> memoryview:
        self._release_view()
        self._view = memoryview(span) if len(span) else memoryview(b"")
        return self._view

    @property
    def readable_fd(self) -> int:
        """The eventfd the producer signals and the consumer sleeps on (share it with the other end)."""
        return int(self._handle().readable_fd)

    @property
    def writable_fd(self) -> int:
        """The eventfd the consumer signals and the producer sleeps on."""
        return int(self._handle().writable_fd)

    def fileno(self) -> int:
        """The eventfd this side sleeps on (the producer's writable fd, the consumer's readable fd)."""
        return int(self._handle().fileno())

    def arm_wait(self) -> int | None:
        """Set this side's waiting bit: the fd to poll, or None when progress is possible now. A
        broken ring also answers None: the next span or advance raises its RingBroken."""
        try:
            return None if self._do(self._ARM) else int(self._handle().fileno())
        except RingBroken:
            return None

    def ack(self) -> None:
        """Drain this side's eventfd after a wake."""
        if self._h is not None:
            self._h.ack_wake()

    def reopen(self, readable_fd: int, writable_fd: int) -> None:
        """Swap in a handle that shares the peer's eventfds. Cursors live in the shared header and
        this adapter never holds a reservation across calls, so nothing is lost."""
        self._release_view()
        self._h = type(self._handle())(self.arena, native_layout(self.layout), readable_fd=readable_fd,
                                       writable_fd=writable_fd)
        self.wake_shared = True

    def is_open(self) -> bool:
        """The ring is Open (not closed, faulted, corrupt or released)."""
        try:
            return bool(self._handle().state == sr.RingState.OPEN)
        except (sr.RingError, RingBroken):
            return False

    def release(self) -> None:
        """Drop the handle: after this the end never touches ring memory again."""
        self._release_view()
        if self._h is not None:
            self._h = None
            if self._on_release is not None:
                self._on_release(self.ring_id)


class ConsumerEnd(_End):
    """The consumer of a ring: `objects.ReadRing` for the compute process and the token-out
    endpoint, the ring side of the edge-driver's send pump."""

    _ARM = "arm_readable"

    def readable(self, max_bytes: int | None = None) -> memoryview:
        """Committed bytes at the consume cursor, one contiguous span (may be empty). Raises
        RingClosed once the producer closed the ring and nothing is left to read."""
        h = self._handle()
        try:
            span = h.readable_span(max_bytes)
            if not len(span) and h.state == sr.RingState.CLOSED:
                # Closed after its last commit: a span read now holds every byte there will be.
                span = h.readable_span(max_bytes)
                if not len(span):
                    raise RingClosed(f"ring {self.ring_id} closed by its producer")
            return self._span(span)
        except (sr.RingError, BufferError) as e:
            raise broken(e) from None

    def advance_consume(self, n: int) -> None:
        self._release_view()
        self._do("advance_consume", n)


class ProducerEnd(_End):
    """The producer of a ring: `objects.WriteRing` for the compute process and the token-in
    endpoint, the ring side of the edge-driver's recv pump."""

    _ARM = "arm_writable"

    def writable(self, max_bytes: int | None = None) -> memoryview:
        """Free bytes at the write cursor, one contiguous span (may be empty)."""
        return self._span(self._do("writable_span", max_bytes))

    def advance_commit(self, n: int) -> None:
        self._release_view()
        self._do("advance_commit", n)

    def free(self) -> int:
        return int(self._do("free"))

    def write(self, data: bytes | memoryview) -> int:
        """Copy as much of `data` as fits (across the wrap) and commit it; the bytes written."""
        return int(self._do("write", data))

    def close_stream(self) -> None:
        """Open -> Closed, the orderly end of data: the consumer reads the committed bytes, then RingClosed."""
        self._do("close")


def _open(end: type[_E], handle: Any, arena: Any, layout: Any, readable_fd: int | None, writable_fd: int | None,
          on_release: Callable[[int], None] | None) -> _E:
    try:
        h = handle(arena, native_layout(layout), readable_fd=readable_fd, writable_fd=writable_fd)
    except (sr.RingError, ValueError, OSError) as e:
        raise broken(e, pb.RING_FAULT_RING_LAYOUT_INVALID) from None
    return end(h, arena, layout, on_release, wake_shared=readable_fd is not None)


def open_consumer(arena: Any, layout: Any, *, readable_fd: int | None = None, writable_fd: int | None = None,
                  on_release: Callable[[int], None] | None = None) -> ConsumerEnd:
    """The consumer end of the ring at `layout` in `arena`; eventfds are dup'ed (None: fresh ones).
    `on_release(ring_id)` runs once when the end is released."""
    return _open(ConsumerEnd, sr.Consumer, arena, layout, readable_fd, writable_fd, on_release)


def open_producer(arena: Any, layout: Any, *, readable_fd: int | None = None, writable_fd: int | None = None,
                  on_release: Callable[[int], None] | None = None) -> ProducerEnd:
    """The producer end of the ring at `layout` in `arena`; as open_consumer."""
    return _open(ProducerEnd, sr.Producer, arena, layout, readable_fd, writable_fd, on_release)


def signalled(fd: int) -> bool:
    """Whether the eventfd holds a wake-up nobody has taken yet."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def wake_lost(end: _End, fd: int) -> bool:
    """`end`, armed on `fd`, was just found able to progress: whether that is a lost wake-up. It is when the
    other end could have signalled it (the eventfds are shared), `fd` holds no signal, and the ring is still
    open. Not one: eventfds still private (the other end signals its own; the share makes the owner look
    again), or a ring that broke without a signal (corrupted, released)."""
    return end.wake_shared and not signalled(fd) and end.is_open()


def _settle(woke: asyncio.Future[None]) -> None:
    if not woke.done():
        woke.set_result(None)


async def wait_ready(end: _End) -> bool:
    """Sleep on the event loop until `end` can progress (or is broken: its next call raises). True when
    the WAKE_CHECK_S look found the progress and it was a lost wake-up (`wake_lost`), which the caller
    reports."""
    loop = asyncio.get_running_loop()
    while (fd := end.arm_wait()) is not None:
        woke = loop.create_future()
        loop.add_reader(fd, _settle, woke)
        try:
            await asyncio.wait_for(woke, WAKE_CHECK_S)
        except TimeoutError:
            if end.arm_wait() is not None:
                continue  # nothing to do yet: sleep on
            if wake_lost(end, fd):
                return True
        finally:
            loop.remove_reader(fd)
        end.ack()  # a signal, or one that came with the timeout
        return False
    return False
