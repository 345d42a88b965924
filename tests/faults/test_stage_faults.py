"""Faults of a stage node's own making on the interior host (h1), each checked end to end
(tests/faults/checks.py): a worker that refuses the orchestrator's ProvisionStage, an arena that
cannot boot, a device memory limit the stage's weights do not fit, and a step that fails. Each
restarts h1's services with another config (or the step hook's environment) and puts them back."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.worker.process.testhooks import FAIL_STEP_ENV
from tests.faults.checks import C, FaultCheck, expect, refused_at_submit, with_detail
from tests.faults.pool import SERVICE_ORDER, FaultPool, NotYet, wait_until

INTERIOR = 1
FAILING_STEP = 3  # the stage's third step of the run: after the prompt and the first decode step


def worker_restarted(pool: FaultPool, name: str, **worker: object) -> float:
    """h1's worker restarted with [worker] keys replaced; the time it serves again (its node Available)."""
    pool.restart(f"h{INTERIOR}/worker", config=pool.host_config(INTERIOR, name, worker=worker))
    pool.wait_pool()
    return time.time()


@contextlib.contextmanager
def worker_put_back(pool: FaultPool) -> Iterator[None]:
    """h1's worker back on its own config and environment when the test fails, so later tests do not run
    against this one's fault."""
    try:
        yield
    except BaseException:
        pool.restart(f"h{INTERIOR}/worker")
        raise


def test_provisioning_rejected(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """h1's worker trusts another orchestrator only ([worker].orchestrator_node_id): it refuses
    ProvisionStage from this one by name."""
    check = FaultCheck(pool, "provisioning rejected (interior worker trusts another orchestrator)",
                       expect((pb.RUN_FAULT_PROVISIONING_REJECTED, C.COMPONENT_ORCHESTRATOR),
                              detail_has="is not the authorised orchestrator"),
                       killed=(f"h{INTERIOR}/worker",), test=request.node.nodeid)
    other = pool.node_id(0) ^ 0x5A5A  # no node of this pool
    with worker_put_back(pool):
        t = worker_restarted(pool, "other-orchestrator", orchestrator_node_id=other)
        with_detail(check, check.outcome(pool.submit(max_tokens=4), t))
        check.no_leases((0, 1, 2))
        check.survivors_alive()
    check.next_run(restart=lambda: pool.restart(f"h{INTERIOR}/worker"))


def test_device_out_of_memory(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """h1's compute process may allocate 1 MiB of device memory ([worker].device_memory_limit_bytes, the
    knob of a GPU shared with other tenants) while its node still advertises its usual share: the
    stage's weights do not fit, the load's device allocation fails as a full device's does."""
    check = FaultCheck(pool, "device out of memory at load (interior device limit 1 MiB)",
                       expect((pb.RUN_FAULT_DEVICE_OUT_OF_MEMORY, C.COMPONENT_WORKER),
                              detail_has="ROLE_FAILURE_DEVICE_OUT_OF_MEMORY"),
                       killed=(f"h{INTERIOR}/worker",), test=request.node.nodeid)
    with worker_put_back(pool):
        t = worker_restarted(pool, "device-1mib", device_memory_limit_bytes=1 << 20)
        ev = check.outcome(pool.submit(max_tokens=4), t)
        assert "device memory limit" in ev.detail, ev.detail  # the operator is told which limit it was
        with_detail(check, ev)
        check.no_leases((0, 1, 2))
        check.survivors_alive()
    check.next_run(restart=lambda: pool.restart(f"h{INTERIOR}/worker"))


def test_step_failure(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """h1's compute process started with the test-only step hook (worker/process/testhooks.py): its
    third step of the run raises, as failing role code would, after tokens have flowed."""
    check = FaultCheck(pool, f"step failure (interior step {FAILING_STEP} raises)",
                       expect((pb.RUN_FAULT_STEP_FAILED, C.COMPONENT_WORKER),
                              detail_has=f"{FAIL_STEP_ENV}: step {FAILING_STEP} fails"),
                       killed=(f"h{INTERIOR}/worker",), test=request.node.nodeid)
    with worker_put_back(pool):
        pool.restart(f"h{INTERIOR}/worker", env={FAIL_STEP_ENV: str(FAILING_STEP)})
        pool.wait_pool()
        t = time.time()
        run = pool.submit(max_tokens=8)
        with_detail(check, check.outcome(run, t))
        assert run.tokens, f"the run faulted before any token: {run.describe()}"
        check.no_leases((0, 1, 2))
        check.survivors_alive()
    check.next_run(restart=lambda: pool.restart(f"h{INTERIOR}/worker"))


# ---- arena boot failure ----


def log_events(path: Path, name: str) -> Iterator[dict[str, object]]:
    """The structured events called `name` in a service's log (JSON lines; other lines skipped)."""
    for line in path.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") == name:
            yield ev


def arena_exited(pool: FaultPool, host: int) -> int:
    rc = pool.cluster.service(f"h{host}/arena").exited()
    if rc is None:
        raise NotYet(f"h{host}/arena still runs")
    return rc


def test_arena_boot_failure(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """h1 rebooted with an arena it cannot map (a 4 EiB ceiling: beyond the address space). As under
    systemd (Requires=swactor-arena.service), its edge driver and worker do not start; membership does.
    The node never becomes Available: a run pinned to it is refused at submission naming it, a run on
    the healthy hosts completes."""
    check = FaultCheck(pool, "arena boot failure (interior host, arena cannot map its ceiling)",
                       expect(), killed=tuple(f"h{INTERIOR}/{k}" for k in SERVICE_ORDER if k != "orchestrator"),
                       test=request.node.nodeid)
    unbootable = pool.host_config(INTERIOR, "arena-unmappable", arena={"ceiling_bytes": 1 << 62})
    try:
        for k in ("worker", "edge", "membership", "arena"):
            pool.cluster.service(f"h{INTERIOR}/{k}").kill_group()
        log = pool.cluster.service(f"h{INTERIOR}/arena").log
        before = len(list(log_events(log, "arena_boot_failed")))
        t = time.time()
        pool.cluster.restart(f"h{INTERIOR}/arena", config=unbootable)
        rc = wait_until("h1/arena exits", lambda: arena_exited(pool, INTERIOR), 30)
        failed = list(log_events(log, "arena_boot_failed"))[before:]
        assert rc != 0 and [e.get("reason") for e in failed] == ["RUN_FAULT_ARENA_BOOT_FAILED"], (rc, failed)
        pool.restart(f"h{INTERIOR}/membership")
        node = pool.node_id(INTERIOR)
        refused_at_submit(check, lambda: pool.submit(max_tokens=4), t, grpc.StatusCode.FAILED_PRECONDITION,
                          f"pinned node(s) not Available: {node} (")
        check.row.reason = f"arena exit {rc} (RUN_FAULT_ARENA_BOOT_FAILED); " + check.row.reason
        healthy = pool.run((0, 2), max_tokens=4)
        assert healthy.finished is not None and healthy.finished.outcome == opb.RUN_OUTCOME_COMPLETED, healthy.describe()
        check.no_leases((0, 2))
        check.survivors_alive()
    except BaseException:
        pool.restart_host(INTERIOR)
        raise
    check.next_run(restart=lambda: pool.restart_host(INTERIOR))
