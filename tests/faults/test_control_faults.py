"""Faults of the control plane, each checked end to end (tests/faults/checks.py): a stage host
whose worker service never answers StopRun, and the orchestrator's run store on a full disk."""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from tests.faults.checks import RUN_END_TIMEOUT_S, C, FaultCheck, expect
from tests.faults.pool import FaultPool, RunWatch

INTERIOR = 1


def decoding(pool: FaultPool) -> RunWatch:
    run = pool.submit(max_tokens=2000)
    run.wait_tokens(3)
    return run


def test_stage_never_answers_stoprun(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """The interior worker service frozen (SIGSTOP), then the run stopped: the orchestrator ends the
    run at once and does not wait on the frozen stage beyond its teardown timeout; the stage, thawed,
    finds its control stream gone and gives the run up itself (its lease), releasing its rings."""
    check = FaultCheck(pool, "stage never answers StopRun (worker frozen)",
                       expect(outcome=opb.RUN_OUTCOME_STOPPED), test=request.node.nodeid)
    run = decoding(pool)
    worker = pool.cluster.service(f"h{INTERIOR}/worker").pid
    t = time.time()
    pool.sigstop(worker)
    pool.stop_run(run.run_id, "fault suite: stop with a frozen stage")
    ev = check.outcome(run, t)
    assert ev.component == C.COMPONENT_ORCHESTRATOR, ev
    torn = run.wait_event(pb.RUN_TORN_DOWN, RUN_END_TIMEOUT_S)
    # Either the teardown timed out naming the frozen stage, or the control stream's keepalive had
    # already declared its node lost (a lost node is not waited for): both leave nothing waiting.
    check.row.reason += f"; torn down: {torn.reason or 'clean'} {torn.detail[:60]}".rstrip()
    pool.sigcont(worker)
    check.no_leases((0, 1, 2), timeout_s=20.0)
    check.survivors_alive()
    check.next_run()


@contextlib.contextmanager
def disk_filled(directory: Path) -> Iterator[float]:
    """Fill the file system of `directory` (a small tmpfs) to the last byte; removed on exit."""
    path = directory / "fault-suite-fill"
    chunk = b"\0" * (1 << 20)
    t = time.time()
    try:
        with path.open("wb", buffering=0) as f:
            try:
                while True:
                    f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 512)
        yield t
    finally:
        path.unlink(missing_ok=True)


def test_run_store_disk_full(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "run store's disk full (orchestrator)",
                       expect((pb.RUN_FAULT_STORE_WRITE_FAILED, C.COMPONENT_ORCHESTRATOR)), test=request.node.nodeid)
    run = decoding(pool)
    state_dir = Path(str(pool.cluster.spec.orchestrator["state_dir"]))
    with disk_filled(state_dir) as t:
        check.outcome(run, t)
        check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()
