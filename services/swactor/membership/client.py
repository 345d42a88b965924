"""A small asyncio client of the local membership service, for the other local services.

    async with MembershipClient() as m:                  # /run/swactor/membership.sock
        await m.set_local_state(pb.NODE_STATE_AVAILABLE, edge_endpoint="10.0.0.5:4433")
        members = await m.list_members()
"""

from __future__ import annotations

from pathlib import Path

from swactor.common.grpcio import LocalClient
from swactor.membership.config import DEFAULT_SOCKET
from swactor.v1 import membership_pb2 as pb
from swactor.v1 import membership_pb2_grpc as pb_grpc


class MembershipClient(LocalClient):
    def __init__(self, socket: Path = DEFAULT_SOCKET, *, timeout_s: float = 5.0) -> None:
        super().__init__(socket)
        self._stub = pb_grpc.MembershipStub(self._channel)
        self._timeout = timeout_s

    async def get_self(self) -> pb.GetSelfResponse:
        return await self._stub.GetSelf(pb.GetSelfRequest(), timeout=self._timeout)

    async def list_members(self, include_departed: bool = False) -> list[pb.Member]:
        reply = await self._stub.ListMembers(
            pb.ListMembersRequest(include_departed=include_departed), timeout=self._timeout
        )
        return list(reply.members)

    async def set_local_state(
        self,
        state: pb.NodeState.ValueType,
        reason: str = "",
        *,
        edge_endpoint: str | None = None,
        edge_cert_fingerprint: str | None = None,
        control_endpoint: str | None = None,
        worker_generation: int | None = None,
        stage_memory_bytes: int | None = None,
        stage_devices: int | None = None,
    ) -> pb.Member:
        """Gossip this node's state (AVAILABLE once arena, worker and transport are ready, §8)."""
        request = pb.SetLocalStateRequest(
            state=state, reason=reason, edge_endpoint=edge_endpoint,
            edge_cert_fingerprint=edge_cert_fingerprint, control_endpoint=control_endpoint,
            worker_generation=worker_generation,
            stage_memory_bytes=stage_memory_bytes, stage_devices=stage_devices,
        )
        return (await self._stub.SetLocalState(request, timeout=self._timeout)).self
