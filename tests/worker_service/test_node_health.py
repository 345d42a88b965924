"""The stage node's availability and restarts core (worker/node_health.py), input by input."""

from __future__ import annotations

from swactor.v1 import common_pb2 as pb
from swactor.worker.node_health import (
    Announce,
    ArenaLost,
    DriverSeen,
    NodeHealth,
    RestartsExhausted,
    RestartWorker,
    Retire,
    RunsChanged,
    WorkerLost,
    WorkerReady,
    WorkerWorks,
)


def up() -> NodeHealth:
    h = NodeHealth(max_restarts=2)
    assert h.handle(DriverSeen(True), runs_active=0, worker_down=False) == []
    assert h.handle(WorkerReady(), runs_active=0, worker_down=False) == [Announce(True)]
    return h


def test_available_only_with_worker_and_driver_and_said_once_per_change() -> None:
    h = NodeHealth()
    assert h.handle(WorkerReady(), runs_active=0, worker_down=False) == []  # the driver not seen yet
    assert h.handle(DriverSeen(True), runs_active=0, worker_down=False) == [Announce(True)]
    assert h.handle(DriverSeen(True), runs_active=0, worker_down=False) == []
    assert h.handle(DriverSeen(False), runs_active=0, worker_down=False) == [
        Announce(False, pb.RUN_FAULT_NODE_UNAVAILABLE)]
    assert h.handle(DriverSeen(True), runs_active=0, worker_down=False) == [Announce(True)]


def test_a_lost_worker_is_replaced_once_no_run_depends_on_it() -> None:
    h = up()
    assert h.handle(WorkerLost(), runs_active=2, worker_down=True) == [Announce(False, pb.RUN_FAULT_WORKER_CRASHED)]
    assert h.handle(RunsChanged(), runs_active=1, worker_down=True) == []
    assert h.handle(RunsChanged(), runs_active=0, worker_down=True) == [RestartWorker(1)]
    assert h.handle(RunsChanged(), runs_active=0, worker_down=False) == []  # spawning: not again
    assert h.handle(WorkerReady(), runs_active=0, worker_down=False) == [Announce(True)]


def test_restarts_in_a_row_are_bounded_and_work_done_resets_them() -> None:
    h = up()
    assert RestartWorker(1) in h.handle(WorkerLost(), runs_active=0, worker_down=True)
    assert h.handle(WorkerLost(), runs_active=0, worker_down=True) == [RestartWorker(2)]
    assert h.handle(WorkerLost(), runs_active=0, worker_down=True) == [RestartsExhausted(2)]
    h.handle(WorkerReady(), runs_active=0, worker_down=False)
    h.handle(WorkerWorks(), runs_active=0, worker_down=False)
    assert RestartWorker(1) in h.handle(WorkerLost(), runs_active=0, worker_down=True)


def test_arena_lost_withdraws_after_the_runs_and_retires_once() -> None:
    h = up()
    assert h.handle(ArenaLost("hand-out connection ended"), runs_active=2, worker_down=False) == []
    assert h.available  # the stages report their own faults first; membership hears after
    assert h.handle(RunsChanged(), runs_active=1, worker_down=False) == []
    assert h.handle(RunsChanged(), runs_active=0, worker_down=False) == [
        Retire("hand-out connection ended"), Announce(False, pb.RUN_FAULT_NODE_UNAVAILABLE)]
    assert h.handle(RunsChanged(), runs_active=0, worker_down=False) == []
    assert h.handle(ArenaLost("again"), runs_active=0, worker_down=False) == [] and h.arena_gone == "hand-out connection ended"
    assert h.handle(DriverSeen(True), runs_active=0, worker_down=False) == []  # never Available again


def test_arena_lost_with_no_run_retires_at_once() -> None:
    h = up()
    assert h.handle(ArenaLost("gone"), runs_active=0, worker_down=False) == [
        Retire("gone"), Announce(False, pb.RUN_FAULT_NODE_UNAVAILABLE)]
