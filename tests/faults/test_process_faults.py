"""Processes killed or frozen mid-decode on the interior stage's host (stage 1 on h1 of a 3-stage
run h0 -> h1 -> h2; the orchestrator runs on h0), each checked end to end (tests/faults/checks.py)."""

from __future__ import annotations

import time

import pytest

from swactor.arena.client import EXIT_ARENA_LOST
from swactor.localcluster import ready as cready
from swactor.orchestrator.fleet.node_events import POOL_EVENTS_RUN_ID
from swactor.v1 import common_pb2 as pb
from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import orchestrator_pb2 as opb
from tests.faults import inject
from tests.faults.checks import HOST_LOST, HOST_SERVICES, C, FaultCheck, expect
from tests.faults.pool import FaultPool, NotYet, RunWatch, wait_until

INTERIOR = 1


def decoding(pool: FaultPool) -> RunWatch:
    """A 3-stage run that is surely still decoding when the fault hits."""
    run = pool.submit(max_tokens=2000)
    run.wait_tokens(3)
    return run


def test_sigkill_compute_process(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "SIGKILL compute process (interior)",
                       expect((pb.RUN_FAULT_WORKER_CRASHED, C.COMPONENT_WORKER_CTL)), test=request.node.nodeid)
    run = decoding(pool)
    t = inject.kill_compute(pool, INTERIOR)
    check.outcome(run, t)
    check.no_leases((0, 1, 2))
    check.survivors_alive()  # the worker service restarts its compute process itself (a new generation)
    # The node said Faulted, then Available with the new process: wait until the orchestrator has seen the
    # latter (a pool event), or the next run may be placed on the stale Available and fault MEMBERSHIP_LOST
    # when the Faulted arrives after it (seen in a CI run).
    check.next_run(restart=lambda: wait_until("node available again", lambda: available_since(pool, t), 90))


