"""The stage node's view of the local membership service: §8 NodeAvailable / NodeFaulted.

`MembershipPort` is what StageNode needs; `MembershipClientPort` is the real one: the membership
service's own client (SetLocalState on its Unix socket). Node tests plug in an in-memory fake.

The membership service keeps what local services told it in memory only: after it restarts, this
node is Booting again with no control endpoint. `keep_published` watches for that and says the
node's state again (without it a node whose membership restarted stayed Booting until its worker
restarted, and by the PoolReady policy held every run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc

from swactor.common.events import get_logger
from swactor.membership.client import MembershipClient
from swactor.v1 import common_pb2, membership_pb2


class MembershipPort(Protocol):
    async def set_available(self, control_endpoint: str, worker_generation: int) -> None: ...

    async def set_faulted(self, reason: int, worker_generation: int) -> None:
        """NodeFaulted with a RunFaultReason."""


class MembershipClientPort(MembershipClient):
    """MembershipPort over the local membership service's SetLocalState (swactor.membership.client).

    NodeAvailable carries the stage memory `stage_memory()` measures at that moment (worker/stage_memory.py), per stage
    device, and how many stage devices the worker runs (worker/devices.py)."""

    def __init__(self, socket_path: Path, stage_memory: Callable[[], int] = lambda: 0, stage_devices: int = 1) -> None:
        super().__init__(socket_path, timeout_s=10.0)
        self._stage_memory = stage_memory
        self._stage_devices = stage_devices
        self._wanted: membership_pb2.SetLocalStateRequest | None = None
        self._control_endpoint: str | None = None
        self._memory: int | None = None  # the stage memory last measured (said again with every state)
        self._speed: int | None = None  # µs per layer of a decode step last measured (step_speed.py); None: not yet

    async def set_available(self, control_endpoint: str, worker_generation: int) -> None:
        self._control_endpoint = control_endpoint
        self._memory = await asyncio.to_thread(self._stage_memory)  # nvidia-smi may take a moment
        await self._publish(membership_pb2.NODE_STATE_AVAILABLE, worker_generation=worker_generation)

    async def set_faulted(self, reason: int, worker_generation: int) -> None:
        await self._publish(membership_pb2.NODE_STATE_FAULTED, common_pb2.RunFaultReason.Name(reason),
                            worker_generation=worker_generation)

    async def set_step_speed(self, us_per_layer: int) -> None:
        """Gossip a new measured compute speed (NodeMetadata.step_us_per_layer) with the state last said; before any
        state was said it waits for that one."""
        self._speed = us_per_layer
        if self._wanted is not None:
            self._wanted.step_us_per_layer = us_per_layer
            await self._stub.SetLocalState(self._wanted, timeout=self._timeout)

    async def _publish(self, state: membership_pb2.NodeState.ValueType, reason: str = "", *,
                       worker_generation: int) -> None:
        """Say the state (kept, to say it again after a membership restart)."""
        self._wanted = membership_pb2.SetLocalStateRequest(state=state, reason=reason,
                                                           control_endpoint=self._control_endpoint,
                                                           worker_generation=worker_generation,
                                                           stage_memory_bytes=self._memory,
                                                           stage_devices=self._stage_devices,
                                                           step_us_per_layer=self._speed)
        await self._stub.SetLocalState(self._wanted, timeout=self._timeout)

    def _forgotten(self, md: membership_pb2.NodeMetadata) -> bool:
        w = self._wanted
        return w is not None and (md.state != w.state or md.state_reason != w.reason
                                  or (w.HasField("control_endpoint") and md.control_endpoint != w.control_endpoint))

    async def keep_published(self, retry_s: float = 1.0) -> None:
        """Until cancelled: follow this node in the membership view and say its state again when the
        view lost it (the membership service restarted)."""
        log = get_logger(component="worker")
        while True:
            try:
                call = self._stub.WatchMembers(membership_pb2.WatchMembersRequest(include_snapshot=True))
                async for ev in call:
                    if ev.member.is_self and self._forgotten(ev.member.metadata) and self._wanted is not None:
                        log.info("membership_state_republished",
                                 state=membership_pb2.NodeState.Name(self._wanted.state),
                                 seen=membership_pb2.NodeState.Name(ev.member.metadata.state))
                        await self._stub.SetLocalState(self._wanted, timeout=self._timeout)
            except grpc.aio.AioRpcError as e:
                log.info("membership_watch_lost", code=e.code().name)
            await asyncio.sleep(retry_s)
