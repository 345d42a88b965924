"""`GetPoolMetrics`: every member's own figures for monitoring (StageControl.GetHostMetrics, docs/operations.md
"Metrics"), asked of all of them at once over the node control API (mutual TLS).

A node that does not answer within the timeout is listed with the error, never waited on longer, so one silent host
costs a scrape `timeout_s` at most and the others' figures still come back.
"""

from __future__ import annotations

import asyncio

import grpc

from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.models.model_listing import NodeChannel
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import stage_pb2, stage_pb2_grpc

DEFAULT_TIMEOUT_S = 2.0


async def node_metrics(node: NodeInfo, channel: NodeChannel, timeout_s: float) -> opb.NodeMetrics:
    out = opb.NodeMetrics(node_id=node.node_id, hostname=node.hostname)
    ch = channel(node)
    try:
        host = await stage_pb2_grpc.StageControlStub(ch).GetHostMetrics(stage_pb2.GetHostMetricsRequest(),
                                                                        timeout=timeout_s)
    except grpc.aio.AioRpcError as e:
        out.error = f"{e.code().name}: {e.details()}"
        return out
    finally:
        await ch.close()
    out.host.CopyFrom(host)
    return out


async def pool_metrics(members: tuple[NodeInfo, ...], channel: NodeChannel | None,
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> opb.GetPoolMetricsResponse:
    """Each member with a control endpoint, by node id (none without a channel: no cluster secret to dial with)."""
    if channel is None:
        return opb.GetPoolMetricsResponse()
    nodes = [n for n in sorted(members, key=lambda n: n.node_id) if n.control_endpoint]
    return opb.GetPoolMetricsResponse(nodes=await asyncio.gather(*(node_metrics(n, channel, timeout_s) for n in nodes)))
