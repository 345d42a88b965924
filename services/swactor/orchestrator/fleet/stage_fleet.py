"""StageFleet over the node control API (stage.proto): ProvisionStage, WatchStage, StopRun.

One mutually-authenticated channel per stage (the control CA derives from the cluster secret; see
swactor.common.control_tls); a node with several stage devices may hold several stages of one run, so every
WatchStage and StopRun names its stage. After a node accepts ProvisionStage, a watch task relays the stage's
updates as run-FSM inputs until StageStopped. Token endpoints are delegated to an
`EndpointFactory` (token_endpoints.RingEndpointFactory on a real host).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import grpc

from swactor.common.events import get_logger
from swactor.common.grpcio import response_stream
from swactor.orchestrator.fleet.fleet import FleetError, Report, TokenEndpoints
from swactor.orchestrator.planning.planner import RunPlan, StagePlan
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb
from swactor.v1 import stage_pb2, stage_pb2_grpc

ChannelFactory = Callable[[StagePlan], grpc.aio.Channel]
# What a stage is told about the GGUF (docs/distribution.md): a GgufSource (the orchestrator's model
# server, or a path every node holds), or a bare Path; may be async (it waits for the file to be
# served) and may raise FleetError.
Source = stage_pb2.GgufSource | Path
GgufSources = Callable[[RunPlan, Report], Source | Awaitable[Source]]

_REJECTED = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.ABORTED}


class EndpointFactory(Protocol):
    async def open(self, plan: RunPlan, report: Report) -> TokenEndpoints: ...


def mtls_channels(secret: bytes, orchestrator_node_id: int, *, keepalive_s: float | None = None) -> ChannelFactory:
    from swactor.common import control_tls

    keepalive = control_tls.DEFAULT_KEEPALIVE_S if keepalive_s is None else keepalive_s

    def make(stage: StagePlan) -> grpc.aio.Channel:
        return control_tls.channel(secret, orchestrator_node_id, stage.node.control_endpoint, stage.node_id,
                                   keepalive_s=keepalive)

    return make


def provision_request(plan: RunPlan, stage: StagePlan, source: Source) -> stage_pb2.ProvisionStageRequest:
    """The §12 ProvisionStage message for one stage of the plan."""
    gguf = source if isinstance(source, stage_pb2.GgufSource) else stage_pb2.GgufSource(path=str(source))
    inbound, outbound = plan.edge(stage.inbound_edge), plan.edge(stage.outbound_edge)
    last = stage.stage_index == stage.stage_count - 1
    m = plan.model
    req = stage_pb2.ProvisionStageRequest(
        run_id=plan.run_id, node_id=stage.node_id, orchestrator_node_id=plan.orchestrator_node_id,
        stage_index=stage.stage_index, stage_count=stage.stage_count, device_index=stage.device,
        gguf_source=gguf,
        layer_start=stage.layer_start, layer_end_exclusive=stage.layer_end_exclusive,
        inbound=stage_pb2.InboundEdgeProvision(
            edge_id=inbound.edge_id, kind=inbound.kind, producer_node_id=inbound.producer.node_id,  # type: ignore[arg-type]
            object_spec=inbound.object_spec, ring_spec=inbound.ring_spec(pb.RING_DIRECTION_INGRESS)),
        outbound=stage_pb2.OutboundEdgeProvision(
            edge_id=outbound.edge_id, kind=outbound.kind, consumer_node_id=outbound.consumer.node_id,  # type: ignore[arg-type]
            object_spec=outbound.object_spec, ring_spec=outbound.ring_spec(pb.RING_DIRECTION_EGRESS)),
        model=stage_pb2.StageModelFacts(
            model_id=m.model_id, num_layers=m.num_layers, hidden_dim=m.hidden_dim,
            dtype_family=m.dtype_family, dtype_width_bytes=m.dtype_width_bytes,  # type: ignore[arg-type]
            max_seq_len=plan.max_seq_len),
        runtime=stage_pb2.StageRuntimeFacts(role_id=stage.role_id, prefill_chunk=plan.prefill_chunk,
                                            trace_objects=plan.trace_objects, kv_dtype=plan.kv_dtype,
                                            run_slots=plan.slots(stage), compute_layers=stage.compute_layers),
    )
    if last:
        s = plan.sampling
        req.runtime.sampling.CopyFrom(stage_pb2.StageSampling(temperature=s.temperature, top_k=s.top_k,
                                                              top_p=s.top_p, seed=s.seed,
                                                              skip_draws=s.skip_draws))
    return req


def watch_request(plan: RunPlan, stage: StagePlan) -> stage_pb2.WatchStageRequest:
    """WatchStage for one stage: named by its index, as its node may hold another stage of the run."""
    return stage_pb2.WatchStageRequest(run_id=plan.run_id, stage_index=stage.stage_index)


def stop_request(plan: RunPlan, stage: StagePlan) -> stage_pb2.StopStageRunRequest:
    """StopRun for one stage: named by its index, so a node holding two stages of the run stops the one meant."""
    return stage_pb2.StopStageRunRequest(run_id=plan.run_id, stage_index=stage.stage_index)


def stage_input(stage: StagePlan, update: stage_pb2.StageUpdate) -> F.Input | None:
    """One StageUpdate as a run-FSM input."""
    which = update.WhichOneof("update")
    if which == "ready":
        return F.StageReady(stage.stage_index)
    if which == "fault":
        f = update.fault
        detail = f"{f.cause}: {f.detail}" if f.cause and f.detail else f.cause or f.detail
        return F.StageFault(stage.stage_index, f.reason, f.component or pb.COMPONENT_STAGE_CONTROLLER, detail, f.cause)
    if which == "stopped":
        return F.StageStopped(stage.stage_index)
    if which == "events":  # a traced run's per-object events of one sequence
        return F.RelayBatch(tuple(_relayed(stage, update, e) for e in update.events.events))
    if which == "event":
        return F.Relay(_relayed(stage, update, update.event))
    return None


def _relayed(stage: StagePlan, update: stage_pb2.StageUpdate, event: pb.LifecycleEvent) -> pb.LifecycleEvent:
    ev = pb.LifecycleEvent()
    ev.CopyFrom(event)
    ev.node_id = ev.node_id or update.node_id
    if not ev.HasField("stage_index"):
        ev.stage_index = stage.stage_index
    ev.time_us = ev.time_us or update.time_us
    return ev


class NoEndpoints:
    """A fleet built without token endpoints (stage control only): refuse by name so a run faults at once."""

    async def open(self, plan: RunPlan, report: Report) -> TokenEndpoints:
        raise FleetError(pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED,
                         "this fleet has no token endpoints (StageControlFleet built without an EndpointFactory)")


# After a connect that failed, a ProvisionStage waits this long for the channel's next connect (wait_for_ready).
CONNECT_WAIT_S = 5.0


def _never_sent(e: grpc.aio.AioRpcError) -> bool:
    """UNAVAILABLE because the channel could not connect: the call never reached the node."""
    return e.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in (e.details() or "").lower()


class StageControlFleet:
    def __init__(self, channels: ChannelFactory, gguf_sources: GgufSources,
                 endpoints: EndpointFactory | None = None, *, call_timeout_s: float = 30.0,
                 teardown_wait_s: float = 15.0) -> None:
        self._channels = channels
        # A node whose stage is still tearing down an earlier run (ABORTED) is asked again this long: a run
        # submitted right after a fault is not refused for a teardown that ends by itself within seconds.
        self._teardown_wait_s = teardown_wait_s
        self._gguf_sources = gguf_sources
        self._endpoints = endpoints or NoEndpoints()
        self._timeout = call_timeout_s
        self._open: dict[tuple[int, int], grpc.aio.Channel] = {}
        self._watches: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._stops: dict[tuple[int, int], asyncio.Task[None]] = {}
        self.log = get_logger()

    def _channel(self, plan: RunPlan, stage: StagePlan) -> grpc.aio.Channel:
        key = (plan.run_id, stage.stage_index)
        if key not in self._open:
            self._open[key] = self._channels(stage)
        return self._open[key]

    async def provision(self, plan: RunPlan, stage: StagePlan, report: Report) -> None:
        source = self._gguf_sources(plan, report)
        if inspect.isawaitable(source):
            source = await source
        stub = stage_pb2_grpc.StageControlStub(self._channel(plan, stage))
        req = provision_request(plan, stage, source)
        try:
            await self._provision_when_free(stub, req)
        except BaseException as e:
            # No watch will close the channel: close it here, or it lives on, reconnecting to the node
            # when it comes back and holding that connection for good (seen with a host killed).
            await self._close_channel(plan, stage)
            if not isinstance(e, grpc.aio.AioRpcError):
                raise
            reason = pb.RUN_FAULT_PROVISIONING_REJECTED if e.code() in _REJECTED else pb.RUN_FAULT_NODE_UNAVAILABLE
            raise FleetError(reason, f"ProvisionStage on node {stage.node_id} ({stage.node.control_endpoint}): "
                                     f"{e.code().name}: {e.details()}") from None
        key = (plan.run_id, stage.stage_index)
        task = self._watches[key] = asyncio.create_task(self._watch(plan, stage, stub, report))
        task.add_done_callback(lambda t: self._watches.pop(key) if self._watches.get(key) is t else None)

    async def _provision_when_free(self, stub: stage_pb2_grpc.StageControlStub,
                                   req: stage_pb2.ProvisionStageRequest) -> None:
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self._teardown_wait_s, 0.1
        unconnected: grpc.aio.AioRpcError | None = None  # the first connect failure, once it happened
        while True:
            try:
                if unconnected is not None:
                    await stub.ProvisionStage(req, timeout=min(self._timeout, CONNECT_WAIT_S), wait_for_ready=True)
                else:
                    await stub.ProvisionStage(req, timeout=self._timeout)
                return
            except grpc.aio.AioRpcError as e:
                if unconnected is None and _never_sent(e):
                    # The connection was not made, so the request never left: wait for the channel's next connect
                    # once, rather than fault the run on one lost SYN (keepalive's TCP user timeout, two intervals,
                    # is shorter than SYN retransmission over a lossy WAN link).
                    unconnected = e
                    self.log.info("provision_retried", run_id=req.run_id, node_id=req.node_id, detail=e.details())
                    continue
                if unconnected is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise unconnected from None  # still no connection: why the first one failed says more
                if e.code() != grpc.StatusCode.ABORTED or loop.time() + pause > deadline:
                    raise
                self.log.info("provision_retried", run_id=req.run_id, node_id=req.node_id, detail=e.details())
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)

    async def _watch(self, plan: RunPlan, stage: StagePlan, stub: stage_pb2_grpc.StageControlStub,
                     report: Report) -> None:
        try:
            async with response_stream(stub.WatchStage(watch_request(plan, stage))) as updates:
                async for update in updates:
                    inp = stage_input(stage, update)
                    if inp is not None:
                        report(inp)
                    if update.HasField("stopped"):
                        return
            report(F.StageFault(stage.stage_index, pb.RUN_FAULT_NODE_UNAVAILABLE, pb.COMPONENT_ORCHESTRATOR,
                                "WatchStage ended before StageStopped"))
        except grpc.aio.AioRpcError as e:
            report(F.StageFault(stage.stage_index, pb.RUN_FAULT_NODE_UNAVAILABLE, pb.COMPONENT_ORCHESTRATOR,
                                f"WatchStage on node {stage.node_id} failed: {e.code().name}: {e.details()}"))
        finally:
            await self._close_channel(plan, stage)

    async def _close_channel(self, plan: RunPlan, stage: StagePlan) -> None:
        """Close the stage's channel once its watch or its provisioning is over. With grace: a StopRun may be in
        flight on it (a node may report StageStopped before it answers StopRun, a teardown may stop a stage still
        provisioning), and close() without grace cancels that call, failing a stop that succeeded."""
        channel = self._open.pop((plan.run_id, stage.stage_index), None)
        if channel is not None:
            await channel.close(grace=self._timeout)

    async def stop_stage(self, plan: RunPlan, stage: StagePlan) -> None:
        """StopRun to the stage. The call belongs to the fleet, not to the run: it outlives a teardown
        that stopped waiting for it (a lost or partitioned node; the run ends without it), and an
        unreachable stage is called again until the call timeout, so a partition that heals within
        that time still gets its stage stopped instead of leaving it holding the run."""
        key = (plan.run_id, stage.stage_index)
        call = self._stops.get(key)
        if call is None:
            call = self._stops[key] = asyncio.create_task(self._stop_run(plan, stage))
            call.add_done_callback(lambda t: (self._stops.pop(key, None), t.cancelled() or t.exception()))
        await asyncio.shield(call)

    async def _stop_run(self, plan: RunPlan, stage: StagePlan) -> None:
        try:
            await self._stop_call(plan, stage, self._open.get((plan.run_id, stage.stage_index)), self._timeout)
            return
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        except BaseException:
            self._let_go(plan, stage)
            raise
        # Unreachable now (partitioned, restarting): again on a fresh channel each second (a fresh
        # channel dials at once, a failed one waits out its reconnect backoff) until the call timeout.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        try:
            while True:
                try:
                    await self._stop_call(plan, stage, None, min(1.0, max(deadline - loop.time(), 0.1)))
                    return
                except grpc.aio.AioRpcError as e:
                    if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                            or loop.time() >= deadline:
                        raise
        except BaseException:
            self._let_go(plan, stage)
            raise

    async def _stop_call(self, plan: RunPlan, stage: StagePlan, channel: grpc.aio.Channel | None,
                         timeout_s: float) -> None:
        temporary = channel is None  # the watch already ended (node lost): a channel just for StopRun
        channel = channel or self._channels(stage)
        try:
            stub = stage_pb2_grpc.StageControlStub(channel)
            await stub.StopRun(stop_request(plan, stage), timeout=timeout_s, wait_for_ready=temporary)
        finally:
            if temporary:
                await channel.close()

    def _let_go(self, plan: RunPlan, stage: StagePlan) -> None:
        """StopRun not confirmed (the stage is frozen or unreachable): let go of its WatchStage stream
        and channel too. A watch kept open keeps the stage's lease (worker/stage_lease.py) held, so a
        stage that comes back would keep the run forever; with the stream gone it gives the run up
        itself once its lease window passes."""
        watch = self._watches.get((plan.run_id, stage.stage_index))
        if watch is not None:
            watch.cancel()

    async def open_endpoints(self, plan: RunPlan, report: Report) -> TokenEndpoints:
        return await self._endpoints.open(plan, report)
