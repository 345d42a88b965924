"""The system-level guarantee, checked after one injected fault (spec §36-40):

1. exactly one terminal outcome (one run_completed / run_faulted / run_stopped event), with an
   expected reason and detecting component, within OUTCOME_DEADLINE_S of the injection;
2. zero live leases (and no queued requests) in the arena of every surviving host after teardown;
3. no surviving service died (same pid, still running);
4. after what the fault killed is restarted (as systemd's Restart= would), the next run completes.

Every check fills one row of the fault table (`REPORT`, printed at the end of the session and
written to bench/out/faults.json), also when a check fails, so the table shows what happened.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from tests.faults.pool import OUTCOME_KINDS, SERVICE_ORDER, FaultPool, NotYet, RunWatch, wait_until

OUTCOME_DEADLINE_S = 10.0
RUN_END_TIMEOUT_S = 60.0  # outcome + teardown (teardown_timeout_s is 8 s in the fault pool)
REPORT_PATH = Path(__file__).resolve().parents[2] / "bench" / "out" / "faults.json"
C = pb.Component


@dataclass
class Row:
    """One line of the fault table."""

    fault: str
    detected_by: str = "-"
    reason: str = "-"
    seconds: float | None = None  # injection -> terminal outcome event
    leases_left: str = "-"
    next_run: str = "-"
    test: str = ""
    result: str = ""  # passed / failed / xfailed / xpassed (filled by conftest)

    def cells(self) -> list[str]:
        secs = "-" if self.seconds is None else f"{self.seconds:.2f}"
        return [self.fault, self.detected_by, self.reason, secs, self.leases_left, self.next_run, self.result]


REPORT: list[Row] = []
HEADER = ["fault", "detected by", "reason", "s to outcome", "leases left", "next run", "test"]


def table(rows: Iterable[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def write_report(rows: list[Row]) -> None:
    REPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
    REPORT_PATH.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


def kind_name(kind: int) -> str:
    return pb.LifecycleEventKind.Name(kind)  # type: ignore[arg-type]


@dataclass
class Expect:
    """What a fault must end in: the outcome, and the (reason, component) pairs that may detect it
    (several when physics allows more than one first detector, e.g. a partition)."""

    outcome: int = opb.RUN_OUTCOME_FAULTED
    detectors: tuple[tuple[str, int], ...] = ()
    detail_has: str = ""  # a fragment the outcome event's detail must name (e.g. a §37 cause)

    def describe(self) -> str:
        return " or ".join(f"{r} by {C.Name(c)}" for r, c in self.detectors) or opb.RunOutcome.Name(self.outcome)


@dataclass
class FaultCheck:
    """One fault's checks on one pool; use `row` to see what was measured so far."""

    pool: FaultPool
    fault: str
    expect: Expect
    killed: tuple[str, ...] = ()  # services the fault kills: "h1/worker"
    exits: tuple[str, ...] = ()  # services that must exit by design in reaction to it (see `exited`)
    test: str = ""
    row: Row = field(init=False)
    pids: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.row = Row(self.fault, test=self.test)
        REPORT.append(self.row)
        self.pids = self.pool.service_pids()  # before the injection

    # ---- 1: the outcome ----

    def outcome(self, run: RunWatch, injected_at: float, *, events: list[pb.LifecycleEvent] | None = None,
                finished: opb.Run | None = None) -> pb.LifecycleEvent:
        """Wait for the run's end; assert exactly one terminal outcome as expected, in time."""
        if events is None:
            first = run.wait_outcome(injected_at + OUTCOME_DEADLINE_S + 2 - time.time())
            assert first is not None or run.ended.is_set(), (
                f"{self.fault}: no terminal outcome within {OUTCOME_DEADLINE_S} s of the injection: {run.describe()}")
            ended = run.wait_end(RUN_END_TIMEOUT_S)
            assert ended, f"{self.fault}: run {run.run_id} did not end within {RUN_END_TIMEOUT_S} s: {run.describe()}"
            assert not run.error, f"{self.fault}: WatchRun broke: {run.error}"
            events, finished = run.events, run.finished
        outs = [e for e in events if e.kind in OUTCOME_KINDS]
        assert outs, f"{self.fault}: no terminal outcome event; run {finished}"
        ev = outs[0]
        self.row.detected_by = C.Name(ev.component).removeprefix("COMPONENT_") if ev.component else "-"
        self.row.reason = ev.reason or (ev.detail if ev.kind == pb.RUN_COMPLETED else kind_name(ev.kind))
        self.row.seconds = ev.time_us / 1e6 - injected_at
        assert len(outs) == 1, f"{self.fault}: {len(outs)} terminal outcomes: {[kind_name(e.kind) for e in outs]}"
        assert finished is not None and finished.outcome == self.expect.outcome, (
            f"{self.fault}: outcome {opb.RunOutcome.Name(finished.outcome) if finished else None} "
            f"{finished.reason if finished else ''} {finished.detail if finished else ''!r}, "
            f"expected {self.expect.describe()}")
        if self.expect.detectors:
            assert (ev.reason, ev.component) in self.expect.detectors, (
                f"{self.fault}: ended {ev.reason} by {C.Name(ev.component)} ({ev.detail!r}), "
                f"expected {self.expect.describe()}")
        assert self.expect.detail_has in ev.detail, f"{self.fault}: detail {ev.detail!r} lacks {self.expect.detail_has!r}"
        assert self.row.seconds <= OUTCOME_DEADLINE_S, (
            f"{self.fault}: outcome {self.row.seconds:.1f} s after the injection (> {OUTCOME_DEADLINE_S} s)")
        return ev

    # ---- 2: leases ----

    def no_leases(self, hosts: Iterable[int], timeout_s: float = 10.0) -> None:
        left = self.pool.leases_left(tuple(hosts), timeout_s)
        n = sum(len(v) for v in left.values())
        self.row.leases_left = str(n) if n == 0 else f"{n}: " + "; ".join(f"{h}: {v}" for h, v in left.items())
        assert not left, f"{self.fault}: arena leases still live after teardown: {left}"

    # ---- 3: survivors ----

    def survivors_alive(self) -> None:
        died = [n for n, pid in self.pids.items() if n not in self.killed and n not in self.exits
                and (self.pool.cluster.service(n).pid != pid or n in self.pool.dead_services())]
        assert not died, f"{self.fault}: surviving service(s) died or were restarted: {died}"

    def exited(self, status: int, timeout_s: float = 30.0) -> None:
        """Every service of `exits` ended by itself with `status` (its designed reaction, for the
        service manager's Restart= to start it again)."""
        def probe() -> None:
            running = [n for n in self.exits if self.pool.cluster.service(n).exited() is None]
            if running:
                raise NotYet(f"still running: {running}")

        wait_until(f"{self.fault}: {', '.join(self.exits)} exit", probe, timeout_s)
        wrong = [self.pool.cluster.service(n).describe_exit() for n in self.exits
                 if self.pool.cluster.service(n).exited() != status]
        assert not wrong, f"{self.fault}: expected exit status {status}: " + "\n".join(wrong)

    # ---- 4: the next run ----

    def next_run(self, hosts: tuple[int, ...] = (0, 1, 2), *, restart: Callable[[], None] = lambda: None,
                 pool_timeout_s: float = 60.0) -> RunWatch:
        """Restart what the fault killed (`restart`), wait for the pool, run again: it completes."""
        t0 = time.monotonic()
        self.row.next_run = "not ready"
        restart()
        self.pool.wait_pool(pool_timeout_s)

        def accepted() -> RunWatch:
            try:
                return self.pool.run(hosts, max_tokens=4)
            except grpc.RpcError as e:  # a node still coming back after the pool looked ready: refused by name
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
                    raise
                raise NotYet(str(e.details())) from None  # type: ignore[attr-defined]

        run = wait_until("the next run accepted", accepted, pool_timeout_s, poll_s=0.5)
        took = time.monotonic() - t0
        ok = run.finished is not None and run.finished.outcome == opb.RUN_OUTCOME_COMPLETED
        self.row.next_run = f"completed ({took:.1f} s)" if ok else f"{run.describe()}"[:120]
        assert ok, f"{self.fault}: the next run did not complete: {run.describe()}"
        return run

    def restart_killed(self) -> None:
        """Restart every killed service (a killed arena: its host, as its dependents need it)."""
        hosts = sorted({int(n.split("/")[0][1:]) for n in self.killed if n.endswith("/arena")})
        for h in hosts:
            self.pool.restart_host(h)
        for name in self.killed:
            if int(name.split("/")[0][1:]) not in hosts:
                self.pool.restart(name)


