"""StageControl gRPC servicer (stage.proto): thin, every decision is StageNode's; which StageNode (stage device) a
call is for is StageDevices' (worker/devices.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from swactor.common.control_tls import peer_orchestrator
from swactor.v1 import stage_pb2, stage_pb2_grpc
from swactor.worker.devices import StageDevices
from swactor.worker.host_metrics import HostSources, host_metrics
from swactor.worker.node import StageNode
from swactor.worker.provisioning import ProvisionError
from swactor.worker.weights import cache_listing

SERVICE_NAME = stage_pb2.DESCRIPTOR.services_by_name["StageControl"].full_name


def _caller(context: grpc.aio.ServicerContext) -> int | None:
    return peer_orchestrator(context.auth_context())


class StageControlServicer(stage_pb2_grpc.StageControlServicer):
    def __init__(self, devices: StageDevices | StageNode, host: HostSources | None = None) -> None:
        self.devices = devices if isinstance(devices, StageDevices) else StageDevices([devices])
        self.host = host  # None: GetHostMetrics reports the node's own counters only

    async def ProvisionStage(self, request: stage_pb2.ProvisionStageRequest,
                             context: grpc.aio.ServicerContext) -> stage_pb2.ProvisionStageResponse:
        try:
            self.devices.for_provision(request.device_index).provision(request, _caller(context))
        except ProvisionError as e:
            await context.abort(getattr(grpc.StatusCode, e.code), e.detail)
        return stage_pb2.ProvisionStageResponse(run_id=request.run_id, node_id=self.devices.node_id,
                                                stage_index=request.stage_index)

    async def StopRun(self, request: stage_pb2.StopStageRunRequest,
                      context: grpc.aio.ServicerContext) -> stage_pb2.StopStageRunResponse:
        stage = request.stage_index if request.HasField("stage_index") else None
        await self._authorize(request.run_id, stage, context)
        return stage_pb2.StopStageRunResponse(known=self.devices.stop_run(request.run_id, stage))

    async def _authorize(self, run_id: int, stage_index: int | None, context: grpc.aio.ServicerContext) -> None:
        try:
            self.devices.authorize(run_id, _caller(context), stage_index)
        except ProvisionError as e:
            await context.abort(getattr(grpc.StatusCode, e.code), e.detail)

    async def ListWeights(self, request: stage_pb2.ListWeightsRequest,
                          context: grpc.aio.ServicerContext) -> stage_pb2.ListWeightsResponse:
        if _caller(context) is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the caller's certificate names no orchestrator")
        return cache_listing(self.devices.nodes[0].weights.pool)

    async def GetHostMetrics(self, request: stage_pb2.GetHostMetricsRequest,
                             context: grpc.aio.ServicerContext) -> stage_pb2.HostMetrics:
        if _caller(context) is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the caller's certificate names no orchestrator")
        if self.host is None:
            return stage_pb2.HostMetrics(node_id=self.devices.node_id, steps=self.devices.steps.protos())
        return await host_metrics(self.host)

    async def WatchStage(self, request: stage_pb2.WatchStageRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[stage_pb2.StageUpdate]:
        stage = request.stage_index if request.HasField("stage_index") else None
        await self._authorize(request.run_id, stage, context)
        held = self.devices.holding(request.run_id, stage)
        if not held:
            what = f"run {request.run_id}" + (f" stage {stage}" if stage is not None else "")
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{what} is not provisioned on this node")
        async for update in held[0].watch(request.run_id):
            yield update
