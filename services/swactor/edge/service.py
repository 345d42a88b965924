"""gRPC servicer for swactor.v1.EdgeDriver: thin, every method delegates to the Driver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable

import grpc

from swactor.edge.driver import Driver
from swactor.edge.table import EdgeError
from swactor.v1 import edge_pb2, edge_pb2_grpc

SERVICE_NAME = edge_pb2.DESCRIPTOR.services_by_name["EdgeDriver"].full_name
_CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "exists": grpc.StatusCode.ALREADY_EXISTS,
    "ring": grpc.StatusCode.FAILED_PRECONDITION,
}


async def _established(context: grpc.aio.ServicerContext, establishing: Awaitable[None]) -> edge_pb2.EstablishResponse:
    """Await an EstablishSend/Recv; an EdgeError aborts the call with its kind's status code."""
    try:
        await establishing
    except EdgeError as e:
        await context.abort(_CODES[e.kind], str(e))
    return edge_pb2.EstablishResponse()


class EdgeDriverServicer(edge_pb2_grpc.EdgeDriverServicer):
    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    async def EstablishSend(
        self, request: edge_pb2.EstablishSendRequest, context: grpc.aio.ServicerContext
    ) -> edge_pb2.EstablishResponse:
        return await _established(context, self.driver.establish_send(
            request.edge_id, request.rx_node_id, request.ring_id, request.ring_layout, request.owner_id))

    async def EstablishRecv(
        self, request: edge_pb2.EstablishRecvRequest, context: grpc.aio.ServicerContext
    ) -> edge_pb2.EstablishResponse:
        return await _established(context, self.driver.establish_recv(
            request.edge_id, request.ring_id, request.tx_node_id, request.ring_layout, request.owner_id))

    async def StopEdge(self, request: edge_pb2.StopEdgeRequest, context: grpc.aio.ServicerContext) -> edge_pb2.StopEdgeResponse:
        return edge_pb2.StopEdgeResponse(known=self.driver.stop_edge(request.edge_id, request.ring_id))

    async def WatchEdges(
        self, request: edge_pb2.WatchEdgesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[edge_pb2.EdgeEvent]:
        watcher = self.driver.watch(set(request.edge_ids), request.replay_current, request.object_timings,
                                    request.owner_id)
        try:
            while True:
                event = await watcher.queue.get()
                if watcher.overflowed:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "watcher fell behind; watch again with replay")
                if event is None:
                    return
                yield event
        finally:  # also when the owner's connection closed (it exited): grpc cancels the stream
            self.driver.unwatch(watcher)

    async def GetStatus(self, request: edge_pb2.GetStatusRequest, context: grpc.aio.ServicerContext) -> edge_pb2.EdgeDriverStatus:
        return self.driver.status()
