"""A node with several stage devices (GPUs) carries several stages of one run: placement over (node, device) units,
pins naming a node more than once, warm reuse by unit, the device and stage index on the wire, the texts that name
them. Pure and fast, except the StageControl calls (one loopback gRPC server)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path

import grpc
import pytest

from swactor.cli.render import node_line, plan_lines, run_detail
from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.api.service import node_proto
from swactor.orchestrator.fleet import reconcile as R
from swactor.orchestrator.fleet.membership_client import node_info
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.fleet.reconcile_shell import MtlsControl
from swactor.orchestrator.fleet.stage_fleet import StageControlFleet, provision_request
from swactor.orchestrator.planning.dry_run import plan_response, pool_refusal
from swactor.orchestrator.planning.placement import (
    MAX_ORDERS_TRIED,
    Network,
    PlanError,
    Shortfall,
    fewest_stages,
    place,
    unit_orders,
)
from swactor.orchestrator.planning.planner import PlanError as PlannerError
from swactor.orchestrator.planning.planner import plan_run, validate_plan
from swactor.orchestrator.planning.pool import Demand, PoolGate
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.admission import Candidate, Group, Start, Wait, admit
from swactor.v1 import common_pb2 as pb
from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import stage_pb2, stage_pb2_grpc

from .helpers import model_facts, node
from .test_admission import InFlightFleet, orchestrator, submit, until
from .test_placement import SMOL, GiB, need
from .test_placement_network import symmetric

pytestmark = pytest.mark.timeout(60)
A, B, C = 1, 2, 3


def member(node_id: int, devices: int = 1, memory: int = 64 * GiB) -> NodeInfo:
    return dataclasses.replace(node(node_id), devices=devices, memory_bytes=memory)


def abc(devices_a: int = 2) -> tuple[NodeInfo, ...]:
    """Node A with `devices_a` stage devices, nodes B and C with one each."""
    return member(A, devices_a), member(B), member(C)


def units(p) -> list[tuple[int, int]]:
    return [n.unit for n in p.nodes]


def test_a_node_is_as_many_units_as_it_has_stage_devices() -> None:
    a = member(A, 3)
    assert [u.unit for u in a.units()] == [(A, 0), (A, 1), (A, 2)]
    assert all(u.memory_bytes == a.memory_bytes and u.devices == 3 for u in a.units())  # memory is per device
    assert [u.unit for u in member(B).units()] == [(B, 0)]
    assert [u.where for u in a.units()[:2]] == ["node 1 device 0", "node 1 device 1"] and member(B).where == "node 2"


def test_membership_metadata_without_stage_devices_means_one() -> None:
    def info(devices: int) -> NodeInfo:
        md = mpb.NodeMetadata(node_id=7, state=mpb.NODE_STATE_AVAILABLE, stage_devices=devices,
                              stage_memory_bytes=GiB)
        return node_info(mpb.Member(metadata=md, status=mpb.MEMBER_STATUS_ALIVE, gossip_address="10.0.0.7:7946"))

    assert info(0).devices == 1 and info(1).devices == 1
    assert info(4).devices == 4 and info(4).memory_bytes == GiB and len(info(4).units()) == 4


def test_the_orchestrators_multi_gpu_node_takes_consecutive_stages_before_the_ring_crosses_the_network() -> None:
    pool = abc()
    # nothing measured: on A (the orchestrator's node) the first two stages cost no hop between hosts
    assert units(place(pool, 3, 30, memory=need(SMOL), network=Network(origin=A))) == [(A, 0), (A, 1), (B, 0)]
    rtt = symmetric(a1b2=5, a1b3=5, a2b3=5)
    assert units(place(pool, 3, 30, memory=need(SMOL), network=Network(A, rtt))) == [(A, 0), (A, 1), (B, 0)]
    assert units(place(pool, 2, 30, memory=need(SMOL), network=Network(A, rtt))) == [(A, 0), (A, 1)]
    # without a network: node-id order, a node's devices in order
    assert units(place(pool, 3, 30, memory=need(SMOL))) == [(A, 0), (A, 1), (B, 0)]
    # the multi-GPU node's id last: C A C has as few hops between hosts as C C A, but two activation hops over the
    # network where C C A has one (its last hop carries tokens)
    late = (member(A), member(B), member(C, 2))
    assert units(place(late, 3, 30, memory=need(SMOL), network=Network(C))) == [(C, 0), (C, 1), (A, 0)]


def test_a_cheap_multi_gpu_node_is_filled_before_a_far_one_is_used() -> None:
    pool = abc()
    # the orchestrator on C; A is 1 ms away, B 30 ms: C, then A's two devices (A-A hops cost nothing)
    rtt = symmetric(a1b3=1, a2b3=30, a1b2=30)
    p = place(pool, 3, 30, memory=need(SMOL), network=Network(C, rtt))
    assert units(p) == [(C, 0), (A, 0), (A, 1)] and p.ring_ms == 2.0
    # the orchestrator elsewhere: the ring over A's two devices and one more node has the fewest hops between hosts,
    # and between stages A's devices are adjacent (one activation hop over the network, not two)
    p = place(pool, 3, 30, memory=need(SMOL), network=Network(99))
    assert units(p) == [(A, 0), (A, 1), (B, 0)]


def test_orders_that_only_swap_a_nodes_devices_are_one_plan() -> None:
    pool = [*member(A, 4).units(), *member(B).units()]
    orders = [tuple(u.unit for u in o) for o in unit_orders(pool, 3)]
    # A A A, A A B, A B A, B A A: each node's devices in order; not the 60 permutations of 5 units
    assert orders == [((A, 0), (A, 1), (A, 2)), ((A, 0), (A, 1), (B, 0)), ((A, 0), (B, 0), (A, 1)),
                      ((B, 0), (A, 0), (A, 1))]
    single = [*member(A).units(), *member(B).units(), *member(C).units()]
    assert len(list(unit_orders(single, 2))) == len(list(itertools.permutations(single, 2)))


def test_many_gpus_per_host_place_fast_and_fill_the_orchestrators_host() -> None:
    rtt = symmetric(**{f"a{i}b{j}": 10.0 for i in range(1, 9) for j in range(i + 1, 9)})
    four = tuple(member(i, 8) for i in range(1, 5))  # 4 ** 6 node sequences: tried exhaustively
    assert len(list(itertools.islice(unit_orders([u for n in four for u in n.units()], 6), MAX_ORDERS_TRIED + 1))) \
        <= MAX_ORDERS_TRIED
    p = place(four, 6, 30, memory=need(SMOL), network=Network(2, rtt))
    assert units(p) == [(2, d) for d in range(6)]
    eight = tuple(member(i, 8) for i in range(1, 9))  # 8 ** 8: nearest neighbour
    p = place(eight, 8, 30, memory=need(SMOL), network=Network(3, rtt))
    assert units(p) == [(3, d) for d in range(8)]
    # more stages than a host has devices: each host filled in turn before the next is crossed to
    p = place(eight[:3], 20, 30, memory=need(SMOL), network=Network(1, rtt))
    assert units(p) == [*((1, d) for d in range(8)), *((2, d) for d in range(8)), *((3, d) for d in range(4))]


def test_pins_name_a_node_once_per_device() -> None:
    pool = abc()
    assert units(place(pool, 3, 30, (A, A, B), need(SMOL), Network(A))) == [(A, 0), (A, 1), (B, 0)]
    assert units(place(pool, 3, 30, (B, A, A), need(SMOL))) == [(B, 0), (A, 0), (A, 1)]
    assert units(place(pool, 3, 30, (A, B, A), need(SMOL))) == [(A, 0), (B, 0), (A, 1)]
    with pytest.raises(PlanError, match=r"node 1 is named 3 times but has 2 stage device\(s\)"):
        place(pool, 3, 30, (A, A, A), need(SMOL))
    with pytest.raises(PlanError, match=r"node 2 is named 2 times but has 1 stage device\(s\)"):
        place(pool, 2, 30, (B, B))
    # SubmitRun refuses it by name while the node is Available (a node not Available yet is waited for)
    assert pool_refusal(pool, Demand(3, (A, A, A))) == "node 1 is named 3 times but has 2 stage device(s)"
    assert pool_refusal(pool, Demand(3, (A, A, B))) == ""


def test_the_pool_counts_stage_devices_and_their_memory_each() -> None:
    with pytest.raises(PlanError, match=r"4 stage\(s\) need 4 stage device\(s\), the pool has 3 on 2 Available node"):
        place((member(A, 2), member(B), dataclasses.replace(member(C, 4), state=NodeState.BOOTING)), 4, 30)
    assert units(place((member(A, 4),), 4, 30)) == [(A, d) for d in range(4)]  # one host, four GPUs, four stages
    assert "stage device(s); the pool has 3 on 2 Available node(s)" in pool_refusal(abc()[:2], Demand(4))
    # a device holds half the model, not all of it: two stages, both on the one host's two devices
    one, half = need(SMOL).stage(0, 30).total, max(need(SMOL).stage(0, 15).total, need(SMOL).stage(15, 30).total)
    host = (member(A, 2, (half + one) // 2),)
    assert fewest_stages(host, 30, need(SMOL), Network(A)) == 2
    assert units(place(host, 2, 30, memory=need(SMOL), network=Network(A))) == [(A, 0), (A, 1)]
    with pytest.raises(Shortfall, match=r"on node 1 device 1 needs .* the device offers"):
        place((member(A, 2, half // 2),), 2, 30, memory=need(SMOL))


def test_the_last_runs_units_stay_warm_not_just_its_nodes() -> None:
    pool = abc()
    rtt = symmetric(a1b2=10, a1b3=9, a2b3=10)
    assert units(place(pool, 3, 30, memory=need(SMOL), network=Network(A, rtt))) == [(A, 0), (A, 1), (C, 0)]
    warm = Network(A, rtt, warm={3: ((A, 0), (A, 1), (B, 0))})  # 20 ms against 18: within the margin
    assert units(place(pool, 3, 30, memory=need(SMOL), network=warm)) == [(A, 0), (A, 1), (B, 0)]
    # A now runs one device: the warm ring's (A, 1) is gone, so it is not kept
    fewer = (member(A, 1), member(B), member(C))
    assert units(place(fewer, 3, 30, memory=need(SMOL), network=warm)) == [(A, 0), (B, 0), (C, 0)]


def test_the_gate_restarts_when_a_nodes_stage_devices_change_and_names_each_node_once() -> None:
    gate = PoolGate(1.0)
    gate.observe(abc(), 0.0)
    status = gate.check(2.0, Demand(3))
    assert status.ready and status.detail.startswith("node(s) 1, 2 Available")
    gate.observe((member(A, 3), member(B), member(C)), 2.0)
    assert not gate.check(2.5, Demand(3)).ready


def plan3(node_ids=(A, A, B), pool=None):
    ids = itertools.count(500)
    return plan_run(run_id=7, model=model_facts(), pool=pool or abc(), stages=3, max_tokens=8, prompt_tokens=5,
                    sampling=SamplingPolicy(), orchestrator_node_id=900, node_ids=node_ids,
                    id_source=lambda: next(ids))


def test_provision_requests_carry_each_stages_device() -> None:
    plan = plan3()
    reqs = [provision_request(plan, s, Path("/models/m.gguf")) for s in plan.stages]
    assert [(r.node_id, r.device_index, r.stage_index) for r in reqs] == [(A, 0, 0), (A, 1, 1), (B, 0, 2)]
    # the edge between A's two stages has A at both ends (the node's edge driver links it in-process)
    assert (reqs[0].outbound.consumer_node_id, reqs[1].inbound.producer_node_id) == (A, A)
    assert [s.counters().get("device") for s in plan.stages] == [0, 1, None]
    assert [(s.node_id, s.device) for s in plan.seats()] == [(A, 0), (A, 1), (B, 0)]


@pytest.mark.parametrize(
    ("devices", "needle"),
    [((1, 1, 0), "a stage device holds more than one stage"),
     ((1, 0, 0), "expected device 0"),
     ((0, 2, 0), "has 2 stage device\\(s\\), not device 2")],
)
def test_validate_catches_stages_on_wrong_devices(devices: tuple[int, ...], needle: str) -> None:
    plan = plan3()
    stages = tuple(dataclasses.replace(s, node=dataclasses.replace(s.node, device=d))
                   for s, d in zip(plan.stages, devices, strict=True))
    with pytest.raises(PlannerError, match=needle):
        validate_plan(dataclasses.replace(plan, stages=stages))


def test_the_dry_run_and_the_run_record_name_the_device_of_a_node_with_several_stages() -> None:
    pool = abc()
    demand = Demand(3, (), 30, need(SMOL))
    status = PoolGate(0.0)
    status.observe(pool, 0.0)
    answer = plan_response("smol", pool, demand, status.check(1.0, demand), prompt_tokens=5, max_seq_len=4096,
                           network=Network(A))
    stages = [line for line in plan_lines(answer) if line.startswith("  stage")]
    assert [line.split(" blocks")[0] for line in stages] == ["  stage 0: node 1 device 0", "  stage 1: node 1 device 1",
                                                              "  stage 2: node 2"]
    assert list(answer.hop_rtt_ms)[:2] == [0.0, 0.0]  # into A and between A's devices: same host
    assert [(s.node_id, s.device_index) for s in answer.placement] == [(A, 0), (A, 1), (B, 0)]
    run = opb.Run(run_id=7, stages=3)
    for k, (n, d) in enumerate(((B, 0), (A, 0), (A, 1))):
        run.placement.add(stage_index=k, node_id=n, device_index=d, layer_start=10 * k, layer_end_exclusive=10 * k + 10)
    assert [line.split(" layers")[0] for line in run_detail(run).splitlines()[1:]] == [
        "  stage 0: node 2", "  stage 1: node 1 device 0", "  stage 2: node 1 device 1"]


def test_nodes_shows_a_nodes_stage_devices() -> None:
    two, one = node_proto(member(A, 2, 40 * GiB)), node_proto(member(B, 1, 40 * GiB))
    assert (two.stage_devices, one.stage_devices) == (2, 1)
    assert "2 stage devices, 40.00 GiB each" in node_line(two)
    assert "stage memory 40.00 GiB" in node_line(one) and "stage devices" not in node_line(one)


def test_a_lost_node_faults_the_run_once_for_all_its_stages() -> None:
    counter = itertools.count(1000)
    req = F.RunRequest(run_id=77, model=model_facts(), prompt_ids=(1, 2, 3), stages=3, max_tokens=4,
                       sampling=SamplingPolicy(), eog_ids=frozenset({2}))
    fsm = F.RunFsm(req, F.FsmConfig(orchestrator_node_id=5, pool_window_s=0.0), now=0.0, id_source=lambda: next(counter))
    fsm.handle(F.MembershipChanged(abc()), 0.0)
    fsm.handle(F.Tick(), 0.0)
    assert [s.node.unit for s in fsm.plan.stages] == [(A, 0), (A, 1), (B, 0)]
    for s in fsm.plan.stages:
        fsm.handle(F.StageReady(s.stage_index), 1.0)
    fsm.handle(F.EndpointsReady(), 1.0)
    assert fsm.state is F.RunState.RUNNING
    lost = (dataclasses.replace(member(A, 2), state=NodeState.FAULTED), member(B), member(C))
    assert fsm.handle(F.MembershipChanged(lost), 2.0) == []  # its word held: its stages' own reports first
    assert fsm.deadline() == 2.0 + F.ECHO_GRACE_S
    acts = fsm.handle(F.Tick(), 2.0 + F.ECHO_GRACE_S)  # none came
    faulted = [a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == pb.RUN_FAULTED]
    assert len(faulted) == 1 and faulted[0].detail == "node 1 (stages 0, 1) left the pool or faulted"
    stopped = [a.event.stage_index for a in acts if isinstance(a, F.Emit) and a.event.kind == pb.STAGE_STOPPED]
    assert stopped == [0, 1]  # A cannot confirm: its run state died with it; stage 2 on B is still asked
    again = fsm.handle(F.MembershipChanged(lost), 3.5)
    assert not [a for a in again if isinstance(a, F.Emit) and a.event.kind == pb.RUN_FAULTED]
    assert fsm.outcome is F.Outcome.FAULTED and fsm.reason == "RUN_FAULT_MEMBERSHIP_LOST"


def test_a_group_on_two_devices_of_a_node_waits_when_it_advertises_fewer() -> None:
    group = Group.of("smol", plan3())
    assert group.node_ids == (A, A, B)
    assert isinstance(admit(Candidate("smol", 3), 1, group, abc(), 8), Start)
    why = admit(Candidate("smol", 3), 1, group, (member(A, 1), member(B), member(C)), 8)
    assert isinstance(why, Wait) and "node 1 advertises 1 stage device(s) now" in why.why
    assert "node(s) 1, 2 to finish" in admit(Candidate("smol", 3, (B, A, A)), 1, group, abc(), 8).why  # type: ignore[union-attr]


def test_runs_in_flight_on_a_nodes_two_devices_count_once_there_and_warm_by_unit(tmp_path: Path) -> None:
    fleet = InFlightFleet()
    pool = (member(A, 2), member(B))

    async def main():
        orch = orchestrator(tmp_path, fleet, pool)
        a = await orch.submit(submit(0, stages=2, node_ids=[A, A]))
        b = await orch.submit(submit(1, stages=2))  # joins a: pinned to A's two devices
        await until(lambda: {a.run_id, b.run_id} <= fleet.decoding, "a and b decoding")
        slots, warm, blocks = orch.node_slots(), dict(orch.network.warm), dict(orch.network.warm_blocks)
        for r in (a, b):
            fleet.finish(r.run_id)
        await until(lambda: not orch.live_run_ids(), "every run finished")
        placed = [(p.node_id, p.device_index) for p in orch.get(b.run_id).placement]
        await orch.shutdown()
        return (a, b), slots, warm, blocks, placed

    (a, b), slots, warm, blocks, placed = asyncio.run(asyncio.wait_for(main(), 30))
    assert placed == [(A, 0), (A, 1)]  # the run record keeps each stage's device
    plans = fleet.plans
    assert [s.node.unit for s in plans[a.run_id].stages] == [s.node.unit for s in plans[b.run_id].stages] == \
        [(A, 0), (A, 1)]
    assert slots == {A: (2, 8)}  # two runs on A (each on both its devices), not four
    assert warm == {2: ((A, 0), (A, 1))}
    # and the blocks they hold there: the next split must beat them by SPEED_GAIN (placement.Network.warm_blocks)
    assert blocks == {((A, 0), (A, 1)): tuple((s.layer_start, s.layer_end_exclusive) for s in plans[a.run_id].stages)}


# ---- StopRun and WatchStage name the stage: its node may hold another stage of the run ----


class RecordingStageControl(stage_pb2_grpc.StageControlServicer):
    def __init__(self) -> None:
        # (method, run_id, the stage index asked for, None when unset; ProvisionStage: the device index)
        self.calls: list[tuple[str, int, int | None]] = []
        self.stopped: dict[int, asyncio.Event] = {}

    @staticmethod
    def _index(request) -> int | None:
        return request.stage_index if request.HasField("stage_index") else None

    async def ProvisionStage(self, request, context):
        self.calls.append(("provision", request.run_id, request.device_index))
        self.stopped[request.stage_index] = asyncio.Event()
        return stage_pb2.ProvisionStageResponse(run_id=request.run_id, node_id=request.node_id,
                                                stage_index=request.stage_index)

    async def StopRun(self, request, context):
        self.calls.append(("stop", request.run_id, self._index(request)))
        if self._index(request) in self.stopped:
            # StageStopped after the answer: the fleet closes a stage's channel when its watch ends, which would
            # cancel a StopRun still being answered on it (a race of the fleet's, not what this test is about)
            asyncio.get_running_loop().call_later(0.05, self.stopped[self._index(request)].set)  # type: ignore[index]
        return stage_pb2.StopStageRunResponse(known=True)

    async def WatchStage(self, request, context):
        index = self._index(request)
        self.calls.append(("watch", request.run_id, index))
        base = dict(run_id=request.run_id, node_id=A, stage_index=index or 0)
        yield stage_pb2.StageUpdate(ready=stage_pb2.StageReady(), **base)
        if index in self.stopped:
            await self.stopped[index].wait()  # type: ignore[index]
        yield stage_pb2.StageUpdate(stopped=stage_pb2.StageStopped(), **base)


def test_stop_run_and_watch_stage_carry_the_stage_index() -> None:
    servicer = RecordingStageControl()

    async def main():
        server = grpc.aio.server()
        stage_pb2_grpc.add_StageControlServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            def channel(_) -> grpc.aio.Channel:  # one address stands for node A
                return grpc.aio.insecure_channel(f"127.0.0.1:{port}")

            fleet = StageControlFleet(channel, lambda plan, report: Path("/models/m.gguf"))
            plan = plan3((A, A, B))
            reported: list = []
            for s in plan.stages[:2]:  # both on A
                await fleet.provision(plan, s, reported.append)
            async with asyncio.timeout(10):
                while sum(isinstance(i, F.StageReady) for i in reported) < 2:
                    await asyncio.sleep(0.01)
            for s in reversed(plan.stages[:2]):
                await fleet.stop_stage(plan, s)
            async with asyncio.timeout(10):
                while sum(isinstance(i, F.StageStopped) for i in reported) < 2:
                    await asyncio.sleep(0.01)
            # the restart reconciler's calls name the stage too
            control = MtlsControl(channel)
            known = await control.stop_run(member(A, 2), 8, 1)
            await control.wait_stopped(member(A, 2), 8, 0)
            return plan, known
        finally:
            await server.stop(0.5)

    plan, known = asyncio.run(asyncio.wait_for(main(), 30))
    run = plan.run_id
    assert known
    assert [c for c in servicer.calls if c[0] == "provision"] == [("provision", run, 0), ("provision", run, 1)]
    assert sorted(c for c in servicer.calls if c[0] == "watch" and c[1] == run) == [("watch", run, 0), ("watch", run, 1)]
    assert [c for c in servicer.calls if c[0] == "stop" and c[1] == run] == [("stop", run, 1), ("stop", run, 0)]
    assert ("stop", 8, 1) in servicer.calls and ("watch", 8, 0) in servicer.calls


def test_restart_reconciliation_stops_each_stage_of_a_node_by_index() -> None:
    core = R.Reconciler((R.Leftover(9, ((0, A), (1, A), (2, B)), (10, 11)),))
    acts = core.handle(R.View(abc()), 0.0)
    assert sorted((a.stage_index, a.node.node_id) for a in acts if isinstance(a, R.SendStopRun)) == \
        [(0, A), (1, A), (2, B)]
    core.handle(R.StopAnswered(9, 0, known=False), 0.1)
    assert core.busy_nodes() == {A: (9,), B: (9,)}  # A still holds stage 1
    core.handle(R.StopAnswered(9, 1, known=False), 0.2)
    assert core.busy_nodes() == {B: (9,)}
