"""FailureTeardown: the teardown of a run whose FSM raised, as a core driven with a scripted clock."""

from __future__ import annotations

from swactor.orchestrator.planning.planner import StagePlan
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.failure_teardown import FailureTeardown, FailureTeardownState
from swactor.v1 import common_pb2 as pb

from .helpers import node

K = pb.LifecycleEventKind


def stage(i: int, node_id: int) -> StagePlan:
    return StagePlan(i, 2, node(node_id), 15 * i, 15 * (i + 1), 100 + i, 101 + i, 200 + i)


def emitted(actions: list[F.Action]) -> list[str]:
    return [K.Name(a.event.kind) for a in actions if isinstance(a, F.Emit)]


def test_every_stage_and_the_endpoints_confirmed_end_it_clean_before_the_deadline() -> None:
    fault = pb.LifecycleEvent(kind=pb.RUN_FAULTED, reason="RUN_FAULT_ORCHESTRATOR_INTERNAL")
    stages = [stage(0, 7), stage(1, 8)]
    core, actions = FailureTeardown.begin(stages, True, now=10.0, teardown_s=5.0, fault=fault)
    assert actions[0] == F.Emit(fault)
    assert [a for a in actions if not isinstance(a, F.Emit)] == [F.StopStage(stages[0]), F.StopStage(stages[1]), F.CloseEndpoints()]
    assert emitted(actions) == ["RUN_FAULTED", "STOP_RUN_SENT", "STOP_RUN_SENT"] and core.deadline() == 15.0
    assert emitted(core.handle(F.StageStopped(1), 11.0)) == ["STAGE_STOPPED"]
    assert core.handle(F.StageStopped(1), 11.0) == []  # a repeat confirms nothing more
    assert core.handle(F.TokenReceived(3, 9), 11.0) == []  # not a teardown input
    assert core.handle(F.EndpointsClosed(), 12.0) == []
    actions = core.handle(F.StageStopped(0), 12.0)
    assert emitted(actions) == ["STAGE_STOPPED", "RUN_TORN_DOWN"]
    torn = actions[-1].event
    assert (torn.reason, torn.detail) == ("", "") and core.state is FailureTeardownState.DONE and core.deadline() is None
    assert core.handle(F.Tick(), 20.0) == []


def test_the_deadline_names_what_was_not_confirmed() -> None:
    core, _ = FailureTeardown.begin([stage(0, 7), stage(1, 8)], True, now=0.0, teardown_s=5.0)
    core.handle(F.StageStopped(0), 1.0)
    core.handle(F.EndpointsClosed("token-out edge 9 not stopped within 20s"), 1.0)
    assert core.handle(F.Tick(), 4.9) == []
    (torn,) = [a.event for a in core.handle(F.Tick(), 5.0)]
    assert torn.kind == pb.RUN_TORN_DOWN and torn.reason == "RUN_FAULT_TEARDOWN_TIMEOUT"
    assert torn.detail == "token endpoints: token-out edge 9 not stopped within 20s; no StageStopped from stage 1 on node 8"


def test_nothing_sent_nothing_to_wait_for() -> None:
    core, actions = FailureTeardown.begin([], False, now=0.0, teardown_s=5.0)
    assert emitted(actions) == ["RUN_TORN_DOWN"] and actions[0].event.detail == "" and core.deadline() is None
    _, actions = FailureTeardown.begin([], True, now=0.0, teardown_s=0.0)
    assert actions[-1].event.detail == "token endpoints not closed"
