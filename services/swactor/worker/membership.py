"""The stage node's view of the local membership service: §8 NodeAvailable / NodeFaulted.

`MembershipPort` is what StageNode needs; `MembershipClientPort` is the real one over
SetLocalState on membership's Unix socket. Node tests plug in an in-memory fake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import grpc

from swactor.v1 import common_pb2, membership_pb2, membership_pb2_grpc


class MembershipPort(Protocol):
    async def set_available(self, control_endpoint: str) -> None: ...

    async def set_faulted(self, reason: int) -> None:
        """NodeFaulted with a RunFaultReason."""


class MembershipClientPort:
    """MembershipPort over SetLocalState (§8 NodeAvailable)."""

    def __init__(self, socket_path: Path) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}")
        self._stub = membership_pb2_grpc.MembershipStub(self._channel)

    async def set_available(self, control_endpoint: str) -> None:
        await self._stub.SetLocalState(membership_pb2.SetLocalStateRequest(
            state=membership_pb2.NODE_STATE_AVAILABLE, control_endpoint=control_endpoint), timeout=10)

    async def set_faulted(self, reason: int) -> None:
        await self._stub.SetLocalState(membership_pb2.SetLocalStateRequest(
            state=membership_pb2.NODE_STATE_FAULTED, reason=common_pb2.RunFaultReason.Name(reason)), timeout=10)

    async def close(self) -> None:
        await self._channel.close()
