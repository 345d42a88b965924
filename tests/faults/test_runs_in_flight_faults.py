"""A stage host lost under four runs in flight (docs/runs-in-flight.md, "Faults"): the pool's orchestrator plans 4
run slots per stage, four 3-stage runs decode through h0 -> h1 -> h2 together, and every process of the interior host
is killed at once. A shared part is gone: each of the four runs ends once, faulted with the host's loss, no lease is
left on the survivors, and once the host is back four runs in flight complete again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swactor.v1 import orchestrator_pb2 as opb
from tests.faults import inject
from tests.faults.checks import HOST_LOST, HOST_SERVICES, FaultCheck
from tests.faults.pool import FaultPool, RunWatch
from tests.harness.run_spans import most_at_once, run_span

INTERIOR = 1
IN_FLIGHT = 4


@pytest.fixture(scope="module")
def four_slots(pool_holder: list[FaultPool]) -> Iterator[FaultPool]:
    """The orchestrator restarted planning IN_FLIGHT run slots per stage; the pool's own config again after.

    A stage holding 4 slots compiles a graph per batch width (1, 2, 4) at its load: cold, three compute processes
    on two cores take minutes, so readiness waits that long here and one run warms them before the test."""
    pool = pool_holder[0]
    four = pool.host_config(0, "four-slots", orchestrator={"max_slots_per_stage": IN_FLIGHT, "readiness_timeout_s": 600})
    pool.restart("h0/orchestrator", config=four)
    try:
        pool.wait_pool()
        warm = pool.run(max_tokens=2, timeout_s=600)
        assert warm.finished is not None and warm.finished.outcome == opb.RUN_OUTCOME_COMPLETED, warm.describe()
        yield pool
    finally:
        pool.restart("h0/orchestrator")
        pool.wait_pool()


def together(runs: list[RunWatch]) -> int:
    return most_at_once([run_span(r.events) for r in runs])


def test_sigkill_whole_host_under_four_runs_in_flight(four_slots: FaultPool, pool: FaultPool,
                                                      request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, f"SIGKILL whole host (interior), {IN_FLIGHT} runs in flight",
                       HOST_LOST, killed=tuple(f"h1/{k}" for k in HOST_SERVICES),
                       test=request.node.nodeid)
    runs = [pool.submit(max_tokens=2000) for _ in range(IN_FLIGHT)]
    for r in runs:
        r.wait_tokens(3)
    t = inject.kill_host(pool, INTERIOR)
    for r in runs:  # each run ends once, faulted by the host's loss
        check.outcome(r, t)
    assert together(runs) == IN_FLIGHT, [r.describe() for r in runs]
    check.no_leases((0, 2))
    check.survivors_alive()
    solo = check.next_run(restart=lambda: pool.restart_host(INTERIOR), pool_timeout_s=300)

    again = [pool.submit(max_tokens=6) for _ in range(IN_FLIGHT)]
    for r in again:
        assert r.wait_end(300), f"run {r.run_id} did not end: {r.describe()}"
        assert r.finished is not None and r.finished.outcome == opb.RUN_OUTCOME_COMPLETED, r.describe()
        assert len(r.tokens) == 6
    # one prompt, greedy: each run's tokens are the solo run's, batched or not
    assert all(r.tokens[:4] == solo.tokens for r in again), ([r.tokens for r in again], solo.tokens)
    assert all(r.tokens[:3] == solo.tokens[:3] for r in runs), ([r.tokens for r in runs], solo.tokens)
    assert together(again) >= 2, [r.describe() for r in again]
