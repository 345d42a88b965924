"""The worker's side of the native ring helper (spec §22): `swactor_ring` behind `objects`' interfaces.

Python does no cursor arithmetic here: spans, advances, state and wake bits are ring-rs calls.
A span is exported as a memoryview and released before the cursor advances (ring-rs refuses to
advance under a live export). Ring-rs errors become `RingBroken` with the §37 RingFaultReason.
"""

from __future__ import annotations

from typing import Any

import swactor_ring as sr
from swactor.edgeend.objects import HeaderFacts, HeaderInvalid, RingBroken
from swactor.edgeend.shapes import Layout

# The ring helper ABI this worker speaks: ring-rs' header version (RING_VERSION).
ABI_VERSION: int = sr.RING_VERSION


def map_arena(fd: int, size: int) -> Any:
    return sr.Arena.from_fd(fd, size)


def native_layout(layout: Layout) -> Any:
    return sr.RingLayout(layout.ring_id, layout.arena_offset, layout.total_len, layout.header_offset,
                         layout.data_offset, layout.data_capacity, layout.alignment)


def _broken(e: Exception) -> RingBroken:
    if isinstance(e, sr.RingClosedError):
        return RingBroken("RingStateInvalid", f"ring is {getattr(e, 'state', 'not open')}: {e}")
    reason = getattr(e, "reason", None) or "RingStateInvalid"
    return RingBroken(reason, str(e))


class RingHeaderCodec:
    """`objects.HeaderCodec` over ring-rs' ObjectHeader; extent rules are checked by ObjectRules."""

    header_len: int = sr.OBJECT_HEADER_LEN

    def parse(self, data: bytes) -> HeaderFacts:
        try:
            h = sr.ObjectHeader.parse(data, 2**64 - 1, 1)
        except sr.ObjectError as e:
            raise HeaderInvalid(e.failure, str(e)) from None
        return HeaderFacts(h.object_id, h.sequence, h.extent, h.flags)

    def encode(self, facts: HeaderFacts) -> bytes:
        return bytes(sr.ObjectHeader(facts.object_id, facts.sequence, facts.extent, facts.flags).encode())


HEADER_CODEC = RingHeaderCodec()


class _End:
    def __init__(self, handle: Any, arena: Any, layout: Layout) -> None:
        self.h = handle
        self.arena = arena
        self.layout = layout
        self.ring_id: int = handle.ring_id
        self._view: memoryview | None = None

    def _release_view(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None

    def _span(self, span: Any) -> memoryview:
        self._release_view()
        self._view = memoryview(span) if len(span) else memoryview(b"")
        return self._view

    def close(self) -> None:
        self._release_view()
        self.h = None

    def reopen(self, readable_fd: int, writable_fd: int) -> None:
        """Swap in a handle that shares the peer's eventfds. Cursors live in the shared header and
        this adapter never holds a reservation across calls, so nothing is lost."""
        self._release_view()
        self.h = type(self.h)(self.arena, native_layout(self.layout), readable_fd=readable_fd,
                              writable_fd=writable_fd)


class ConsumerEnd(_End):
    """objects.ReadRing for an ingress ring."""

    def readable(self) -> memoryview:
        try:
            return self._span(self.h.readable_span())
        except (sr.RingError, BufferError) as e:
            raise _broken(e) from None

    def advance_consume(self, n: int) -> None:
        self._release_view()
        try:
            self.h.advance_consume(n)
        except sr.RingError as e:
            raise _broken(e) from None

    def producer_closed(self) -> bool:
        try:
            state = self.h.state
        except sr.RingError as e:
            raise _broken(e) from None
        if state == sr.RingState.FAULTED:
            raise RingBroken("RingStateInvalid", "peer marked the ring faulted")
        return bool(state == sr.RingState.CLOSED)

    def arm_wait(self) -> int | None:
        """Set the consumer-waiting bit; the fd to poll, or None when bytes are readable now."""
        try:
            return None if self.h.arm_readable() else int(self.h.fileno())
        except sr.RingError:
            return None  # progress() will surface the fault

    def ack(self) -> None:
        self.h.ack_wake()


class ProducerEnd(_End):
    """objects.WriteRing for an egress ring."""

    def writable(self) -> memoryview:
        try:
            return self._span(self.h.writable_span())
        except (sr.RingError, BufferError) as e:
            raise _broken(e) from None

    def advance_commit(self, n: int) -> None:
        self._release_view()
        try:
            self.h.advance_commit(n)
        except sr.RingError as e:
            raise _broken(e) from None

    def arm_wait(self) -> int | None:
        try:
            return None if self.h.arm_writable() else int(self.h.fileno())
        except sr.RingError:
            return None

    def ack(self) -> None:
        self.h.ack_wake()


def open_consumer(arena: Any, layout: Layout, *, readable_fd: int | None = None,
                  writable_fd: int | None = None) -> ConsumerEnd:
    try:
        return ConsumerEnd(sr.Consumer(arena, native_layout(layout), readable_fd=readable_fd,
                                       writable_fd=writable_fd), arena, layout)
    except (sr.RingError, ValueError, OSError) as e:
        raise RingBroken(getattr(e, "reason", None) or "RingLayoutInvalid", str(e)) from None


def open_producer(arena: Any, layout: Layout, *, readable_fd: int | None = None,
                  writable_fd: int | None = None) -> ProducerEnd:
    try:
        return ProducerEnd(sr.Producer(arena, native_layout(layout), readable_fd=readable_fd,
                                       writable_fd=writable_fd), arena, layout)
    except (sr.RingError, ValueError, OSError) as e:
        raise RingBroken(getattr(e, "reason", None) or "RingLayoutInvalid", str(e)) from None