def expect(*detectors: tuple[int, int], outcome: int = opb.RUN_OUTCOME_FAULTED, detail_has: str = "") -> Expect:
    return Expect(outcome, tuple((pb.RunFaultReason.Name(r), c) for r, c in detectors), detail_has)  # type: ignore[arg-type]


# A whole stage host lost (every service of it killed): who notices first, and what is killed.
HOST_LOST = expect((pb.RUN_FAULT_NODE_UNAVAILABLE, C.COMPONENT_ORCHESTRATOR),
                   (pb.RUN_FAULT_MEMBERSHIP_LOST, C.COMPONENT_MEMBERSHIP),
                   (pb.RUN_FAULT_STREAM_FAULT, C.COMPONENT_EDGE_DRIVER))
HOST_SERVICES = tuple(s for s in SERVICE_ORDER if s != "orchestrator")


def refused_at_submit(check: FaultCheck, submit: Callable[[], object], injected_at: float, code: grpc.StatusCode,
                      detail_has: str) -> str:
    """A fault judged at SubmitRun, before any host is touched: the call fails with `code` and a detail naming
    `detail_has`, and no run is left active (the outcome is the refusal itself). Fills the row; returns the detail."""
    check.row.detected_by = "ORCHESTRATOR (SubmitRun)"
    try:
        submit()
    except grpc.RpcError as e:
        got, detail = e.code(), str(e.details())  # type: ignore[attr-defined]
    else:
        raise AssertionError(f"{check.fault}: SubmitRun was accepted, expected {code.name} naming {detail_has!r}")
    check.row.seconds = time.time() - injected_at
    check.row.reason = f"{got.name}: {re.sub(r'/[^ :]*/', '…/', detail)[:200]}"
    assert got == code and detail_has in detail, f"{check.fault}: {got.name} {detail!r}, expected {code.name} naming {detail_has!r}"
    assert not check.pool.active_runs(), f"{check.fault}: runs active after a refusal: {check.pool.active_runs()}"
    assert check.row.seconds <= OUTCOME_DEADLINE_S, f"{check.fault}: refused {check.row.seconds:.1f} s after the injection"
    return detail


def with_detail(check: FaultCheck, ev: pb.LifecycleEvent, chars: int = 150) -> None:
    """The row's reason with the start of the outcome's detail (its §37 cause; directories and hashes elided)."""
    detail = re.sub(r"([0-9a-f]{8})[0-9a-f]{56}", r"\1…", re.sub(r"/[^ :]*/", "…/", ev.detail))
    check.row.reason += f" ({detail[:chars]})"
