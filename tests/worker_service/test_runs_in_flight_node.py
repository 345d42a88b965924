"""Several runs in flight on one stage node (docs/runs-in-flight.md): a KV slot each, one resident role, their
one-row steps batched by the step scheduler; a run that leaves mid-batch leaves the others decoding. StageControl
over real gRPC; the compute process is the fake ctl, whose step outcomes the test gives."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from swactor.v1 import common_pb2, stage_pb2
from swactor.worker.ctl_fsm import CtlState, WorkerCrashed
from swactor.worker.node import StageNode
from swactor.worker.process import wire
from swactor.worker.stage_fsm import StageState

from .node_fakes import FakeCtl
from .plans import provision
from .test_service import NODE, ORCH, serve, settle, stub, updates

pytestmark = pytest.mark.timeout(60)


def run_plan(run_id: int, **kw: Any) -> stage_pb2.ProvisionStageRequest:
    k = run_id - 70  # distinct edges and role per run
    return provision(node_id=NODE, orchestrator=ORCH, run_id=run_id, in_edge=100 + 2 * k, out_edge=101 + 2 * k,
                     **{"run_slots": 2, "role_id": 900 + k, **kw})


def loaded(node: StageNode, run_id: int, sequence: int, handle: int) -> wire.ObjectLoaded:
    plan = node.runs[run_id].stage.plan
    assert plan is not None
    return wire.ObjectLoaded(1, plan.inbound.edge_id, 0, 7000 + handle, sequence, plan.in_row_bytes,
                             wire.DeviceHandle(1, handle), 0)


def complete(node: StageNode, step: wire.ExecuteStep, edges: dict[int, int], layers_us: int = 0) -> None:
    """What the compute process says of a step that ran: each output produced (edges: ring -> edge), then done."""
    for o in step.outputs:
        if o.ring_id in edges:
            node._on_worker(wire.ObjectProduced(o.ring_id, edges[o.ring_id], 1, o.object_id, o.sequence, o.extent))
    node._on_worker(wire.StepCompleted(step.role_id, step.step_id, layers_us=layers_us))


def out_edges(node: StageNode, *run_ids: int) -> dict[int, int]:
    out = {}
    for r in run_ids:
        stage = node.runs[r].stage
        assert stage.plan is not None and stage.out_ring_id is not None
        out[stage.out_ring_id] = stage.plan.outbound.edge_id
    return out


def steps(ctl: FakeCtl) -> list[wire.ExecuteStep]:
    return [c for c in ctl.sent if isinstance(c, wire.ExecuteStep)]


def test_two_runs_share_the_role_batch_their_rows_and_one_leaves_mid_batch() -> None:
    ctl = FakeCtl()

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(run_plan(71))
            await s.ProvisionStage(run_plan(72))  # the same weights, a free slot: in flight beside 71
            assert (await updates(s, 71, "ready"))[-1].ready.warm_weights is False
            assert (await updates(s, 72, "ready"))[-1].ready.warm_weights is True
            configs = [c.config for c in ctl.sent if isinstance(c, wire.ConfigureRole)]
            assert [(c["slot"], c["slots"]) for c in configs] == [(0, 2), (1, 2)]
            assert node.slots_in_use() == (2, 2)
            for req, code in [(run_plan(73), grpc.StatusCode.FAILED_PRECONDITION),  # both slots held
                              (run_plan(74, layers=(16, 30)), grpc.StatusCode.FAILED_PRECONDITION)]:  # other weights
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await s.ProvisionStage(req)
                assert info.value.code() == code, info.value.details()

            node._on_worker(loaded(node, 71, 0, 1))  # the compute process is idle: 71's row goes alone
            node._on_worker(loaded(node, 72, 0, 2))  # waits for the step in flight
            node._on_worker(loaded(node, 71, 1, 3))  # 71's next row: queued by its own StageController
            (first,) = steps(ctl)
            assert first.runtime == {"start_pos": 0, "slot": 0}
            complete(node, first, out_edges(node, 71))
            batch = steps(ctl)[-1]  # 72's first row and 71's next go through the stage as one step, in the order asked
            assert [b.device_handle.id for b in batch.inputs] == [2, 3]
            assert batch.runtime == {"rows": [{"slot": 1, "start_pos": 0, "sample": True},
                                              {"slot": 0, "start_pos": 1, "sample": True}]}
            assert [o.ring_id for o in batch.outputs] == [node.runs[72].stage.out_ring_id,
                                                          node.runs[71].stage.out_ring_id]

            with capture_logs() as logs:
                assert (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=72))).known  # leaves mid-batch
                assert (await updates(s, 72, "stopped"))[-1].HasField("stopped")
            # how full the stage's batches were so far, said as a run leaves: one step alone, one of two runs
            assert [e["steps_by_width"] for e in logs if e["event"] == "stage_steps_by_width" and e["run_id"] == 72] \
                == [{"1": 1, "2": 1}]
            complete(node, batch, out_edges(node, 71))
            await settle()
            assert node.runs[71].stage.state is StageState.READY and node.runs[71].stage.position == 2
            assert node.slots_in_use() == (1, 2)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await s.ProvisionStage(run_plan(76, role_id=901))  # a free slot, but run 71's role id
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
            await s.ProvisionStage(run_plan(75))  # 72's slot is free again
            assert [c.config["slot"] for c in ctl.sent if isinstance(c, wire.ConfigureRole)][-1] == 1
            node._on_worker(loaded(node, 71, 2, 4))
            assert steps(ctl)[-1].runtime == {"start_pos": 2, "slot": 0}  # 71 decodes on

    asyncio.run(serve(body, ctl=ctl))


def test_a_worker_crash_faults_every_run_in_flight_once() -> None:
    ctl = FakeCtl()

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            for run_id in (71, 72):
                await s.ProvisionStage(run_plan(run_id))
                await updates(s, run_id, "ready")
            node._on_worker(loaded(node, 71, 0, 1))
            ctl.state = CtlState.FAILED
            node._on_worker(WorkerCrashed(1, -9, "killed"))
            for run_id in (71, 72):  # a shared part: both runs end, each once with its reason
                (fault,) = [u.fault for u in await updates(s, run_id, "fault") if u.HasField("fault")]
                assert fault.reason == common_pb2.RUN_FAULT_WORKER_CRASHED
            assert node.scheduler.in_flight is None and not node.scheduler.waiting
            assert ctl.worker_generation == 1  # not restarted while a run still depends on the old generation
            for run_id in (71, 72):
                await s.StopRun(stage_pb2.StopStageRunRequest(run_id=run_id))
                await updates(s, run_id, "stopped")
            await settle()
            assert ctl.worker_generation == 2 and node.slots_in_use() == (0, 0)

    asyncio.run(serve(body, ctl=ctl))
