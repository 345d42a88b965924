"""The interior stage's host cut off (nft inside its network namespace) or its link slowed (NFQUEUE)
mid-decode, each checked end to end (tests/faults/checks.py)."""

from __future__ import annotations

import pytest

from swactor.localcluster.layout import EDGE_PORT
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from tests.faults import inject
from tests.faults.checks import C, FaultCheck, expect
from tests.faults.pool import FaultPool, RunWatch

INTERIOR = 1
# Whoever notices a cut-off stage host first: the orchestrator's control stream (HTTP/2 keepalive),
# membership (the host is suspected), an edge driver (its QUIC connection idles out), the step timer.
CUT_OFF = expect((pb.RUN_FAULT_NODE_UNAVAILABLE, C.COMPONENT_ORCHESTRATOR),
                 (pb.RUN_FAULT_MEMBERSHIP_LOST, C.COMPONENT_MEMBERSHIP),
                 (pb.RUN_FAULT_STREAM_FAULT, C.COMPONENT_EDGE_DRIVER),
                 (pb.RUN_FAULT_STEP_TIMEOUT, C.COMPONENT_ORCHESTRATOR))


def decoding(pool: FaultPool) -> RunWatch:
    run = pool.submit(max_tokens=2000)
    run.wait_tokens(3)
    return run


@pytest.mark.parametrize("direction", ["in", "both"], ids=["one_way", "two_way"])
def test_partition_stage_host(pool: FaultPool, request: pytest.FixtureRequest, direction: str) -> None:
    check = FaultCheck(pool, f"{'one' if direction == 'in' else 'two'}-way partition (interior host)", CUT_OFF,
                       test=request.node.nodeid)
    run = decoding(pool)
    with inject.partition(pool, INTERIOR, direction) as t:
        check.outcome(run, t)
        # The cut-off stage cannot hear StopRun: it must give the run up itself once its control
        # stream is gone for its lease window (worker/stage_lease.py) and release its rings.
        check.no_leases((0, 1, 2), timeout_s=20.0)
    check.survivors_alive()
    check.next_run()


def test_delayed_link(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """200 ms on every packet the interior host's edge driver sends: slower, not a fault."""
    check = FaultCheck(pool, "200 ms delayed link (interior host)", expect(outcome=opb.RUN_OUTCOME_COMPLETED),
                       test=request.node.nodeid)
    with inject.delayed_link(pool, INTERIOR, 200, sport=EDGE_PORT) as t:
        run = pool.submit(max_tokens=6)
        check.outcome(run, t)
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()
