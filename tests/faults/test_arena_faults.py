"""Arena faults on the interior stage's host, each checked end to end (tests/faults/checks.py):
lease pressure (the arena's free space held by another holder, so the stage's ring leases stay
queued past the worker's arena_pressure_timeout_s) and a ring larger than the arena's ceiling."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator

import pytest

from swactor.arena.client import Leased, connect_holder
from swactor.v1 import common_pb2 as pb
from tests.arena.sync_client import ArenaClient
from tests.faults.checks import HOST_SERVICES, C, FaultCheck, expect
from tests.faults.pool import FaultPool

INTERIOR = 1
PAGE = 4096


@contextlib.contextmanager
def arena_held(pool: FaultPool, host: int) -> Iterator[float]:
    """Lease (nearly) all of the host's free arena from this process, so the next ring waits."""
    h = pool.hosts[host]
    with connect_holder(h.sock("arena-fd")) as hold, ArenaClient(hold, h.sock("arena")) as client:
        free = client.stats().largest_free_range
        ring = None
        for k in itertools.count(1):  # the ring's header pages come out of the range too
            cap = (free - k * PAGE) // PAGE * PAGE
            assert cap > 0, f"h{host}: no lease fits its largest free range {free}"
            out = client.lease(request_id=k, requester="fault-suite", edge_id=1, direction=pb.RING_DIRECTION_INGRESS,
                               ring_spec=pb.RingSpec(data_capacity=cap, alignment=64,
                                                     direction=pb.RING_DIRECTION_INGRESS),
                               queue_timeout_s=1.0)
            if isinstance(out, Leased):
                ring = out.layout.ring_id
                break
        left = client.stats().largest_free_range
        assert left < 64 << 10, f"h{host}: {left} bytes still free after holding the arena"
        try:
            yield time.time()
        finally:
            client.release(ring)


def test_lease_pressure_timeout(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "arena lease pressure (interior host full)",
                       expect((pb.RUN_FAULT_ARENA_PRESSURE_TIMEOUT, C.COMPONENT_ARENA)), test=request.node.nodeid)
    with arena_held(pool, INTERIOR) as t:
        run = pool.submit(max_tokens=4)
        check.outcome(run, t)
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


def test_ring_over_the_arena_ceiling(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """The interior host rebooted with an arena ceiling under the smallest ring (64 KiB)."""
    check = FaultCheck(pool, "oversized ring (interior arena ceiling 32 KiB)",
                       expect((pb.RUN_FAULT_RING_REQUEST_OVERSIZED, C.COMPONENT_ARENA)),
                       killed=tuple(f"h{INTERIOR}/{k}" for k in HOST_SERVICES),
                       test=request.node.nodeid)
    small = pool.host_config(INTERIOR, "small-arena", arena={"ceiling_bytes": 32 << 10})
    pool.restart_host(INTERIOR, configs={"arena": small})
    pool.wait_pool()
    t = time.time()
    try:
        run = pool.submit(max_tokens=4)
        check.outcome(run, t)
        check.no_leases((0, 1, 2))
        check.survivors_alive()
    except BaseException:
        # back to its normal arena, so a failure here does not leave every later test a 32 KiB ceiling
        pool.restart_host(INTERIOR)
        raise
    check.next_run(restart=lambda: pool.restart_host(INTERIOR))
