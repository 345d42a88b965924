"""The stage node's view of the local membership service: §8 NodeAvailable / NodeFaulted.

`MembershipPort` is what StageNode needs; `MembershipClientPort` is the real one: the membership
service's own client (SetLocalState on its Unix socket). Node tests plug in an in-memory fake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from swactor.membership.client import MembershipClient
from swactor.v1 import common_pb2, membership_pb2


class MembershipPort(Protocol):
    async def set_available(self, control_endpoint: str, worker_generation: int) -> None: ...

    async def set_faulted(self, reason: int, worker_generation: int) -> None:
        """NodeFaulted with a RunFaultReason."""


class MembershipClientPort(MembershipClient):
    """MembershipPort over the local membership service's SetLocalState (swactor.membership.client)."""

    def __init__(self, socket_path: Path) -> None:
        super().__init__(socket_path, timeout_s=10.0)

    async def set_available(self, control_endpoint: str, worker_generation: int) -> None:
        await self.set_local_state(membership_pb2.NODE_STATE_AVAILABLE, control_endpoint=control_endpoint,
                                   worker_generation=worker_generation)

    async def set_faulted(self, reason: int, worker_generation: int) -> None:
        await self.set_local_state(membership_pb2.NODE_STATE_FAULTED, common_pb2.RunFaultReason.Name(reason),
                                   worker_generation=worker_generation)
