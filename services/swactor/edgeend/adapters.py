"""Real ports (ports.py) over the local arena-manager and edge-driver services."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from swactor.arena import client as arena_client
from swactor.common.events import get_logger
from swactor.common.grpcio import LocalClient
from swactor.common.ids import new_id
from swactor.common.layout import Layout
from swactor.edgeend import establisher as est
from swactor.edgeend.ports import DriverEvent, LeaseOutcome
from swactor.v1 import arena_pb2, common_pb2, edge_pb2, edge_pb2_grpc

_DIRECTION = {"Ingress": common_pb2.RING_DIRECTION_INGRESS, "Egress": common_pb2.RING_DIRECTION_EGRESS}


class ArenaClientPort:
    """ArenaPort over swactor.arena.client (this service is the holder that owns the leases)."""

    def __init__(self, client: arena_client.AsyncArenaClient, requester: str = "gpu-worker") -> None:
        self.client = client
        self.requester = requester
        self._attached: set[int] = set()

    async def lease(self, request_id: int, edge_id: int, direction: str, ring_spec: Any) -> LeaseOutcome:
        out = await self.client.lease(request_id=request_id, requester=self.requester, edge_id=edge_id,
                                      direction=_DIRECTION[direction], ring_spec=ring_spec)
        match out:
            case arena_client.Leased():
                return est.RingLeased(request_id, Layout.from_pb(out.layout))
            case arena_client.Rejected():
                return est.RingLeaseRejected(request_id, out.reason, out.detail)
        return None  # cancelled

    async def cancel(self, request_id: int) -> None:
        try:
            await self.client.cancel(request_id)
        except arena_client.ArenaCallError as e:  # already leased: the lease stream delivers it
            get_logger(component="worker").info("arena_cancel_too_late", request_id=request_id, detail=str(e))

    async def attach_worker(self, ring_id: int) -> None:
        await self.client.attach(ring_id, arena_pb2.ATTACH_ROLE_WORKER_RING)
        self._attached.add(ring_id)

    async def detach_worker(self, ring_id: int) -> None:
        if ring_id in self._attached:
            self._attached.discard(ring_id)
            await self.client.detach(ring_id, arena_pb2.DETACH_PROOF_RING_QUIESCED)

    async def release(self, ring_id: int, never_installed: bool) -> None:
        """ReleaseRing with `when_detached`: the edge-driver drops its pump hold right after
        PumpStopped, asynchronously; the arena then reclaims the range at that last detach."""
        await self.detach_worker(ring_id)
        proof = arena_client.NEVER_INSTALLED if never_installed else arena_client.QUIESCED
        await self.client.release(ring_id, proof, when_detached=True)


class EdgeDriverPort(LocalClient):
    """DriverPort over the edge-driver's gRPC Unix socket and its wake-fd hand-out socket.

    The edges it establishes are owned by `owner_id` (one per port, so per process): `events()`
    streams hold them, and when the last one ends (this process exited) the driver stops them
    (swactor.edge.owners)."""

    def __init__(self, socket_path: Path, wake_socket: Path) -> None:
        super().__init__(socket_path)
        self._stub = edge_pb2_grpc.EdgeDriverStub(self._channel)
        self.wake_socket = wake_socket
        self.owner_id = new_id()

    async def establish_send(self, edge_id: int, rx_node_id: int, layout: Layout) -> None:
        await self._stub.EstablishSend(edge_pb2.EstablishSendRequest(
            edge_id=edge_id, rx_node_id=rx_node_id, ring_id=layout.ring_id, ring_layout=layout.to_pb(),
            owner_id=self.owner_id))

    async def establish_recv(self, edge_id: int, tx_node_id: int, layout: Layout) -> None:
        await self._stub.EstablishRecv(edge_pb2.EstablishRecvRequest(
            edge_id=edge_id, ring_id=layout.ring_id, ring_layout=layout.to_pb(), tx_node_id=tx_node_id,
            owner_id=self.owner_id))

    async def stop_edge(self, edge_id: int, ring_id: int) -> bool:
        resp = await self._stub.StopEdge(edge_pb2.StopEdgeRequest(edge_id=edge_id, ring_id=ring_id))
        return bool(resp.known)

    async def events(self) -> AsyncIterator[DriverEvent]:
        async for ev in self._stub.WatchEdges(edge_pb2.WatchEdgesRequest(replay_current=True, owner_id=self.owner_id)):
            match ev.WhichOneof("event"):
                case "ready":
                    yield est.DriverEdgeReady(ev.ready.edge_id, ev.ready.ring_id)
                case "closed":
                    yield est.StreamClosed(ev.closed.edge_id, ev.closed.ring_id)
                case "fault":
                    yield est.StreamFault(ev.fault.edge_id, ev.fault.ring_id, ev.fault.reason, ev.fault.detail)
                case "pump_stopped":
                    yield est.PumpStopped(ev.pump_stopped.edge_id, ev.pump_stopped.ring_id)

    def for_new_owner(self) -> EdgeDriverPort:
        port = copy.copy(self)  # the same channel (closed by this port's owner) under a new owner id
        port.owner_id = new_id()
        return port

    def object_timings(self, edge_ids: set[int]) -> AsyncIterator[edge_pb2.ObjectTimings]:
        """Per-object pump timings of these edges (issue 7; swactor.edgeend.timings)."""
        from swactor.edgeend.timings import watch_object_timings

        return watch_object_timings(self._stub, edge_ids)

    async def wake_fds(self, ring_id: int) -> tuple[int, int] | None:
        """The pump's eventfds; raises WakeFdError when the driver cannot hand them over (the
        establisher then fails the edge: its ring host would never be woken)."""
        from swactor.edge.wakefd import WakeFdError, fetch_wake_fds

        try:
            return await asyncio.to_thread(fetch_wake_fds, self.wake_socket, ring_id)
        except WakeFdError as e:
            get_logger(ring_id=ring_id).warning("edge_wake_fds_unavailable", detail=str(e))
            raise

    async def status(self) -> edge_pb2.EdgeDriverStatus:
        return await self._stub.GetStatus(edge_pb2.GetStatusRequest())

    async def healthy(self) -> bool:
        try:
            await self._stub.GetStatus(edge_pb2.GetStatusRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            return False
        return True
