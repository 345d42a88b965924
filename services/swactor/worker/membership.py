"""The stage node's view of the local membership service: §8 NodeAvailable / NodeFaulted.

`MembershipPort` is what StageNode needs; `MembershipClientPort` is the real one: the membership
service's own client (SetLocalState on its Unix socket). Node tests plug in an in-memory fake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from swactor.membership.client import MembershipClient
from swactor.v1 import common_pb2, membership_pb2


class MembershipPort(Protocol):
    async def set_available(self, control_endpoint: str) -> None: ...

    async def set_faulted(self, reason: int) -> None:
        """NodeFaulted with a RunFaultReason."""


class MembershipClientPort(MembershipClient):
    """MembershipPort over the local membership service's SetLocalState (swactor.membership.client).

    NodeAvailable carries the stage memory `stage_memory()` measures at that moment (worker/stage_memory.py)."""

    def __init__(self, socket_path: Path, stage_memory: Callable[[], int] = lambda: 0) -> None:
        super().__init__(socket_path, timeout_s=10.0)
        self._stage_memory = stage_memory

    async def set_available(self, control_endpoint: str) -> None:
        memory = await asyncio.to_thread(self._stage_memory)  # nvidia-smi may take a moment
        await self.set_local_state(membership_pb2.NODE_STATE_AVAILABLE, control_endpoint=control_endpoint,
                                   stage_memory_bytes=memory)

    async def set_faulted(self, reason: int) -> None:
        await self.set_local_state(membership_pb2.NODE_STATE_FAULTED, common_pb2.RunFaultReason.Name(reason))
