"""Teardowns that cannot confirm every part, and a run driver that raises (issue 12): the run still
ends once, its stages get StopRun, its token endpoints are closed, and run_torn_down names what was
left with RUN_FAULT_TEARDOWN_TIMEOUT."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from pathlib import Path

import pytest

from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.fleet.fleet import FleetError
from swactor.orchestrator.fleet.nodes import NodeState
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.runner import RunHandle
from swactor.orchestrator.runs.store import RunStore
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeEndpoints, FakeFleet
from .harness import registry
from .helpers import model_facts, pool

pytestmark = pytest.mark.timeout(30)
K = pb.LifecycleEventKind


def make_fsm(teardown_s: float = 30.0, fsm_class: type[F.RunFsm] = F.RunFsm, now: float = 0.0) -> F.RunFsm:
    counter = itertools.count(1000)
    req = F.RunRequest(run_id=77, model=model_facts(), prompt_ids=(1, 2, 3), stages=2, max_tokens=8,
                       sampling=SamplingPolicy(), eog_ids=frozenset({2}))
    cfg = F.FsmConfig(orchestrator_node_id=5, pool_window_s=0.0, timeouts=F.Timeouts(teardown_s=teardown_s))
    return fsm_class(req, cfg, now=now, id_source=lambda: next(counter))


def test_token_endpoints_left_open_make_a_teardown_timeout_naming_them() -> None:
    fsm = make_fsm()
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    fsm.handle(F.Tick(), 0.0)
    fsm.handle(F.OperatorStop("stop"), 1.0)
    assert fsm.state is F.RunState.TEARING_DOWN
    fsm.handle(F.StageStopped(0), 2.0)
    fsm.handle(F.StageStopped(1), 2.0)
    acts = fsm.handle(F.EndpointsClosed("token-in edge 1001 not stopped within 20s (StoppingPump)"), 2.0)
    (torn,) = [a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_TORN_DOWN]
    assert torn.reason == "RUN_FAULT_TEARDOWN_TIMEOUT"
    assert torn.detail == "token endpoints: token-in edge 1001 not stopped within 20s (StoppingPump)"
    assert torn.counters["stages_unconfirmed"] == 0
    assert fsm.state is F.RunState.DONE and fsm.reason == "operator_stop"  # the outcome stays


class RaisingFsm(F.RunFsm):
    """A bug in the run FSM: it raises on the second token."""

    def handle(self, event: F.Input, now: float) -> list[F.Action]:
        if isinstance(event, F.TokenReceived) and event.sequence == 1:
            raise RuntimeError("scripted bug")
        return super().handle(event, now)


class SlowClosingEndpoints(FakeEndpoints):
    async def close(self) -> None:
        await super().close()
        raise FleetError(pb.RUN_FAULT_TEARDOWN_TIMEOUT, "token-out edge 9 not stopped within 20s (StoppingWorkerRing)")


async def drive(tmp_path: Path, fleet: FakeFleet, teardown_s: float = 5.0) -> tuple[RunHandle, RunStore]:
    store = RunStore(tmp_path / "o.sqlite3")
    fsm = make_fsm(teardown_s, RaisingFsm, now=time.monotonic())
    record = opb.Run(run_id=77, state=opb.RUN_STATE_WAITING_POOL, stages=2, created_us=1)
    handle = RunHandle(fsm, record, registry().get("").tokenizer, fleet, store)
    handle.report(F.MembershipChanged(pool(1, 2)))
    await asyncio.wait_for(handle.drive(), 20)
    return handle, store


def test_a_driver_that_raises_still_stops_every_stage_and_closes_the_endpoints(tmp_path: Path) -> None:
    fleet = FakeFleet([7, 8, 9])
    handle, store = asyncio.run(drive(tmp_path, fleet))
    assert sorted(fleet.stopped) == [0, 1] and fleet.closed == 1
    r = handle.record
    assert r.state == opb.RUN_STATE_DONE and r.outcome == opb.RUN_OUTCOME_FAULTED
    assert r.reason == "RUN_FAULT_ORCHESTRATOR_INTERNAL" and "scripted bug" in r.detail and r.torn_down_us
    kinds = [K.Name(e.kind) for e in store.events(77)]
    assert kinds.count("RUN_FAULTED") == 1 and kinds[-1] == "RUN_TORN_DOWN"
    assert kinds.count("STOP_RUN_SENT") == 2 and kinds.count("STAGE_STOPPED") == 2
    assert store.events(77, K.RUN_TORN_DOWN)[0].reason == ""
    assert handle.updates.items[-1].finished.reason == "RUN_FAULT_ORCHESTRATOR_INTERNAL"


def test_a_driver_that_raises_names_what_its_teardown_could_not_confirm(tmp_path: Path) -> None:
    fleet = FakeFleet([7, 8, 9], never_stop=True)
    original = fleet.open_endpoints

    async def slow_endpoints(plan, report):  # type: ignore[no-untyped-def]
        await original(plan, report)
        return SlowClosingEndpoints(fleet, report)

    fleet.open_endpoints = slow_endpoints  # type: ignore[method-assign]
    _, store = asyncio.run(drive(tmp_path, fleet, teardown_s=0.5))
    assert sorted(fleet.stopped) == [0, 1]
    (torn,) = store.events(77, K.RUN_TORN_DOWN)
    assert torn.reason == "RUN_FAULT_TEARDOWN_TIMEOUT"
    assert "token endpoints: token-out edge 9 not stopped" in torn.detail
    assert "no StageStopped from stage 0 on node 1" in torn.detail and "stage 1 on node 2" in torn.detail


def test_a_node_lost_mid_run_is_not_waited_for_in_the_teardown_it_caused() -> None:
    fsm = make_fsm()
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    fsm.handle(F.Tick(), 0.0)
    for i in (0, 1):
        fsm.handle(F.StageReady(i), 1.0)
    fsm.handle(F.EndpointsReady(), 1.0)
    assert fsm.state is F.RunState.RUNNING
    gone = (pool(1)[0], dataclasses.replace(pool(2)[0], state=NodeState.LEFT))
    acts = fsm.handle(F.MembershipChanged(gone), 2.0)
    assert fsm.reason == "RUN_FAULT_MEMBERSHIP_LOST"
    stopped = [a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.STAGE_STOPPED]
    assert [(e.stage_index, e.reason) for e in stopped] == [(1, "RUN_FAULT_MEMBERSHIP_LOST")]
    fsm.handle(F.StageStopped(0), 2.5)
    acts = fsm.handle(F.EndpointsClosed(), 2.5)
    (torn,) = [a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_TORN_DOWN]
    assert torn.reason == "" and fsm.state is F.RunState.DONE  # no teardown timeout waited out
