"""Feeds the orchestrator's membership view from the local membership service (WatchMembers).

Each member change produces a whole new view (tuple of NodeInfo) handed to `on_view`. While the
membership service is unreachable the last view is kept and the watch is retried with backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc

from swactor.common.events import get_logger
from swactor.common.grpcio import unix_target
from swactor.orchestrator.fleet.nodes import GpuInfo, NodeInfo, NodeState
from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import membership_pb2_grpc

_BY_STATE = {
    mpb.NODE_STATE_UNSPECIFIED: NodeState.BOOTING,
    mpb.NODE_STATE_BOOTING: NodeState.BOOTING,
    mpb.NODE_STATE_AVAILABLE: NodeState.AVAILABLE,
    mpb.NODE_STATE_FAULTED: NodeState.FAULTED,
}


def node_info(member: mpb.Member) -> NodeInfo:
    md = member.metadata
    if member.status in (mpb.MEMBER_STATUS_DEAD, mpb.MEMBER_STATUS_LEFT):
        state = NodeState.LEFT
    elif member.status == mpb.MEMBER_STATUS_SUSPECT:
        state = NodeState.SUSPECT
    else:
        state = _BY_STATE.get(md.state, NodeState.BOOTING)
    host = member.gossip_address.rsplit(":", 1)[0]
    return NodeInfo(
        node_id=md.node_id, state=state, edge_endpoint=md.edge_endpoint, control_endpoint=md.control_endpoint,
        edge_cert_fingerprint=md.edge_cert_fingerprint, hostname=host, reason=md.state_reason,
        epoch=member.epoch, worker_generation=md.worker_generation,
        gpus=tuple(GpuInfo(i, g.kind, g.name, g.memory_bytes) for i, g in enumerate(md.gpus)),
        memory_bytes=md.stage_memory_bytes, devices=md.stage_devices or 1, ms_per_layer=md.step_us_per_layer / 1000,
    )


async def follow_rtts(socket: Path, on_rtts: Callable[[dict[tuple[int, int], float]], None], *,
                      interval_s: float = 2.0) -> None:
    """Run until cancelled: every interval, the RTTs the members measured ((from, to) -> ms) from the membership
    service; while it is unreachable the last ones stand."""
    log = get_logger()
    async with grpc.aio.insecure_channel(unix_target(socket)) as channel:
        stub = membership_pb2_grpc.MembershipStub(channel)
        failing = False
        while True:
            try:
                got = await stub.GetRtts(mpb.GetRttsRequest(), timeout=interval_s)
            except grpc.aio.AioRpcError as e:
                if not failing:
                    log.warning("membership_rtts_unreachable", socket=str(socket), code=e.code().name)
                failing = True
            else:
                failing = False
                on_rtts({(r.from_node_id, r.to_node_id): r.rtt_us / 1000 for r in got.rtts})
            await asyncio.sleep(interval_s)


async def follow_membership(socket: Path, on_view: Callable[[tuple[NodeInfo, ...]], None],
                            *, retry_s: float = 1.0, max_retry_s: float = 10.0) -> None:
    """Run until cancelled: watch the membership service and publish every new view."""
    log = get_logger()
    delay = retry_s
    while True:
        members: dict[int, NodeInfo] = {}
        try:
            async with grpc.aio.insecure_channel(unix_target(socket)) as channel:
                stub = membership_pb2_grpc.MembershipStub(channel)
                stream = stub.WatchMembers(mpb.WatchMembersRequest(include_snapshot=True))
                async for ev in stream:
                    info = node_info(ev.member)
                    members[info.node_id] = info
                    delay = retry_s
                    # A partial snapshot view is harmless: the PoolReady window restarts on change.
                    on_view(tuple(members.values()))
                    if not ev.snapshot:
                        log.info("member_changed", node_id=info.node_id, state=info.state.value,
                                 kind=mpb.MemberEventKind.Name(ev.kind))
        except grpc.aio.AioRpcError as e:
            log.warning("membership_unreachable", socket=str(socket), code=e.code().name, retry_s=delay)
        await asyncio.sleep(delay)
        delay = min(max_retry_s, delay * 2)
