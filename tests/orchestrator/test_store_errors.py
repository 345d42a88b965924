"""A run store that cannot be written (its file system full: a small tmpfs, root only) faults the run
with RUN_FAULT_STORE_WRITE_FAILED and tears it down; the queue goes on, and what was held is written
once there is room again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from swactor.orchestrator.runs.store import RunStore
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import serving
from .helpers import fill, pool, small_tmpfs
from .test_run_queue import until
from .test_service import collect

pytestmark = pytest.mark.timeout(60)
STORE_WRITE_FAILED = pb.RunFaultReason.Name(pb.RUN_FAULT_STORE_WRITE_FAILED)


def test_a_full_disk_faults_the_run_by_reason_and_never_blocks_the_queue(tmp_path: Path) -> None:
    # Decoding lasts (2 ms a token) past the store's 100 ms write batching, so the run writes while it is full.
    fleet = FakeFleet([100 + k % 50 for k in range(400)] + [2], hold_after=1, delay_s=0.002)

    async def main(fs: Path):
        store = RunStore.in_state_dir(fs)
        async with serving(tmp_path, fleet, pool(1), store=store) as s:
            await asyncio.sleep(0.06)
            a = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=1000))
            await until(lambda: len(fleet.injected) >= 2, "run a decoding")
            b = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="y", raw=True, max_tokens=1000))
            watch_a = asyncio.create_task(collect(s.stub, a.run_id))
            watch_b = asyncio.create_task(collect(s.stub, b.run_id))
            filler = fill(fs)
            with pytest.raises(grpc.aio.AioRpcError) as refused:  # a new run's record cannot be stored
                await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="z", raw=True, max_tokens=5))
            fleet.release.set()
            updates_a, updates_b = await watch_a, await watch_b
            filler.unlink()
            c = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="z", raw=True, max_tokens=5))
            updates_c = await collect(s.stub, c.run_id)
            got_a = await s.stub.GetRun(opb.GetRunRequest(run_id=a.run_id))
            live = s.orch.live_run_ids()
        store.close()
        reopened = RunStore.in_state_dir(fs)
        on_disk = reopened.get(a.run_id), reopened.get(b.run_id)
        reopened.close()
        return refused.value, updates_a, updates_b, updates_c, got_a, live, on_disk

    with small_tmpfs(tmp_path / "state", "2m") as fs:
        refused, updates_a, updates_b, updates_c, got_a, live, (disk_a, disk_b) = asyncio.run(
            asyncio.wait_for(main(fs), 40))

    assert refused.code() == grpc.StatusCode.UNAVAILABLE and "the run store cannot be written" in refused.details()
    final_a, final_b = updates_a[-1].finished, updates_b[-1].finished
    assert (final_a.outcome, final_a.reason) == (opb.RUN_OUTCOME_FAULTED, STORE_WRITE_FAILED)
    assert "the run store cannot be written" in final_a.detail and final_a.state == opb.RUN_STATE_DONE
    faulted = [u.event for u in updates_a if u.HasField("event") and u.event.kind == pb.RUN_FAULTED]
    assert [(e.reason, e.component) for e in faulted] == [(STORE_WRITE_FAILED, pb.COMPONENT_ORCHESTRATOR)]
    assert [u.event.kind for u in updates_a if u.HasField("event")][-1] == pb.RUN_TORN_DOWN  # stages stopped
    # the queued run was not left waiting: it started and, the store still full, faulted the same way
    assert (final_b.outcome, final_b.reason) == (opb.RUN_OUTCOME_FAULTED, STORE_WRITE_FAILED)
    assert updates_c[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED  # room again: runs go on
    assert got_a == final_a and live == []
    assert disk_a == final_a and disk_b == final_b  # held while the disk was full, written after
