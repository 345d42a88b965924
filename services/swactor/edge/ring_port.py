"""The narrow interface the pumps need from a ring (ring-rs `swactor_ring`), and its adapter.

Pumps never do cursor arithmetic: `free`, `write`, `readable_view` and the advance calls run in
ring-rs. Wake hints are eventfds polled with loop.add_reader: a pump calls `arm_*` (ring-rs sets
the pending bit, or says "ready now"), sleeps on the fd, and `ack_*` drains it when woken.
"""

from __future__ import annotations

from typing import Protocol


class RingFault(RuntimeError):
    """The ring is faulted or its state is invalid (maps to STREAM_FAULT_RING_FAULT)."""


class RingClosed(RuntimeError):
    """The other side closed the ring (a producer's end of data)."""


class ProducerPort(Protocol):
    """The recv-pump's side of an ingress ring."""

    ring_id: int
    capacity: int
    writable_fd: int

    def free(self) -> int: ...

    def write(self, data: bytes | memoryview) -> int:
        """Copy as much of `data` as fits (across the wrap), publish commit; bytes written."""
        ...

    def arm_writable(self) -> bool:
        """True when space (or a state change) is there now; else the wake bit is set."""
        ...

    def ack_writable(self) -> None: ...

    def close(self) -> None:
        """End of stream: the consumer sees the ring closed after the committed bytes."""
        ...

    def fault(self) -> None: ...

    def release(self) -> None:
        """Drop the handle; after this the pump never touches ring memory (PumpStopped)."""
        ...


class ConsumerPort(Protocol):
    """The send-pump's side of an egress ring."""

    ring_id: int
    capacity: int
    readable_fd: int

    def readable_view(self, max_bytes: int) -> memoryview:
        """Committed bytes from the consume cursor, one contiguous span (may be empty).
        Raises RingFault; an empty view on a closed ring raises RingClosed."""
        ...

    def advance_consume(self, n: int) -> None: ...

    def arm_readable(self) -> bool: ...

    def ack_readable(self) -> None: ...

    def fault(self) -> None: ...

    def release(self) -> None: ...


class RingSource(Protocol):
    """Opens pump-side handles for rings leased on this host (arena mapping + eventfds)."""

    async def open_producer(self, ring_id: int, layout: object) -> ProducerPort: ...

    async def open_consumer(self, ring_id: int, layout: object) -> ConsumerPort: ...