def test_sigkill_worker_service(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    # Two first detectors: the orchestrator's WatchStage to the dead worker breaks, and h1's edge driver
    # stops the dead worker's edges at once (their owner is gone), which a neighbour stage's pump sees
    # as its peer stopping the stream.
    check = FaultCheck(pool, "SIGKILL worker service (interior)",
                       expect((pb.RUN_FAULT_NODE_UNAVAILABLE, C.COMPONENT_ORCHESTRATOR),
                              (pb.RUN_FAULT_STREAM_FAULT, C.COMPONENT_EDGE_DRIVER)),
                       killed=("h1/worker",), test=request.node.nodeid)
    run = decoding(pool)
    check.outcome(run, inject.kill_service(pool, "h1/worker"))
    check.no_leases((0, 2))
    check.survivors_alive()
    # h1's edge driver stopped the dead worker's edges (their owner's WatchEdges stream ended) and
    # dropped its ring holds; h1's compute process outlives its worker until the service manager stops
    # the unit's group (KillMode=control-group): the worker's leases go with that restart.
    check.restart_killed()
    check.no_leases((0, 1, 2))
    check.next_run()


def test_sigkill_edge_driver(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "SIGKILL edge-driver (interior)",
                       expect((pb.RUN_FAULT_MEMBERSHIP_LOST, C.COMPONENT_MEMBERSHIP),
                              (pb.RUN_FAULT_STREAM_FAULT, C.COMPONENT_EDGE_DRIVER)),
                       killed=("h1/edge",), test=request.node.nodeid)
    run = decoding(pool)
    check.outcome(run, inject.kill_service(pool, "h1/edge"))
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run(restart=check.restart_killed)


def test_sigkill_arena_manager(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    # The worker and the edge driver hear the arena's hand-out connection end: the stage faults naming
    # the arena, tears down, the node is withdrawn, then both exit EX_TEMPFAIL for their service manager
    # to start them on the new arena (docs/faults.md).
    check = FaultCheck(pool, "SIGKILL arena-manager (interior)",
                       expect((pb.RUN_FAULT_NODE_UNAVAILABLE, C.COMPONENT_ARENA), detail_has="ArenaManager.Gone"),
                       killed=("h1/arena",), exits=("h1/worker", "h1/edge"), test=request.node.nodeid)
    run = decoding(pool)
    t = inject.kill_service(pool, "h1/arena")
    try:
        check.outcome(run, t)
    finally:
        pool.stop_run(run.run_id, "fault suite: arena test cleanup")
    check.no_leases((0, 2))
    check.survivors_alive()
    check.exited(EXIT_ARENA_LOST)
    assert node_state(pool, INTERIOR) == mpb.NODE_STATE_FAULTED, "the node stayed Available without its arena"

    def restart() -> None:  # Restart= of each unit that ended: the arena first, then what Requires= it
        for name in ("h1/arena", "h1/edge", "h1/worker"):
            pool.restart(name)

    check.next_run(restart=restart)


def node_state(pool: FaultPool, host: int) -> int:
    """The host's own state in its membership service."""
    me = next(m for m in cready.members(pool.hosts[host].sock("membership")) if m.is_self)
    return me.metadata.state


def test_sigkill_membership(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "SIGKILL membership (interior)",
                       expect((pb.RUN_FAULT_MEMBERSHIP_LOST, C.COMPONENT_MEMBERSHIP)),
                       killed=("h1/membership",), test=request.node.nodeid)
    run = decoding(pool)
    check.outcome(run, inject.kill_service(pool, "h1/membership"))
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run(restart=check.restart_killed)


def test_sigkill_whole_host(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "SIGKILL whole host (interior)",
                       HOST_LOST, killed=tuple(f"h1/{k}" for k in HOST_SERVICES),
                       test=request.node.nodeid)
    run = decoding(pool)
    check.outcome(run, inject.kill_host(pool, INTERIOR))
    check.no_leases((0, 2))
    check.survivors_alive()
    # The pool serves on without the dead host: a 2-stage run on the survivors ...
    survivors = pool.run((0, 2), max_tokens=4)
    assert survivors.finished is not None and survivors.finished.outcome == opb.RUN_OUTCOME_COMPLETED, (
        f"a run on the surviving hosts did not complete: {survivors.describe()}")
    # ... and again with all three once the host is back.
    check.next_run(restart=lambda: pool.restart_host(INTERIOR))


def test_sigstop_compute_process(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "SIGSTOP compute process (interior)",
                       expect((pb.RUN_FAULT_STEP_TIMEOUT, C.COMPONENT_ORCHESTRATOR),
                              (pb.RUN_FAULT_WORKER_CRASHED, C.COMPONENT_WORKER_CTL)), test=request.node.nodeid)
    run = decoding(pool)
    pid = pool.compute_pid(INTERIOR)
    t = time.time()
    pool.sigstop(pid)
    check.outcome(run, t)
    # Still frozen: its ctl kills it when it does not quiesce the rings in time (worker stop_timeout_s).
    check.no_leases((0, 1, 2), timeout_s=20.0)
    check.survivors_alive()
    # The worker replaces the killed process (a new generation); the orchestrator must have seen the
    # node Available again after that (a pool event), not just still Available from before.
    check.next_run(restart=lambda: wait_until("node available again", lambda: available_since(pool, t), 90))


def available_since(pool: FaultPool, t: float) -> None:
    node = pool.node_id(INTERIOR)
    events = pool.get_events(POOL_EVENTS_RUN_ID)
    if not any(e.kind == pb.NODE_AVAILABLE and e.node_id == node and e.time_us / 1e6 > t for e in events):
        raise NotYet(f"no NODE_AVAILABLE of node {node} since the fault")


def test_sigkill_orchestrator_and_restart(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "SIGKILL orchestrator, restarted",
                       expect((pb.RUN_FAULT_ORCHESTRATOR_RESTARTED, C.COMPONENT_ORCHESTRATOR)),
                       killed=("h0/orchestrator",), test=request.node.nodeid)
    run = decoding(pool)
    t = inject.kill_service(pool, "h0/orchestrator")
    run.wait_end(10)
    assert run.error, f"WatchRun did not break with the orchestrator: {run.describe()}"
    pool.restart("h0/orchestrator")  # systemd's Restart=
    restarted = time.monotonic()
    check.outcome(run, t, events=pool.get_events(run.run_id), finished=pool.get_run(run.run_id))
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()
    serves_after = time.monotonic() - restarted
    check.row.next_run += f"; serving {serves_after:.1f} s after the restart"
    assert serves_after <= 15.0, f"the pool served again {serves_after:.1f} s after the orchestrator restart"

