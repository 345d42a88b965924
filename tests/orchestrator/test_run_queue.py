"""The run queue and the bounded orchestrator through the real gRPC API (fake fleet): QUEUED runs with
positions streamed as events, FIFO starts, a full queue refused, a queued run stopped, queued runs after
a restart, finished runs dropped from memory and read from the store, GetEvents pages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from swactor.orchestrator.runs.manager import Limits
from swactor.orchestrator.runs.store import ORCHESTRATOR_RESTARTED, RunStore
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import serving
from .helpers import pool
from .test_service import collect, events_of

pytestmark = pytest.mark.timeout(60)
# The tests of the queue serve with max_slots_per_stage=1: the pool then holds one run at a time and the others
# queue (with a free slot, a run joins the runs in flight instead: test_admission.py).


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def submit(n: int = 0) -> opb.SubmitRunRequest:
    return opb.SubmitRunRequest(prompt=f"run {n}", raw=True, max_tokens=10)


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.005)


def queue_events(updates) -> list[tuple[str, int]]:
    return [(pb.LifecycleEventKind.Name(u.event.kind), u.event.counters.get("position", 0)) for u in updates
            if u.HasField("event") and u.event.kind in (pb.RUN_QUEUED, pb.RUN_QUEUE_MOVED, pb.RUN_DEQUEUED)]


def test_runs_wait_in_order_with_positions_and_start_one_after_another(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 101, 2], hold_after=1)  # the first run holds at sequence 1 until released

    async def main():
        async with serving(tmp_path, fleet, pool(1), limits=Limits(queue_depth=2), max_slots_per_stage=1) as s:
            await asyncio.sleep(0.06)
            a = await s.stub.SubmitRun(submit(0))
            await until(lambda: len(fleet.injected) >= 2, "run a decoding")
            b = await s.stub.SubmitRun(submit(1))
            c = await s.stub.SubmitRun(submit(2))
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await s.stub.SubmitRun(submit(3))
            watch_c = asyncio.create_task(collect(s.stub, c.run_id))
            listed = (await s.stub.ListRuns(opb.ListRunsRequest())).runs
            got_c = await s.stub.GetRun(opb.GetRunRequest(run_id=c.run_id))
            live = s.orch.live_run_ids()
            fleet.release.set()
            updates_c = await watch_c
            await until(lambda: not s.orch.live_run_ids(), "every run finished")
            replayed_a = await collect(s.stub, a.run_id)
            finals = [await s.stub.GetRun(opb.GetRunRequest(run_id=r.run_id)) for r in (a, b, c)]
            return (a, b, c), full.value, listed, got_c, live, updates_c, replayed_a, finals

    (a, b, c), full, listed, got_c, live, updates_c, replayed_a, finals = run(main())
    assert (a.queue_position, b.queue_position, c.queue_position) == (0, 1, 2)
    assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the run queue is full (2 of 2 runs waiting; [orchestrator].queue_depth)" in full.details()
    by_id = {r.run_id: r for r in listed}
    assert [(by_id[r.run_id].state, by_id[r.run_id].queue_position) for r in (b, c)] == [
        (opb.RUN_STATE_QUEUED, 1), (opb.RUN_STATE_QUEUED, 2)]
    assert by_id[a.run_id].state == opb.RUN_STATE_RUNNING and len(listed) == 3  # the refused run was never stored
    assert got_c.state == opb.RUN_STATE_QUEUED and got_c.queue_position == 2
    assert live == [a.run_id, b.run_id, c.run_id]
    assert [p.run_id for p in fleet.plans] == [a.run_id, b.run_id, c.run_id]  # first in, first out
    assert queue_events(updates_c) == [("RUN_QUEUED", 2), ("RUN_QUEUE_MOVED", 1), ("RUN_DEQUEUED", 0)]
    kinds = events_of(updates_c)
    assert kinds.index("RUN_DEQUEUED") + 1 == kinds.index("POOL_READY") and kinds[-1] == "RUN_TORN_DOWN"
    assert updates_c[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED
    assert [(f.state, f.outcome, f.queue_position) for f in finals] == [
        (opb.RUN_STATE_DONE, opb.RUN_OUTCOME_COMPLETED, 0)] * 3
    # a finished run is no longer held in memory: its WatchRun replays from the store, tokens included
    assert [u.token.token_id for u in replayed_a if u.HasField("token")] == [100, 101, 2]
    assert replayed_a[-1].finished == finals[0] and list(finals[0].token_ids) == [100, 101, 2]


def test_stopping_a_queued_run_removes_it_and_moves_the_others_up(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 2], hold_after=1)

    async def main():
        async with serving(tmp_path, fleet, pool(1), max_slots_per_stage=1) as s:
            await asyncio.sleep(0.06)
            a = await s.stub.SubmitRun(submit(0))
            await until(lambda: len(fleet.injected) >= 2, "run a decoding")
            b = await s.stub.SubmitRun(submit(1))
            c = await s.stub.SubmitRun(submit(2))
            watch_b = asyncio.create_task(collect(s.stub, b.run_id))
            watch_c = asyncio.create_task(collect(s.stub, c.run_id))
            await asyncio.sleep(0)
            stopped = (await s.stub.StopRun(opb.StopRunRequest(run_id=b.run_id, detail="not needed"))).run
            again = (await s.stub.StopRun(opb.StopRunRequest(run_id=b.run_id))).run
            updates_b = await watch_b
            c_moved = await s.stub.GetRun(opb.GetRunRequest(run_id=c.run_id))
            fleet.release.set()
            updates_c = await watch_c
            events_b = await s.stub.GetEvents(opb.GetEventsRequest(run_id=b.run_id))
            return a, b, c, stopped, again, updates_b, c_moved, updates_c, events_b

    a, b, c, stopped, again, updates_b, c_moved, updates_c, events_b = run(main())
    assert (stopped.state, stopped.outcome, stopped.reason, stopped.detail) == (
        opb.RUN_STATE_DONE, opb.RUN_OUTCOME_STOPPED, "operator_stop", "not needed")
    assert stopped.run_id == b.run_id and again == stopped  # a finished run is unchanged
    assert queue_events(updates_b) == [("RUN_QUEUED", 1)]
    assert events_of(updates_b)[-1] == "RUN_STOPPED" and updates_b[-1].finished == stopped
    assert c_moved.queue_position == 1 and c_moved.queue_wait == "a free run slot (1 of 1 in use)"
    assert stopped.queue_wait == "" and updates_c[-1].finished.queue_wait == ""
    assert queue_events(updates_c) == [("RUN_QUEUED", 2), ("RUN_QUEUE_MOVED", 1), ("RUN_DEQUEUED", 0)]
    # b, the head, said what it waited for; c says it once it is the head
    assert [(e.kind, e.detail) for e in events_b.events] == [
        (pb.RUN_QUEUED, ""), (pb.RUN_QUEUE_WAITING, "a free run slot (1 of 1 in use)"), (pb.RUN_STOPPED, "not needed (while queued)")]
    assert [u.event.detail for u in updates_c if u.HasField("event") and u.event.kind == pb.RUN_QUEUE_WAITING] == [
        "a free run slot (1 of 1 in use)"]
    assert updates_c[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED
    assert [p.run_id for p in fleet.plans] == [a.run_id, c.run_id]  # the stopped run never started


def test_queued_runs_are_faulted_orchestrator_restarted_by_the_next_start(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 2], hold_after=1)

    async def first():
        async with serving(tmp_path, fleet, pool(1), max_slots_per_stage=1) as s:
            await asyncio.sleep(0.06)
            a = await s.stub.SubmitRun(submit(0))
            await until(lambda: len(fleet.injected) >= 2, "run a decoding")
            b = await s.stub.SubmitRun(submit(1))
        s.store.close()  # shutdown stopped the active run; the queued one stays queued in the store
        return a.run_id, b.run_id

    a, b = run(first())
    store = RunStore.in_state_dir(tmp_path / "state")
    recovered = store.recover(now_us=123)
    assert [r.run_id for r in recovered] == [b]
    got = store.get(b)
    assert (got.state, got.outcome, got.reason, got.queue_position) == (
        opb.RUN_STATE_DONE, opb.RUN_OUTCOME_FAULTED, ORCHESTRATOR_RESTARTED, 0)
    assert "orchestrator restarted while the run was queued (position 1); it never started" in got.detail
    assert [e.kind for e in store.events(b)] == [pb.RUN_QUEUED, pb.RUN_QUEUE_WAITING, pb.RUN_FAULTED]
    assert store.get(a).outcome == opb.RUN_OUTCOME_STOPPED
    assert [p.run_id for p in fleet.plans] == [a]


def test_get_events_pages_and_refuses_a_bad_token(tmp_path: Path) -> None:
    fleet = FakeFleet([100 + k for k in range(40)] + [2])

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            a = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=100))
            updates = await collect(s.stub, a.run_id)
            pages, token = [], None
            while token != "":
                page = await s.stub.GetEvents(opb.GetEventsRequest(run_id=a.run_id, page_size=7,
                                                                   page_token=token or ""))
                pages.append(list(page.events))
                token = page.next_page_token
            tokens = await s.stub.GetEvents(opb.GetEventsRequest(run_id=a.run_id, kind=pb.TOKEN_RECEIVED,
                                                                 page_size=30))
            whole = await s.stub.GetEvents(opb.GetEventsRequest(run_id=a.run_id))
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await s.stub.GetEvents(opb.GetEventsRequest(run_id=a.run_id, page_token="next please"))
            return updates, pages, tokens, whole, bad.value

    updates, pages, tokens, whole, bad = run(main())
    streamed = [u.event for u in updates if u.HasField("event")]
    assert [e for p in pages for e in p] == streamed == list(whole.events) and whole.next_page_token == ""
    assert all(len(p) == 7 for p in pages[:-1]) and 0 < len(pages[-1]) <= 7
    assert len(tokens.events) == 30 and tokens.next_page_token
    assert all(e.kind == pb.TOKEN_RECEIVED for e in tokens.events)
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token 'next please'" in bad.details()
