"""Admission of several runs at once: the pure core (runs/admission.py) by tables, the run FSM's check that a
joining run sits on the group's seats, and the Orchestrator with a fake fleet whose stages take every run at once
(no sockets): runs join up to the group's slots, strictly first in first out, each run's stop and outcome its own,
and the per-run context (max_context)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from swactor.cli.render import node_line, plan_lines
from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.api.service import node_proto
from swactor.orchestrator.fleet.fleet import Report
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.models.models import ModelRegistry
from swactor.orchestrator.planning.planner import RunPlan, Seat, StagePlan, memory_need, plan_run
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.admission import Candidate, Group, Start, Wait, admit
from swactor.orchestrator.runs.manager import Limits, Orchestrator
from swactor.orchestrator.runs.store import RunStore
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

from . import harness
from .helpers import model_facts, node, pool

pytestmark = pytest.mark.timeout(60)
EOS = 2  # SmolLM2's end of text: an end-of-generation token
GiB = 1 << 30


# ---- the core ----


def group(*seats: tuple[int, int, int, int], model: str = "smol", memory: int = 0) -> Group:
    return Group(model, tuple(Seat(*s) for s in seats), (memory,) * len(seats))


TWO = group((1, 0, 15, 4), (2, 15, 30, 3))  # two stages: 4 slots on node 1, 3 on node 2


@pytest.mark.parametrize(("head", "active", "grp", "members", "want"), [
    (Candidate("other", 3), 0, None, (), Start()),  # nothing in flight: placed on its own, whatever it is
    (Candidate("smol", 2), 1, None, pool(1, 2), Wait("the runs in flight to be placed")),
    (Candidate("smol", 2), 1, TWO, pool(1, 2), Start(TWO)),
    (Candidate("smol", 2), 2, TWO, pool(1, 2), Start(TWO)),
    (Candidate("smol", 2), 3, TWO, pool(1, 2), Wait("a free run slot (3 of 3 in use)")),  # the fewest slots: node 2's
    (Candidate("other", 2), 1, TWO, pool(1, 2), Wait("the runs of model 'smol' in flight to finish")),
    (Candidate("smol", 3), 1, TWO, pool(1, 2), Wait("the runs in flight on 2 stage(s) to finish")),
    (Candidate("smol", 2, (1, 2)), 1, TWO, pool(1, 2), Start(TWO)),  # pinned to the group's nodes: joins
    (Candidate("smol", 2, (2, 1)), 1, TWO, pool(1, 2), Wait("the runs in flight on node(s) 1, 2 to finish")),
    (Candidate("smol", 2), 1, TWO, (node(1), node(2, NodeState.SUSPECT)),
     Wait("node 2 of the runs in flight to be Available, or those runs to finish")),
    (Candidate("smol", 2), 1, TWO, pool(1),
     Wait("node 2 of the runs in flight to be Available, or those runs to finish")),
    (Candidate("smol", 2), 1, TWO, (node(1), dataclasses.replace(node(2), memory_bytes=GiB)),
     Wait("the runs in flight to finish (node 2 advertises other memory now)")),
], ids=["idle", "unplaced", "joins", "joins-last-slot", "full", "other-model", "other-stages", "same-pins",
        "other-pins", "node-suspect", "node-gone", "memory-changed"])
def test_admission_of_the_queue_s_head(head: Candidate, active: int, grp: Group | None,
                                       members: Sequence[NodeInfo], want: Start | Wait) -> None:
    assert admit(head, active, grp, members, max_slots=8) == want


def test_the_group_holds_its_fewest_stage_slots_never_more_than_max_slots_per_stage() -> None:
    assert TWO.slots(8) == 3 and TWO.slots(2) == 2 and TWO.node_ids == (1, 2)
    assert admit(Candidate("smol", 2), 2, TWO, pool(1, 2), max_slots=2) == Wait("a free run slot (2 of 2 in use)")
    # from a plan: a node that did not advertise memory holds max_slots_per_stage, as its stage is told
    plan = plan_run(run_id=1, model=model_facts(), pool=pool(1, 2), stages=2, max_tokens=4, prompt_tokens=3,
                    sampling=SamplingPolicy(), orchestrator_node_id=9, max_slots_per_stage=5)
    made = Group.of("smol", plan)
    assert made.seats == (Seat(1, 0, 15, 5), Seat(2, 15, 30, 5)) and made.slots(5) == 5 and made.node_memory == (0, 0)


# ---- the run FSM: a joining run's plan must sit on the group's seats ----


def _fsm(joins: tuple[Seat, ...], max_context: int = 0) -> F.RunFsm:
    ids = itertools.count(1000)
    req = F.RunRequest(run_id=77, model=model_facts(), prompt_ids=(1, 9690, 198), stages=2, max_tokens=10,
                       sampling=SamplingPolicy(), eog_ids=frozenset({EOS}), node_ids=(1, 2), joins=joins,
                       max_context=max_context)
    fsm = F.RunFsm(req, F.FsmConfig(orchestrator_node_id=5, pool_window_s=0.0), now=0.0, id_source=lambda: next(ids))
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    return fsm


def test_a_joining_run_takes_the_group_s_blocks_and_faults_when_its_slots_would_differ() -> None:
    # the group's split, not the one these nodes give now (it was placed by speeds, or memory, as measured then)
    joined = _fsm((Seat(1, 0, 16, 8), Seat(2, 16, 30, 8)))
    assert joined.state is F.RunState.WAITING_READY and joined.plan.seats() == joined.request.joins
    fsm = _fsm((Seat(1, 0, 15, 4), Seat(2, 15, 30, 4)))  # placed with 4 slots a stage; these nodes give 8 now
    assert fsm.state is F.RunState.DONE and fsm.outcome is F.Outcome.FAULTED
    assert fsm.reason == "RUN_FAULT_NODE_UNAVAILABLE" and "would not share their weights" in fsm.detail
    assert "node 1 blocks 0..15 (4 slots)" in fsm.detail and "node 1 blocks 0..15 (8 slots)" in fsm.detail


def test_a_run_s_max_context_ends_it_context_full_within_the_model_s() -> None:
    fsm = _fsm((), max_context=5)  # 3 prompt tokens: room for 2
    for s in fsm.plan.stages:
        fsm.handle(F.StageReady(s.stage_index), 1.0)
    fsm.handle(F.EndpointsReady(), 1.0)
    fsm.handle(F.TokenReceived(0, 40), 2.0)
    fsm.handle(F.TokenReceived(1, 41), 3.0)
    assert fsm.outcome is F.Outcome.COMPLETED and fsm.reason == "context_full" and fsm.tokens == [40, 41]
    assert fsm.plan.max_seq_len == 4096  # the stages' slots stay sized for the model's context


# ---- the Orchestrator: a fleet whose stages take every run at once ----


class InFlightFleet:
    """Stages that take every run at once, a slot each. A run gets token 100 for its prompt, then its next step
    holds until `finish(run_id)`, which ends it with end-of-generation."""

    def __init__(self) -> None:
        self.plans: dict[int, RunPlan] = {}
        self.decoding: set[int] = set()  # runs holding at their second step
        self.stopped: list[int] = []  # the run of each StopRun
        self._gates: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self._reports: dict[tuple[int, int], Report] = {}

    def finish(self, run_id: int) -> None:
        self._gates[run_id].set()

    async def provision(self, plan: RunPlan, stage: StagePlan, report: Report) -> None:
        self.plans[plan.run_id] = plan
        self._reports[(plan.run_id, stage.stage_index)] = report
        asyncio.get_running_loop().call_soon(report, F.StageReady(stage.stage_index))

    async def stop_stage(self, plan: RunPlan, stage: StagePlan) -> None:
        self.stopped.append(plan.run_id)
        self._reports[(plan.run_id, stage.stage_index)](F.StageStopped(stage.stage_index))

    async def open_endpoints(self, plan: RunPlan, report: Report) -> _Endpoints:
        asyncio.get_running_loop().call_soon(report, F.EndpointsReady())
        return _Endpoints(self, plan.run_id, report)

    async def hold(self, run_id: int) -> None:
        self.decoding.add(run_id)
        await self._gates[run_id].wait()


class _Endpoints:
    def __init__(self, fleet: InFlightFleet, run_id: int, report: Report) -> None:
        self.fleet, self.run_id, self.report = fleet, run_id, report

    async def inject(self, sequence: int, token_ids: Sequence[int], flags: int = 0) -> None:
        if sequence >= 1:
            await self.fleet.hold(self.run_id)
        token = 100 if sequence == 0 else EOS
        asyncio.get_running_loop().call_soon(self.report, F.TokenReceived(sequence, token))

    async def close(self) -> None:
        pass


def registry() -> ModelRegistry:
    """Two model names on the one GGUF: runs of "other" cannot share the stages of runs of "smol"."""
    return harness.registry("smol", "other")


def orchestrator(tmp_path: Path, fleet: InFlightFleet, members: Sequence[NodeInfo], max_slots: int = 8) -> Orchestrator:
    cfg = F.FsmConfig(orchestrator_node_id=900, pool_window_s=0.0, timeouts=F.Timeouts(teardown_s=2.0),
                      max_slots_per_stage=max_slots)
    orch = Orchestrator(models=registry(), fleet=fleet, store=RunStore.in_state_dir(tmp_path / "state"),
                        fsm_config=cfg, limits=Limits(queue_depth=4))
    orch.set_members(tuple(members))
    return orch


def submit(n: int, model: str = "smol", stages: int = 1, max_tokens: int = 10, **kw) -> opb.SubmitRunRequest:
    return opb.SubmitRunRequest(prompt=f"run {n}", raw=True, max_tokens=max_tokens, model=model, stages=stages, **kw)


async def until(predicate, what: str) -> None:
    try:
        async with asyncio.timeout(10):
            while not predicate():
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def state(orch: Orchestrator, run_id: int) -> tuple[str, int]:
    run = orch.get(run_id)
    return opb.RunState.Name(run.state).removeprefix("RUN_STATE_"), run.queue_position


def outcome(orch: Orchestrator, run_id: int) -> str:
    return opb.RunOutcome.Name(orch.get(run_id).outcome).removeprefix("RUN_OUTCOME_")


def seats(plan: RunPlan) -> tuple[Seat, ...]:
    return plan.seats()


QUEUE_KINDS = (pb.RUN_QUEUED, pb.RUN_QUEUE_MOVED, pb.RUN_QUEUE_WAITING, pb.RUN_DEQUEUED)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_runs_join_up_to_the_group_s_run_slots_then_queue_and_join_as_slots_free(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        facts = registry().get("smol").facts
        whole = memory_need(facts, 4096).stage(0, 30)
        member = dataclasses.replace(node(1), memory_bytes=whole.shared + 2 * whole.kv_cache)  # room for 2 slots
        orch = orchestrator(tmp_path, fleet, (member,))
        a = await orch.submit(submit(0))
        b = await orch.submit(submit(1))
        await until(lambda: {a.run_id, b.run_id} <= fleet.decoding, "a and b decoding")
        c = await orch.submit(submit(2))
        d = await orch.submit(submit(3))
        full = dict(positions=[r.queue_position for r in (a, b, c, d)], states=[state(orch, r.run_id) for r in (c, d)],
                    slots=orch.node_slots(), live=orch.live_run_ids())
        fleet.finish(a.run_id)  # a slot frees: c joins, d moves up
        await until(lambda: c.run_id in fleet.decoding, "c decoding")
        moved = dict(d=state(orch, d.run_id), a=outcome(orch, a.run_id), slots=orch.node_slots())
        for r in (b, c, d):
            fleet.finish(r.run_id)
        await until(lambda: not orch.live_run_ids(), "every run finished")
        queue_events = {r.run_id: [(pb.LifecycleEventKind.Name(e.kind), e.detail) for e in orch.events(r.run_id).events
                                   if e.kind in QUEUE_KINDS] for r in (c, d)}
        await orch.shutdown()
        return (a, b, c, d), full, moved, queue_events

    (a, b, c, d), full, moved, queue_events = run(main())
    assert full["positions"] == [0, 0, 1, 2]  # b joined a at once; the group holds 2: c and d queue
    assert full["states"] == [("QUEUED", 1), ("QUEUED", 2)] and full["slots"] == {1: (2, 2)}
    assert full["live"] == [a.run_id, b.run_id, c.run_id, d.run_id]
    assert moved == dict(d=("QUEUED", 1), a="COMPLETED", slots={1: (2, 2)})
    assert [p.stages[0].run_slots for p in fleet.plans.values()] == [2, 2, 2, 2]
    assert len({seats(p) for p in fleet.plans.values()}) == 1  # one placement, shared by all four
    # the head says what it waits for, once per change; the run behind it only where it stands
    waiting = ("RUN_QUEUE_WAITING", "a free run slot (2 of 2 in use)")
    assert queue_events[c.run_id] == [("RUN_QUEUED", ""), waiting, ("RUN_DEQUEUED", "")]
    assert queue_events[d.run_id] == [("RUN_QUEUED", ""), ("RUN_QUEUE_MOVED", ""), waiting, ("RUN_DEQUEUED", "")]


def test_a_joining_run_is_pinned_to_the_group_s_nodes_and_blocks(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2, 3, 4))
        a = await orch.submit(submit(0, stages=2, node_ids=[3, 1]))  # a group founded on pins, in their order
        b = await orch.submit(submit(1, stages=2))  # not pinned: joins on a's nodes
        c = await orch.submit(submit(2, stages=2, node_ids=[3, 1]))  # the same pins: joins
        d = await orch.submit(submit(3, stages=2, node_ids=[1, 3]))  # other pins: waits for the group to drain
        await until(lambda: {a.run_id, b.run_id, c.run_id} <= fleet.decoding, "a, b and c decoding")
        slots = orch.node_slots()
        for r in (a, b, c):
            fleet.finish(r.run_id)
        await until(lambda: d.run_id in fleet.decoding, "d decoding")
        fleet.finish(d.run_id)
        await until(lambda: not orch.live_run_ids(), "every run finished")
        await orch.shutdown()
        return (a, b, c, d), slots

    (a, b, c, d), slots = run(main())
    assert [r.queue_position for r in (a, b, c, d)] == [0, 0, 0, 1]
    plans = fleet.plans
    assert [s.node_id for s in plans[b.run_id].stages] == [3, 1]
    assert seats(plans[a.run_id]) == seats(plans[b.run_id]) == seats(plans[c.run_id])
    assert [(s.layer_start, s.layer_end_exclusive) for s in plans[a.run_id].stages] == [(0, 15), (15, 30)]
    assert [s.node_id for s in plans[d.run_id].stages] == [1, 3]  # a new group on its own pins
    assert slots == {3: (3, 8), 1: (3, 8)}


def test_a_head_of_another_model_waits_for_the_group_to_drain_and_nobody_overtakes_it(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2))
        a = await orch.submit(submit(0))
        await until(lambda: a.run_id in fleet.decoding, "a decoding")
        b = await orch.submit(submit(1, model="other"))
        c = await orch.submit(submit(2))  # could join a, but b is ahead of it
        waiting = [state(orch, r.run_id) for r in (b, c)]
        fleet.finish(a.run_id)  # the group drains: b founds the next, c (smol) still cannot join it
        await until(lambda: b.run_id in fleet.decoding, "b decoding")
        behind_b = state(orch, c.run_id)
        fleet.finish(b.run_id)
        await until(lambda: c.run_id in fleet.decoding, "c decoding")
        fleet.finish(c.run_id)
        await until(lambda: not orch.live_run_ids(), "every run finished")
        await orch.shutdown()
        return (a, b, c), waiting, behind_b

    (a, b, c), waiting, behind_b = run(main())
    assert waiting == [("QUEUED", 1), ("QUEUED", 2)] and behind_b == ("QUEUED", 1)
    assert list(fleet.plans) == [a.run_id, b.run_id, c.run_id]  # first in, first out


def test_stopping_one_run_in_flight_leaves_the_others_decoding(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2))
        a = await orch.submit(submit(0, stages=2))
        b = await orch.submit(submit(1, stages=2))
        await until(lambda: {a.run_id, b.run_id} <= fleet.decoding, "a and b decoding")
        stopped = await orch.stop(b.run_id, "not needed")
        await until(lambda: b.run_id not in orch.live_run_ids(), "b torn down")
        a_meanwhile = state(orch, a.run_id)
        fleet.finish(a.run_id)
        await until(lambda: not orch.live_run_ids(), "a finished")
        await orch.shutdown()
        return a, b, stopped, a_meanwhile, orch.get(a.run_id)

    a, b, stopped, a_meanwhile, a_final = run(main())
    assert (stopped.outcome, stopped.reason, stopped.detail) == (opb.RUN_OUTCOME_STOPPED, "operator_stop", "not needed")
    assert fleet.stopped == [b.run_id, b.run_id, a.run_id, a.run_id]  # b's two stages, then a's at its end
    assert a_meanwhile == ("RUNNING", 0)
    assert a_final.outcome == opb.RUN_OUTCOME_COMPLETED and list(a_final.token_ids) == [100, EOS]


def test_shutdown_stops_every_run_in_flight_and_leaves_the_queued_ones_queued(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1), max_slots=2)
        runs = [await orch.submit(submit(n)) for n in range(3)]
        await until(lambda: {r.run_id for r in runs[:2]} <= fleet.decoding, "two runs decoding")
        await orch.shutdown()
        return runs, [orch.get(r.run_id) for r in runs]

    runs, finals = run(main())
    assert [r.queue_position for r in runs] == [0, 0, 1]
    assert [(f.state, f.outcome, f.detail) for f in finals[:2]] == [
        (opb.RUN_STATE_DONE, opb.RUN_OUTCOME_STOPPED, "orchestrator shutting down")] * 2
    assert finals[2].state == opb.RUN_STATE_QUEUED and sorted(fleet.stopped) == sorted(r.run_id for r in runs[:2])


def test_nodes_show_the_slots_in_use_of_the_runs_in_flight(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2, 3), max_slots=4)
        runs = [await orch.submit(submit(n, stages=2)) for n in range(2)]
        await until(lambda: {r.run_id for r in runs} <= fleet.decoding, "both decoding")
        lines = [node_line(node_proto(m, orch.node_slots().get(m.node_id, (0, 0)))) for m in orch.members]
        for r in runs:
            fleet.finish(r.run_id)
        await until(lambda: not orch.live_run_ids(), "every run finished")
        after = orch.node_slots()
        await orch.shutdown()
        return lines, after

    lines, after = run(main())
    assert lines[0].endswith(" slots 2/4 in use") and lines[1].endswith(" slots 2/4 in use")
    assert "slots" not in lines[2] and after == {}


# ---- the run's own context ----


@pytest.mark.parametrize(("req", "message"), [
    (submit(0, max_context=5000), "max_context 5000 is more than model 'smol''s context (4096 tokens"),
    (submit(0, max_context=2, max_tokens=1), "prompt is 3 tokens; max_context 2 leaves no room for a token"),
    (submit(0, max_context=3, max_tokens=1), "prompt is 3 tokens; max_context 3 leaves no room for a token"),
    (opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=[1, 2, 3, 4]), max_tokens=2, max_context=4),
     "prompt_ids is 4 tokens; max_context 4 leaves no room for a token"),
    (submit(0, max_context=8), "max_tokens 10 is more than max_context 8 holds (prompt included)"),
], ids=["over-the-model", "prompt-over", "prompt-fills-it", "prompt-ids", "max-tokens"])
def test_max_context_is_refused_by_name(tmp_path: Path, req: opb.SubmitRunRequest, message: str) -> None:
    async def main():
        orch = orchestrator(tmp_path, InFlightFleet(), pool(1))
        try:
            with pytest.raises(RequestError) as refused:
                await orch.submit(req)
            return refused.value, orch.list(10)
        finally:
            await orch.shutdown()

    refused, stored = run(main())
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT and message in refused.message and stored == []


def test_a_run_s_max_context_is_recorded_and_ends_it(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1))
        short = await orch.submit(submit(0, max_context=4, max_tokens=2))  # 3 prompt tokens: room for 1
        default = await orch.submit(submit(1))
        await until(lambda: default.run_id in fleet.decoding, "the default run decoding")
        fleet.finish(default.run_id)
        await until(lambda: not orch.live_run_ids(), "both finished")
        await orch.shutdown()
        return orch.get(short.run_id), orch.get(default.run_id)

    short, default = run(main())
    assert (short.max_context, short.prompt_tokens, short.outcome, short.reason) == (
        4, 3, opb.RUN_OUTCOME_COMPLETED, "context_full")
    assert list(short.token_ids) == [100]
    assert default.max_context == 4096 and default.reason == "eos"


def test_a_run_whose_client_is_gone_is_stopped_queued_or_running_and_a_watched_one_goes_on(tmp_path: Path) -> None:
    """stop_when_unwatched: the end of the last WatchRun stream stops the run (its slot goes to the next); a run
    without it outlives its watchers."""
    fleet = InFlightFleet()

    async def watch_one_update(orch: Orchestrator, run_id: int) -> None:
        stream = orch.watch(run_id)
        await stream.__anext__()
        await stream.aclose()  # the client went away

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1), max_slots=1)
        running = await orch.submit(submit(0, stop_when_unwatched=True))
        queued = await orch.submit(submit(1, stop_when_unwatched=True))
        kept = await orch.submit(submit(2))
        await until(lambda: running.run_id in fleet.decoding, "the first run decoding")
        await watch_one_update(orch, kept.run_id)  # no stop_when_unwatched: still queued
        await watch_one_update(orch, queued.run_id)
        await watch_one_update(orch, running.run_id)
        await until(lambda: kept.run_id in fleet.decoding, "the kept run decoding in the freed slot")
        fleet.finish(kept.run_id)
        await until(lambda: not orch.live_run_ids(), "all ended")
        await orch.shutdown()
        return [orch.get(r.run_id) for r in (running, queued, kept)]

    running, queued, kept = run(main())
    for r in (running, queued):
        assert r.outcome == opb.RUN_OUTCOME_STOPPED and "client gone" in r.detail, r
    assert kept.outcome == opb.RUN_OUTCOME_COMPLETED


def test_the_dry_run_says_what_admission_would_do_and_a_joining_run_is_placed_on_the_group(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2, 3), max_slots=2)
        alone = await orch.plan(submit(9, stages=2))
        first = await orch.submit(submit(0, stages=2))
        await until(lambda: first.run_id in fleet.decoding, "the first run decoding")
        group = list(orch.node_slots())
        joins = await orch.plan(submit(9, stages=2))
        other = await orch.plan(submit(9, model="other", stages=2))
        second = await orch.submit(submit(1, stages=2))
        await until(lambda: second.run_id in fleet.decoding, "the second run decoding")
        full = await orch.plan(submit(9, stages=2))
        await orch.submit(submit(2, stages=2))
        behind = await orch.plan(submit(9, stages=2))
        await orch.shutdown()
        return alone, group, joins, other, full, behind

    alone, group, joins, other, full, behind = run(main())
    assert alone.admission == "starts now" and not alone.refusal
    assert joins.admission == f"joins the 1 run(s) in flight on node(s) {group[0]}, {group[1]} (run slot 2 of 2)"
    assert [s.node_id for s in joins.placement] == group  # pinned to the group: its blocks and slots
    assert other.admission == "waits for the runs of model 'smol' in flight to finish"
    assert full.admission == "waits for a free run slot (2 of 2 in use)"
    assert behind.admission == "waits behind the 1 queued run(s) (first in, first out)"
    lines = plan_lines(joins)
    assert lines[-1] == f"SubmitRun would accept it; the run {joins.admission}"
