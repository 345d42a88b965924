"""GetPoolMetrics' fan-out (orchestrator/fleet/pool_metrics.py): every member with a control endpoint is asked its
GetHostMetrics over mutual TLS at once; one that does not answer is listed with the error, the others' figures
come back all the same."""

from __future__ import annotations

import asyncio
import socket

import grpc

from swactor.common import control_tls
from swactor.common.grpcio import create_server
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.fleet.pool_metrics import pool_metrics
from swactor.v1 import stage_pb2, stage_pb2_grpc

SECRET = b"0123456789abcdef-cluster-secret"
ORCH = 1


class Host(stage_pb2_grpc.StageControlServicer):
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id

    async def GetHostMetrics(self, request, context):  # type: ignore[no-untyped-def]
        m = stage_pb2.HostMetrics(node_id=self.node_id, weights_fetched_bytes=123)
        m.arena.leased_bytes = 4096
        m.steps.add(stage_index=0, count=3, seconds=0.5)
        return m


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def channel(node: NodeInfo) -> grpc.aio.Channel:
    return control_tls.channel(SECRET, ORCH, node.control_endpoint, node.node_id)


def test_every_member_is_asked_and_a_silent_one_is_listed_with_its_error() -> None:
    async def main() -> None:
        server, port, _ = create_server(tcp_address="127.0.0.1:0", service_names=[],
                                        server_credentials=control_tls.server_credentials(SECRET, 5))
        stage_pb2_grpc.add_StageControlServicer_to_server(Host(5), server)
        await server.start()
        try:
            members = (
                NodeInfo(7, NodeState.AVAILABLE, control_endpoint=f"127.0.0.1:{closed_port()}", hostname="gone"),
                NodeInfo(5, NodeState.AVAILABLE, control_endpoint=f"127.0.0.1:{port}", hostname="up"),
                NodeInfo(6, NodeState.BOOTING),  # no control endpoint yet: nothing to ask
            )
            resp = await pool_metrics(members, channel, timeout_s=2.0)
        finally:
            await server.stop(None)
        assert [(n.node_id, n.hostname) for n in resp.nodes] == [(5, "up"), (7, "gone")]
        up, gone = resp.nodes
        assert not up.error and up.host.node_id == 5 and up.host.arena.leased_bytes == 4096
        assert up.host.weights_fetched_bytes == 123 and up.host.steps[0].count == 3
        assert gone.error.startswith("UNAVAILABLE") and not gone.HasField("host")

    asyncio.run(main())


def test_nothing_is_asked_without_a_way_to_dial_the_nodes() -> None:
    members = (NodeInfo(5, NodeState.AVAILABLE, control_endpoint="127.0.0.1:1"),)
    assert not asyncio.run(pool_metrics(members, None)).nodes
