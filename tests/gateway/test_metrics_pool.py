"""The pool gauges from a real orchestrator (its gRPC servicer over a Unix socket, a scripted fake fleet) read by the
gateway's own PoolClient: a run decoding and one queued behind it show as running and queued, a finished run as
retained, and the run slots its node holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swactor.gateway.metrics import pool_families, read_pool
from swactor.gateway.pool_client import PoolClient
from swactor.orchestrator.runs.manager import Limits
from swactor.v1 import orchestrator_pb2 as opb
from tests.orchestrator.fakes import FakeFleet
from tests.orchestrator.harness import serving
from tests.orchestrator.helpers import pool

pytestmark = pytest.mark.timeout(60)


def gauges(view) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in pool_families(view) for s in f.samples}


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.005)


def test_running_queued_and_retained_runs_as_the_orchestrator_reports_them(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 101, 2], hold_after=1)  # the first run holds at sequence 1 until released

    async def main():
        # one run slot per stage: the second run waits in the queue for the first
        async with serving(tmp_path, fleet, pool(1), limits=Limits(queue_depth=2), max_slots_per_stage=1) as s:
            await asyncio.sleep(0.06)  # the PoolReady window
            submit = opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=10)
            a = await s.stub.SubmitRun(submit)
            await until(lambda: len(fleet.injected) >= 2, "run a decoding")
            await s.stub.SubmitRun(submit)
            async with PoolClient(s.socket, pool_ttl_s=0) as client:
                during = gauges(await read_pool(client))
                fleet.release.set()
                await until(lambda: not s.orch.live_run_ids(), "every run finished")
                after = gauges(await read_pool(client))
            return a, during, after

    a, during, after = asyncio.run(asyncio.wait_for(main(), 30))
    assert a.queue_position == 0
    assert during[("swactor_pool_up", ())] == 1
    assert during[("swactor_pool_runs", (("state", "running"),))] == 1
    assert during[("swactor_pool_runs", (("state", "queued"),))] == 1
    assert during[("swactor_pool_node_run_slots", (("hostname", "h1"), ("node_id", "1")))] == 1
    assert during[("swactor_pool_node_run_slots_in_use", (("hostname", "h1"), ("node_id", "1")))] == 1
    assert during[("swactor_pool_members", (("readiness", "available"),))] == 1
    assert not [k for k in during if k[0] == "swactor_pool_retained_runs"]  # nothing finished yet
    assert after[("swactor_pool_runs", (("state", "running"),))] == 0
    assert after[("swactor_pool_runs", (("state", "queued"),))] == 0
    assert after[("swactor_pool_retained_runs", (("outcome", "completed"), ("reason", "eos")))] == 2
    assert after[("swactor_pool_models", (("state", "judged"),))] == 1  # no distributor here: never "ready"
