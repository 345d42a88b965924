"""Step grants on a stage node (docs/worker.md "Step grants"): a run alone decodes without an ExecuteStep per row;
another run, or the run leaving, revokes the grant first. StageControl over real gRPC; the compute process is the
fake ctl, whose events the test gives."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from swactor.common.objflags import PROMPT_CONTINUES
from swactor.v1 import stage_pb2
from swactor.worker.node import StageNode
from swactor.worker.process import wire
from swactor.worker.stage_fsm import StageState

from .node_fakes import FakeCtl
from .test_runs_in_flight_node import complete, loaded, out_edges, run_plan, steps
from .test_service import serve, settle, stub, updates

pytestmark = pytest.mark.timeout(60)


def sent(ctl: FakeCtl, kind: type) -> list[Any]:
    return [c for c in ctl.sent if isinstance(c, kind)]


def granted(node: StageNode, run_id: int, sequence: int, handle: int, step_id: int) -> wire.ObjectLoaded:
    """The ObjectLoaded of a row the worker started as step `step_id` under the grant."""
    return dataclasses.replace(loaded(node, run_id, sequence, handle), granted_step=step_id)


def test_a_run_alone_decodes_under_a_grant_until_a_second_run_comes() -> None:
    ctl = FakeCtl()

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        node.scheduler.gather_s = 0  # 72's row goes as soon as the grant ended, without waiting for 71's
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(run_plan(71))
            await updates(s, 71, "ready")
            node._on_worker(loaded(node, 71, 0, 1))  # its first row goes as an ExecuteStep, the grant right after
            (first,) = steps(ctl)
            (g,) = sent(ctl, wire.GrantSteps)
            stage = node.runs[71].stage
            assert (g.sequence, g.step_id, g.ring_id, g.runtime) == (1, first.step_id + 1, stage.in_ring_id,
                                                                    {"start_pos": 1, "slot": 0})
            assert g.output.ring_id == stage.out_ring_id
            complete(node, first, out_edges(node, 71))
            for k in range(2):  # the worker starts the next rows itself and says so in their ObjectLoaded
                node._on_worker(granted(node, 71, 1 + k, 2 + k, g.step_id + k))
                assert stage.state is StageState.EXECUTING and stage.position == 2 + k
                running = node.scheduler.in_flight
                assert running is not None and running.step.step_id == g.step_id + k
                complete(node, running.step, out_edges(node, 71))
                assert stage.state is StageState.READY
            assert len(steps(ctl)) == 1 and not sent(ctl, wire.ReleaseDeviceObject)  # the worker released them

            await s.ProvisionStage(run_plan(72))  # a second run: its rows batch with 71's, so the grant ends
            await updates(s, 72, "ready")
            assert sent(ctl, wire.RevokeGrant) == [wire.RevokeGrant(g.role_id, g.grant_id)]
            node._on_worker(loaded(node, 72, 0, 9))
            assert len(steps(ctl)) == 1  # nothing goes out before GrantEnded
            node._on_worker(wire.GrantEnded(g.role_id, g.grant_id, 3, "revoked"))
            assert steps(ctl)[-1].inputs[0].device_handle.id == 9
            assert len(sent(ctl, wire.GrantSteps)) == 1  # two runs here: no new grant

    asyncio.run(serve(body, ctl=ctl))


def test_a_run_leaving_revokes_its_grant_and_a_step_it_started_still_ends() -> None:
    ctl = FakeCtl()

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(run_plan(71))
            await updates(s, 71, "ready")
            node._on_worker(loaded(node, 71, 0, 1))
            (first,) = steps(ctl)
            (g,) = sent(ctl, wire.GrantSteps)
            complete(node, first, out_edges(node, 71))
            assert (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=71))).known
            await settle()
            assert sent(ctl, wire.RevokeGrant) == [wire.RevokeGrant(g.role_id, g.grant_id)]
            node._on_worker(granted(node, 71, 1, 2, g.step_id))  # started before the revoke arrived
            assert node.scheduler.in_flight is not None and node.scheduler.in_flight.step.step_id == g.step_id
            assert not sent(ctl, wire.ReleaseDeviceObject)  # the worker releases a granted step's input itself
            node._on_worker(wire.StepCompleted(g.role_id, g.step_id))
            node._on_worker(wire.GrantEnded(g.role_id, g.grant_id, 2, "revoked"))
            assert node.scheduler.in_flight is None and node.scheduler.grant is None

    asyncio.run(serve(body, ctl=ctl))


def test_grants_off_every_row_waits_for_its_execute_step() -> None:
    ctl = FakeCtl()

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        node.step_grants = False
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(run_plan(71))
            await updates(s, 71, "ready")
            for k in range(3):
                node._on_worker(loaded(node, 71, k, 1 + k))
                complete(node, steps(ctl)[-1], out_edges(node, 71))
            assert len(steps(ctl)) == 3 and not sent(ctl, wire.GrantSteps)

    asyncio.run(serve(body, ctl=ctl))


def test_no_grant_while_the_prompt_comes_row_by_row() -> None:
    ctl = FakeCtl()

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(run_plan(71))
            await updates(s, 71, "ready")
            for k, flags in enumerate((PROMPT_CONTINUES, PROMPT_CONTINUES, 0)):  # the prompt's last row has no flag
                node._on_worker(dataclasses.replace(loaded(node, 71, k, 1 + k), flags=flags))
                assert len(sent(ctl, wire.GrantSteps)) == (1 if flags == 0 else 0), k
                complete(node, steps(ctl)[-1], out_edges(node, 71))
            (g,) = sent(ctl, wire.GrantSteps)
            assert (g.sequence, g.runtime["start_pos"]) == (3, 3)  # from the first decode row on

    asyncio.run(serve(body, ctl=ctl))
