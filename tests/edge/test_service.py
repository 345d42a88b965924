"""The gRPC servicer over an in-process driver (fake rings): status codes, replay, self edges."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from swactor.common.grpcio import create_server
from swactor.edge.service import SERVICE_NAME, EdgeDriverServicer
from swactor.v1 import edge_pb2, edge_pb2_grpc
from tests.edge.fakering import FakeRing
from tests.edge.inproc import start_nodes, stop_nodes, until


def test_service_codes_replay_and_self_edge(tmp_path: Path) -> None:
    async def main() -> None:
        (a,) = await start_nodes(tmp_path, n=1)
        sock = tmp_path / "edge.sock"
        server, _, _ = create_server(sock, service_names=[SERVICE_NAME])
        edge_pb2_grpc.add_EdgeDriverServicer_to_server(EdgeDriverServicer(a.driver), server)
        await server.start()
        channel = grpc.aio.insecure_channel(f"unix:{sock}")
        stub = edge_pb2_grpc.EdgeDriverStub(channel)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.EstablishRecv(edge_pb2.EstablishRecvRequest(edge_id=0, ring_id=1, tx_node_id=a.node_id))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.EstablishRecv(edge_pb2.EstablishRecvRequest(edge_id=1, ring_id=77, tx_node_id=a.node_id))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "ring 77" in (err.value.details() or "")
            # an edge from this host to itself (e.g. a token endpoint next to stage 0)
            tx = a.rings.add(FakeRing(11, 64 << 10))
            rx = a.rings.add(FakeRing(21, 64 << 10))
            await stub.EstablishRecv(edge_pb2.EstablishRecvRequest(edge_id=1, ring_id=21, tx_node_id=a.node_id))
            await stub.EstablishSend(edge_pb2.EstablishSendRequest(edge_id=2, rx_node_id=a.node_id, ring_id=11))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.EstablishRecv(edge_pb2.EstablishRecvRequest(edge_id=1, ring_id=21, tx_node_id=a.node_id))
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
            watch = stub.WatchEdges(edge_pb2.WatchEdgesRequest(replay_current=True, edge_ids=[1]))
            first = await asyncio.wait_for(watch.read(), 5)
            assert first.WhichOneof("event") == "ready" and (first.ready.edge_id, first.ready.ring_id) == (1, 21)
            # the send edge is edge 2 but carries edge_id 2 on the wire; rx edge 1 waits for edge 1
            assert (await stub.StopEdge(edge_pb2.StopEdgeRequest(edge_id=2))).known
            await stub.EstablishSend(edge_pb2.EstablishSendRequest(edge_id=1, rx_node_id=a.node_id, ring_id=11))
            tx.write(b"to myself")
            await until(lambda: rx.avail() == 9, "the self edge's bytes")
            assert rx.read(100) == b"to myself"
            status = await stub.GetStatus(edge_pb2.GetStatusRequest())
            assert {e.edge_id for e in status.edges} == {1}
            # each owner stops its own end by its ring: the other end of the self edge stays up
            assert not (await stub.StopEdge(edge_pb2.StopEdgeRequest(edge_id=1, ring_id=99))).known
            assert (await stub.StopEdge(edge_pb2.StopEdgeRequest(edge_id=1, ring_id=11))).known
            status = await stub.GetStatus(edge_pb2.GetStatusRequest())
            assert [(e.edge_id, e.ring_id) for e in status.edges] == [(1, 21)]
            assert not (await stub.StopEdge(edge_pb2.StopEdgeRequest(edge_id=999))).known
            watch.cancel()
        finally:
            await channel.close()
            await server.stop(0)
            await stop_nodes([a])

    asyncio.run(main())
