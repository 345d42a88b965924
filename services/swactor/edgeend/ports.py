"""What an edge's owner (the stage node, the orchestrator's token endpoints) needs from the local
arena-manager and edge-driver, as narrow async interfaces.

Real implementations (adapters.py) talk to the arena-manager (swactor.arena.client) and the
edge-driver (edge.proto over its Unix socket, wake eventfds from its wake-fd socket). Tests plug
in in-memory fakes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from swactor.common.layout import Layout
from swactor.edgeend import establisher as est

# A lease's outcome is the establisher's input as it is; None: the lease was cancelled (the core
# asked for that itself: nothing to tell it).
LeaseOutcome = est.RingLeased | est.RingLeaseRejected | None


class ArenaPort(Protocol):
    async def lease(self, request_id: int, edge_id: int, direction: str, ring_spec: Any) -> LeaseOutcome: ...

    async def cancel(self, request_id: int) -> None: ...

    async def attach_worker(self, ring_id: int) -> None:
        """The compute process is about to touch the ring (AttachRing WORKER_RING)."""

    async def detach_worker(self, ring_id: int) -> None:
        """The ring quiesced in the compute process, or the process is gone."""

    async def release(self, ring_id: int, never_installed: bool) -> None: ...


DriverEvent = est.DriverEdgeReady | est.StreamFault | est.StreamClosed | est.PumpStopped


class DriverPort(Protocol):
    async def establish_send(self, edge_id: int, rx_node_id: int, layout: Layout) -> None: ...

    async def establish_recv(self, edge_id: int, tx_node_id: int, layout: Layout) -> None:
        """Receive `edge_id` from node `tx_node_id` only (the plan's producer)."""

    async def stop_edge(self, edge_id: int, ring_id: int) -> bool:
        """Stop this owner's end of the edge (the one on `ring_id`). False when the driver did not
        know it (then no PumpStopped will come)."""

    def events(self) -> AsyncIterator[DriverEvent]: ...

    async def wake_fds(self, ring_id: int) -> tuple[int, int] | None:
        """The (readable, writable) eventfds the driver's pump uses for the ring; None from a driver
        that shares none (test fakes); raises when a driver that shares them cannot hand them over."""

    async def healthy(self) -> bool: ...

    def for_new_owner(self) -> DriverPort:
        """The same driver under a new edge owner (swactor.edge.owners): edges established through the
        result end with the result's own `events()` streams, not with those of other users of this
        port (the orchestrator: one owner per run)."""
