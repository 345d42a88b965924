"""The orchestrator's lease on a stage, through the real StageControl servicer (gRPC, mutual TLS):
a stage whose WatchStage stream is gone tears itself down and takes the next run."""

from __future__ import annotations

import asyncio

import pytest

from swactor.v1 import common_pb2, stage_pb2
from swactor.worker.node import RunLog, StageNode
from swactor.worker.stage_fsm import StageState
from swactor.worker.stage_lease import LeaseState

from .node_fakes import FakeMembership
from .plans import provision
from .test_service import NODE, ORCH, serve, settle, stub, updates

pytestmark = pytest.mark.timeout(60)
WINDOW_S = 0.3


async def stopped(log: RunLog, timeout: float = 10.0) -> None:
    async def go() -> None:
        while not log.done:
            await log.changed.wait()

    await asyncio.wait_for(go(), timeout)


def faults(log: RunLog) -> list[stage_pb2.StageFault]:
    return [u.fault for u in log.updates if u.HasField("fault")]


def test_stream_gone_faults_and_stops_the_stage_then_the_node_takes_the_next_run() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        ch, s = stub(port)
        await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=77))
        ups = await updates(s, 77, "ready")  # the watch ends here: the client went away
        assert ups[-1].HasField("ready") and all(u.event.worker_generation == 1 for u in ups if u.HasField("event"))
        await ch.close()  # the orchestrator is gone: no WatchStage stream any more
        await stopped(node.runs[77])
        assert node.runs[77].lease.state is LeaseState.EXPIRED
        (fault,) = faults(node.runs[77])
        assert fault.reason == common_pb2.RUN_FAULT_NODE_UNAVAILABLE and fault.cause == "StageLease.Expired"
        assert fault.component == common_pb2.COMPONENT_STAGE_CONTROLLER and "WatchStage" in fault.detail
        assert node.runs[77].stage.state is StageState.STOPPED
        assert membership.states == ["available:127.0.0.1:1"]  # Available all along: the next run is welcome
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=78))
            assert (await updates(s, 78, "ready"))[-1].HasField("ready")

    asyncio.run(serve(body, lease_window_s=WINDOW_S))


def test_provisioned_but_never_watched_expires_too() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=79))
        await stopped(node.runs[79])
        (fault,) = faults(node.runs[79])
        assert "never watched" in fault.detail

    asyncio.run(serve(body, lease_window_s=WINDOW_S))


def test_an_open_stream_holds_the_run_and_stop_run_ends_the_lease() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=80))
            call = s.WatchStage(stage_pb2.WatchStageRequest(run_id=80))
            async for u in call:
                if u.HasField("ready"):
                    break
            assert node.runs[80].lease.state is LeaseState.WATCHED
            assert node.runs[80].lease.deadline() is None  # no timer while the orchestrator follows the run
            assert (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=80))).known
            async for u in call:
                if u.HasField("stopped"):
                    break
            assert node.runs[80].lease.state is LeaseState.ENDED and faults(node.runs[80]) == []

    asyncio.run(serve(body, lease_window_s=WINDOW_S))
