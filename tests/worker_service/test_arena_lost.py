"""The host's arena-manager gone (StageNode.arena_lost, fed by ArenaHold.on_end): the running stage
faults fail-stop naming the arena and tears down, the node is withdrawn and refuses runs, and the
node retires (the service exits to be restarted on the new arena) once no run is left."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from swactor.v1 import common_pb2
from swactor.worker import stage_fsm as s
from swactor.worker.node import StageNode
from swactor.worker.stage_fsm import StageState

from .node_fakes import FakeMembership
from .plans import provision
from .test_service import NODE, ORCH, serve, settle, stub, updates
from .test_service_lease import faults, stopped
from .test_stage_fsm import loaded, ready, steps

pytestmark = pytest.mark.timeout(60)


def test_arena_lost_faults_a_running_stage_naming_the_arena() -> None:
    c = ready()
    steps(c.handle(loaded(0, rows=2)))
    actions = c.handle(s.ArenaLost("arena-manager (pid 9) closed the hand-out connection"))
    assert c.state is s.StageState.FAULTED
    (report,) = [a for a in actions if isinstance(a, s.Report)]
    assert report.event.reason == "RUN_FAULT_NODE_UNAVAILABLE"
    assert report.event.component == common_pb2.COMPONENT_ARENA
    assert report.cause == "ArenaManager.Gone" and "hand-out connection" in report.detail
    assert c.handle(s.ArenaLost("again")) == []  # the first fault stays the fault


def test_arena_lost_mid_run_faults_tears_down_withdraws_and_retires() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        ch, stage = stub(port)
        async with ch:
            await stage.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=77))
            await updates(stage, 77, "ready")
            watch = asyncio.ensure_future(updates(stage, 77, "stopped"))  # the orchestrator follows the run
            await settle()
            node.arena_lost("arena-manager (pid 9) closed the hand-out connection")
            await stopped(node.runs[77])
            ups = await asyncio.wait_for(watch, 10)
            (fault,) = faults(node.runs[77])
            assert fault.reason == common_pb2.RUN_FAULT_NODE_UNAVAILABLE
            assert fault.component == common_pb2.COMPONENT_ARENA and fault.cause == "ArenaManager.Gone"
            assert [u for u in ups if u.HasField("fault")] == [u for u in node.runs[77].updates if u.HasField("fault")]
            assert node.runs[77].stage.state is StageState.STOPPED
            await settle()
            assert not node.available and membership.states[-1] == "faulted:RUN_FAULT_NODE_UNAVAILABLE"
            assert node.retired.is_set()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stage.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=78))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "arena-manager is gone" in (refused.value.details() or "")

    asyncio.run(serve(body))


def test_arena_lost_while_idle_retires_at_once() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        assert node.available
        node.arena_lost("hand-out connection failed")
        await settle()
        assert node.retired.is_set() and not node.available
        assert membership.states == ["available:127.0.0.1:1", "faulted:RUN_FAULT_NODE_UNAVAILABLE"]

    asyncio.run(serve(body))
