"""The readiness budget (orchestrator/runs/readiness.py) through the run FSM on a scripted clock: a stage that reports
progress is waited for, a fetch is given 1.5x what its measured rate says it needs, a fetch too slow to finish and a
stage that went quiet fault the run with what each waiting stage last did."""

from __future__ import annotations

from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb

from .helpers import pool
from .test_fsm import make

K = pb.LifecycleEventKind
MIB = 1 << 20
BASE = 10.0


def waiting_ready(min_fetch_bps: int = MIB) -> F.RunFsm:
    fsm = make(stages=2, timeouts=F.Timeouts(readiness_s=BASE, readiness_min_fetch_bps=min_fetch_bps))
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    fsm.handle(F.Tick(), 1.0)  # provisioned at t=1: the budget starts there
    assert fsm.state is F.RunState.WAITING_READY and fsm.deadline() == 1.0 + BASE
    return fsm


def event(kind: int, stage: int, **counters: int) -> F.Relay:
    ev = pb.LifecycleEvent(kind=kind, stage_index=stage)
    ev.counters.update(counters)
    return F.Relay(ev)


def fetching(stage: int, done: int, total: int, rate: int) -> F.Relay:
    return event(K.WEIGHTS_DOWNLOAD_PROGRESS, stage, bytes_done=done, bytes_total=total, rate_bps=rate,
                 eta_ms=int(1000 * (total - done) / max(rate, 1)))


def test_a_big_fetch_that_moves_is_given_what_its_rate_needs() -> None:
    fsm = waiting_ready()
    fsm.handle(event(K.WEIGHTS_DOWNLOAD_STARTED, 1, bytes_total=4000 * MIB), 2.0)
    assert fsm.deadline() == 2.0 + BASE
    fsm.handle(fetching(1, 100 * MIB, 4000 * MIB, 50 * MIB), 4.0)  # 78 s left at 50 MiB/s
    assert fsm.deadline() == 4.0 + 1.5 * 3900 / 50
    fsm.handle(fetching(1, 3900 * MIB, 4000 * MIB, 50 * MIB), 80.0)  # nearly there: the earlier estimate stands
    assert fsm.deadline() == 4.0 + 1.5 * 3900 / 50
    fsm.handle(event(K.WEIGHTS_DOWNLOADED, 1), 82.0)  # early: the estimate still stands
    assert fsm.deadline() == 121.0
    fsm.handle(event(K.COMPILE_PROGRESS, 1, units_done=3, units_total=9), 115.0)  # its load and compile: BASE each time
    assert fsm.deadline() == 115.0 + BASE
    for i in (0, 1):
        fsm.handle(F.StageReady(i), 125.0)
    fsm.handle(F.EndpointsReady(), 125.0)
    assert fsm.state is F.RunState.RUNNING and fsm.reason == ""


def test_a_fetch_slower_than_the_floor_is_not_waited_for() -> None:
    fsm = waiting_ready()
    fsm.handle(fetching(0, 10 * MIB, 4000 * MIB, MIB // 4), 3.0)  # 4.4 h left at 256 KiB/s: not extended past BASE
    assert fsm.deadline() == 3.0 + BASE
    assert fsm.handle(F.Tick(), 12.9) == []
    acts = fsm.handle(F.Tick(), 13.0)
    assert fsm.reason == "RUN_FAULT_READINESS_TIMEOUT" and K.RUN_FAULTED in [a.event.kind for a in acts if isinstance(a, F.Emit)]
    assert fsm.detail.startswith("stage(s) [0, 1] not ready within 10.0s of their last progress"), fsm.detail
    assert "stage 0 was fetching weights: 10.0 MiB of 4000.0 MiB at 0.2 MiB/s 10s ago" in fsm.detail, fsm.detail
    assert "stage 1 reported no progress in 12s" in fsm.detail, fsm.detail


def test_a_stage_that_goes_quiet_ends_the_wait_base_after_its_last_progress() -> None:
    fsm = waiting_ready()
    fsm.handle(F.StageReady(0), 2.0)
    fsm.handle(event(K.WEIGHTS_LOAD_PROGRESS, 1, layers_loaded=7, layers_total=15), 20.0)
    fsm.handle(event(K.WEIGHTS_LOAD_PROGRESS, 0, layers_loaded=1, layers_total=15), 40.0)  # a ready stage's: ignored
    assert fsm.deadline() == 30.0
    fsm.handle(F.Tick(), 30.0)
    assert fsm.reason == "RUN_FAULT_READINESS_TIMEOUT"
    assert fsm.detail.endswith("stage(s) [1] not ready within 10.0s of their last progress: "
                               "stage 1 was loading weights: layer 7 of 15 10s ago"), fsm.detail


def test_a_floor_of_zero_waits_for_any_fetch_that_moves_and_other_events_change_nothing() -> None:
    fsm = waiting_ready(min_fetch_bps=0)
    fsm.handle(event(K.OBJECT_LOADED, 0), 5.0)  # not progress
    fsm.handle(F.Relay(pb.LifecycleEvent(kind=K.WEIGHTS_DOWNLOADED)), 5.0)  # no stage: a node's own event
    assert fsm.deadline() == 1.0 + BASE
    fsm.handle(fetching(0, 0, 100 * MIB, 1024), 6.0)
    assert fsm.deadline() == 6.0 + 1.5 * 100 * MIB / 1024
