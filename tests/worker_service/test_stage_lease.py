"""The orchestrator's lease on a stage (worker/stage_lease.py): every transition on a scripted clock,
and the StageController's fail-stop on expiry."""

from __future__ import annotations

from swactor.v1 import common_pb2
from swactor.worker import stage_fsm as s
from swactor.worker.stage_lease import LeaseExpired, LeaseState, StageLease

from .test_stage_fsm import kinds, loaded, ready, steps


def test_never_watched_expires_one_window_after_provisioning() -> None:
    lease = StageLease.grant(7, 5.0, now=100.0)
    assert lease.state is LeaseState.UNWATCHED and lease.deadline() == 105.0
    assert lease.tick(104.999) == []
    (expired,) = lease.tick(105.0)
    assert isinstance(expired, LeaseExpired) and expired.run_id == 7 and expired.unwatched_s == 5.0
    assert "never watched" in expired.detail
    assert lease.state is LeaseState.EXPIRED and lease.deadline() is None
    assert lease.tick(200.0) == []  # expires once


def test_a_watch_holds_the_lease_and_its_end_restarts_the_window() -> None:
    lease = StageLease.grant(7, 5.0, now=0.0)
    lease.attach(1.0)
    assert lease.state is LeaseState.WATCHED and lease.deadline() is None
    assert lease.tick(1000.0) == []  # watched: no expiry however long
    lease.detach(1000.0)
    assert lease.state is LeaseState.UNWATCHED and lease.deadline() == 1005.0
    (expired,) = lease.tick(1005.5)
    assert expired.unwatched_s == 5.5 and "since its last control stream ended" in expired.detail


def test_the_window_counts_from_the_last_of_several_streams() -> None:
    lease = StageLease.grant(7, 2.0, now=0.0)
    lease.attach(0.5)
    lease.attach(0.6)  # a second WatchStage of the same run (e.g. an operator's)
    lease.detach(3.0)
    assert lease.state is LeaseState.WATCHED and lease.tick(10.0) == []
    lease.detach(10.0)
    assert lease.deadline() == 12.0


def test_a_stream_that_comes_back_within_the_window_keeps_the_run() -> None:
    lease = StageLease.grant(7, 5.0, now=0.0)
    lease.attach(0.1)
    lease.detach(1.0)
    lease.attach(5.9)  # back before 6.0
    assert lease.tick(6.0) == [] and lease.state is LeaseState.WATCHED


def test_an_ended_run_never_expires_and_ignores_late_streams() -> None:
    lease = StageLease.grant(7, 5.0, now=0.0)
    lease.end()
    assert lease.state is LeaseState.ENDED and lease.deadline() is None and lease.tick(100.0) == []
    lease.attach(101.0)
    lease.detach(102.0)
    assert lease.state is LeaseState.ENDED and lease.tick(200.0) == []


def test_detach_without_attach_changes_nothing() -> None:
    lease = StageLease.grant(7, 5.0, now=0.0)
    lease.detach(3.0)
    assert lease.deadline() == 5.0


def test_control_lost_faults_a_running_stage_fail_stop_then_stop_tears_it_down() -> None:
    c = ready()
    (st,) = steps(c.handle(loaded(0, rows=2)))
    actions = c.handle(s.ControlLost("no WatchStage stream for 5.0s"))
    assert c.state is s.StageState.FAULTED
    (report,) = [a for a in actions if isinstance(a, s.Report)]
    assert report.event.kind == common_pb2.STAGE_FAULTED
    assert report.event.reason == "RUN_FAULT_NODE_UNAVAILABLE"
    assert report.event.component == common_pb2.COMPONENT_STAGE_CONTROLLER
    assert report.cause == "StageLease.Expired" and "WatchStage" in report.detail
    stop = c.handle(s.StopRun())
    assert c.state is s.StageState.STOPPING
    assert [a for a in stop if isinstance(a, s.StopEdge)] == [s.StopEdge(10), s.StopEdge(11)]
    c.handle(s.EdgeStopped(10))
    assert kinds(c.handle(s.EdgeStopped(11))) == ["STAGE_STOPPED"]
    assert c.state is s.StageState.STOPPED and st.step_id == 1


def test_control_lost_after_a_fault_keeps_the_first_fault() -> None:
    c = ready()
    c.handle(s.WorkerGone(common_pb2.RUN_FAULT_WORKER_CRASHED, "exit -9"))
    assert c.handle(s.ControlLost("gone")) == []
    assert c.fault == (common_pb2.RUN_FAULT_WORKER_CRASHED, common_pb2.COMPONENT_WORKER_CTL)
