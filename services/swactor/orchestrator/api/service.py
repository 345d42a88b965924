"""The gRPC servicer: thin; every method delegates to `Orchestrator` and maps RequestError to a status.
`add_to_server` registers it with SubmitRun's lenient deserializer (validation.SubmitDeserializer)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import message_factory

from swactor.common.events import get_logger
from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.api.validation import RefusedRequest, SubmitDeserializer
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.runs.manager import Orchestrator
from swactor.orchestrator.runs.runner import PER_OBJECT_KINDS
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

SERVICE_NAME = opb.DESCRIPTOR.services_by_name["Orchestrator"].full_name

# NodeState and the proto's NodeReadiness share their value names: the table is derived, so they cannot drift.
_READINESS = {s: opb.NodeReadiness.Value(f"NODE_READINESS_{s.name}") for s in NodeState}


def node_proto(n: NodeInfo, slots: tuple[int, int] = (0, 0)) -> opb.Node:
    """The node as ListNodes shows it; `slots`: (runs in flight on it, the run slots it holds for them: the fewest of
    its stages', when it carries several)."""
    return opb.Node(
        node_id=n.node_id, readiness=_READINESS[n.state], provisionable=n.provisionable,
        edge_endpoint=n.edge_endpoint, control_endpoint=n.control_endpoint, hostname=n.hostname, reason=n.reason,
        stage_memory_bytes=n.memory_bytes, stage_devices=n.devices, slots_in_use=slots[0], run_slots=slots[1],
        ms_per_layer=n.ms_per_layer,
        gpus=[opb.NodeGpu(index=g.index, kind=g.kind, name=g.name, memory_bytes=g.memory_bytes) for g in n.gpus],
    )


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServicer):
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator
        self.log = get_logger()

    async def _refuse(self, context: grpc.aio.ServicerContext, method: str, e: RequestError) -> None:
        self.log.info("request_refused", method=method, code=e.code.name, detail=e.message)
        await context.abort(e.code, e.message)

    async def _submitted(self, context: grpc.aio.ServicerContext, method: str,
                         request: opb.SubmitRunRequest | RefusedRequest,
                         call: Callable[[opb.SubmitRunRequest], Awaitable[Any]]) -> Any:
        """SubmitRun and Plan: a request the deserializer refused, or one `call` refuses, is answered by name."""
        try:
            if isinstance(request, RefusedRequest):
                raise RequestError.invalid(request.message)
            return await call(request)
        except RequestError as e:
            await self._refuse(context, method, e)

    async def SubmitRun(self, request, context):
        return await self._submitted(context, "SubmitRun", request, self.o.submit)

    async def Plan(self, request, context):
        return await self._submitted(context, "Plan", request, self.o.plan)

    async def WatchRun(self, request, context) -> AsyncIterator[opb.RunUpdate]:
        try:
            updates = self.o.watch(request.run_id)
        except RequestError as e:
            await self._refuse(context, "WatchRun", e)
            return
        omit = request.omit_object_events
        async for update in updates:
            if omit and update.HasField("event") and update.event.kind in PER_OBJECT_KINDS:
                continue
            yield update

    async def GetRun(self, request, context):
        try:
            return self.o.get(request.run_id)
        except RequestError as e:
            await self._refuse(context, "GetRun", e)

    async def ListRuns(self, request, context):
        return opb.ListRunsResponse(runs=self.o.list(request.limit))

    async def StopRun(self, request, context):
        try:
            return opb.StopRunResponse(run=await self.o.stop(request.run_id, request.detail))
        except RequestError as e:
            await self._refuse(context, "StopRun", e)

    async def ListNodes(self, request, context):
        status, slots = self.o.pool_status(1), self.o.node_slots()
        nodes = [node_proto(n, slots.get(n.node_id, (0, 0))) for n in sorted(self.o.members, key=lambda n: n.node_id)]
        network = self.o.network
        rtts = [opb.NodeRtt(from_node_id=a, to_node_id=b, rtt_ms=ms) for (a, b), ms in sorted(network.rtt_ms.items())]
        return opb.ListNodesResponse(nodes=nodes, pool_ready=status.ready, pool_detail=status.detail, rtts=rtts,
                                     orchestrator_node_id=network.origin, live_runs=self._live_runs())

    def _live_runs(self) -> list[opb.RunStateCount]:
        """The runs held now by state: the queued ones, then the active ones by their record's state."""
        states = Counter({opb.RUN_STATE_QUEUED: self.o.queued()})
        states.update(h.record.state for h in self.o.active_runs())
        return [opb.RunStateCount(state=state, runs=n) for state, n in sorted(states.items()) if n]

    async def ListModels(self, request, context):
        return await self.o.list_models()

    async def GetPoolMetrics(self, request, context):
        return await self.o.pool_metrics()

    async def GetEvents(self, request, context):
        try:
            return self.o.events(request.run_id, request.kind, request.page_size, request.page_token)
        except RequestError as e:
            await self._refuse(context, "GetEvents", e)


def add_to_server(servicer: OrchestratorServicer, server: grpc.aio.Server) -> None:
    """What `add_OrchestratorServicer_to_server` does, built from the service descriptor, with
    SubmitRun's (and Plan's) request bytes size-checked before parsing and UTF-8 errors named by field."""
    handlers = {}
    for method in opb.DESCRIPTOR.services_by_name["Orchestrator"].methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        deserializer = (SubmitDeserializer(servicer.o.limits.max_request_bytes) if method.name in ("SubmitRun", "Plan")
                        else request.FromString)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=deserializer,
                                     response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
