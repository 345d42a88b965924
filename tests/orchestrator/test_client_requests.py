"""Retrying SubmitRun is safe: a client request id names one run. The decision table and the claim shell
alone; the store's rows (written with the run's first record, kept over a reopen, deleted with the run);
and through the real gRPC API: a repeat, a different request refused by name, overlapping submits with one
id, a refused submit recording nothing, a queued run's current position, a restart, and retention."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.runs.client_requests import (
    Admit,
    Conflict,
    Repeat,
    RequestIds,
    RequestKey,
    Wait,
    decide,
    request_key,
)
from swactor.orchestrator.runs.manager import Limits
from swactor.orchestrator.runs.retention import RetentionPolicy
from swactor.orchestrator.runs.store import RunStore
from swactor.orchestrator.tokens import prompting
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import serving
from .helpers import pool
from .test_service import collect

pytestmark = pytest.mark.timeout(60)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def submit(request_id: str = "", prompt: str = "count to three", **kw) -> opb.SubmitRunRequest:
    return opb.SubmitRunRequest(prompt=prompt, raw=True, max_tokens=5, client_request_id=request_id, **kw)


async def refusal(call, req) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(req)
    return err.value.code(), err.value.details()


async def until(predicate) -> None:
    async with asyncio.timeout(10):
        while not await predicate():
            await asyncio.sleep(0.005)


# ---- the core ----


def test_decide_repeats_a_recorded_run_waits_for_one_in_progress_and_refuses_a_different_request() -> None:
    key = RequestKey("cli-1", b"A")
    assert decide(key, None, None) == Admit()
    assert decide(key, (7, b"A"), None) == Repeat(7)
    assert decide(key, None, b"A") == Wait()
    recorded = decide(key, (7, b"B"), None)
    assert isinstance(recorded, Conflict) and "client_request_id 'cli-1' was used for run 7" in recorded.message
    pending = decide(key, None, b"B")
    assert isinstance(pending, Conflict) and "still being admitted" in pending.message


def test_the_key_is_the_request_without_its_id_however_it_was_encoded() -> None:
    assert request_key(submit("")) is None
    a, b = request_key(submit("one")), request_key(submit("two"))
    assert a is not None and b is not None and a.digest == b.digest and a.request_id == "one"
    # The same values sent in another field order parse to the same request.
    head = opb.SubmitRunRequest(max_tokens=5, client_request_id="one").SerializeToString()
    tail = opb.SubmitRunRequest(prompt="count to three", raw=True).SerializeToString()
    reordered = request_key(opb.SubmitRunRequest.FromString(tail + head))
    assert reordered == a
    for changed in (submit("one", prompt="count to four"), submit("one", stages=2),
                    submit("one", sampling=opb.Sampling(seed=0))):  # an explicit seed 0 is not "no seed"
        other = request_key(changed)
        assert other is not None and other.digest != a.digest


def test_a_claim_waits_for_the_submit_in_progress_and_takes_over_when_it_was_refused() -> None:
    recorded: dict[str, tuple[int, bytes]] = {}
    ids = RequestIds(recorded.get)
    key = RequestKey("r", b"A")

    async def main():
        assert await ids.claim(key) is None  # the first goes on to create the run
        second = asyncio.create_task(ids.claim(key))
        third = asyncio.create_task(ids.claim(key))
        await asyncio.sleep(0)
        assert not second.done() and not third.done()
        with pytest.raises(RequestError) as conflict:
            await ids.claim(RequestKey("r", b"B"))
        ids.release(key)  # the first was refused: it recorded nothing
        await asyncio.sleep(0)
        # One of the waiters now creates the run in the first one's place; the other waits for it.
        assert [t.done() for t in (second, third)] == [True, False] and second.result() is None
        recorded["r"] = (9, b"A")
        ids.release(key)
        return conflict.value, await third

    conflict, third = run(main())
    assert conflict.code == grpc.StatusCode.ALREADY_EXISTS
    assert third == 9


# ---- the store ----


def test_an_id_is_written_with_its_runs_first_record_kept_over_a_reopen_and_deleted_with_the_run(tmp_path: Path) -> None:
    store = RunStore.in_state_dir(tmp_path)
    other = RunStore.in_state_dir(tmp_path)  # a second connection sees only what was written
    store.remember_request("a", 5, b"digest")
    store.append(5, [])
    store.flush()  # a flush before the run's first record leaves the id staged
    assert store.request_run("a") is None and other.request_run("a") is None
    store.put(opb.Run(run_id=5, state=opb.RUN_STATE_DONE, created_us=1, client_request_id="a"))
    assert other.request_run("a") == (5, b"digest")
    store.remember_request("b", 6, b"refused")
    store.discard(6)  # a refused submission leaves nothing behind
    store.put(opb.Run(run_id=6, state=opb.RUN_STATE_DONE, created_us=2))
    assert store.request_run("b") is None
    store.close()

    reopened = RunStore.in_state_dir(tmp_path)
    assert reopened.request_run("a") == (5, b"digest")
    reopened.delete_runs([5])
    assert reopened.request_run("a") is None and reopened.get(5) is None and reopened.get(6) is not None
    reopened.close()
    other.close()


# ---- through the API ----


def test_the_same_request_with_the_same_id_gives_the_same_run(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 2])

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            with capture_logs() as logs:
                first = await s.stub.SubmitRun(submit("cli-1"))
                again = await s.stub.SubmitRun(submit("cli-1"))
            await collect(s.stub, first.run_id)
            after = await s.stub.SubmitRun(submit("cli-1"))  # the run is done: still the same run
            other = await s.stub.SubmitRun(submit("cli-2"))  # another id is another run
            got = await s.stub.GetRun(opb.GetRunRequest(run_id=first.run_id))
            listed = await s.stub.ListRuns(opb.ListRunsRequest())
            return first, again, after, other, got, listed, logs

    first, again, after, other, got, listed, logs = run(main())
    assert again == first and after == first and first.prompt_tokens > 0
    assert other.run_id != first.run_id
    assert got.client_request_id == "cli-1"
    assert sorted(r.run_id for r in listed.runs) == sorted([first.run_id, other.run_id])
    [submitted] = [e for e in logs if e["event"] == "run_submitted"]
    assert submitted["client_request_id"] == "cli-1" and submitted["run_id"] == first.run_id
    [repeated] = [e for e in logs if e["event"] == "run_submit_repeated"]
    assert (repeated["run_id"], repeated["client_request_id"]) == (first.run_id, "cli-1")


def test_a_different_request_with_a_used_id_is_refused_naming_the_id(tmp_path: Path) -> None:
    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1)) as s:
            await asyncio.sleep(0.06)
            first = await s.stub.SubmitRun(submit("cli-1"))
            seen = [await refusal(s.stub.SubmitRun, req) for req in (
                submit("cli-1", prompt="something else"),
                submit("cli-1", sampling=opb.Sampling(temperature=0.5, seed=4)),
            )]
            listed = await s.stub.ListRuns(opb.ListRunsRequest())
            return first, seen, listed

    first, seen, listed = run(main())
    for code, details in seen:
        assert code == grpc.StatusCode.ALREADY_EXISTS, details
        assert f"client_request_id 'cli-1' was used for run {first.run_id} with a different request" in details
    assert [r.run_id for r in listed.runs] == [first.run_id]


def test_malformed_ids_are_refused_by_name_by_submit_and_plan(tmp_path: Path) -> None:
    cases = [("x" * 129, "client_request_id is 129 characters; at most 128"),
             ("two words", "client_request_id[3] is ' '"),
             ("tab\t", "client_request_id[3] is '\\t'"),
             ("caf\u00e9", "client_request_id[3] is 'é'")]

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1)) as s:
            await asyncio.sleep(0.06)
            seen = [await refusal(call, submit(rid)) for call in (s.stub.SubmitRun, s.stub.Plan) for rid, _ in cases]
            longest = await s.stub.SubmitRun(submit("~" * 128))
            return seen, longest

    seen, longest = run(main())
    for (_, needle), (code, details) in zip(cases * 2, seen, strict=True):
        assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in details, details
    assert longest.run_id


def test_overlapping_submits_with_one_id_create_one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first submit is held in the tokenizer; those with its id wait for it, one with another request
    is refused at once, and all that wait get its run."""
    entered, release = threading.Event(), threading.Event()
    calls = []
    real = prompting.prompt_ids

    def held_prompt_ids(req, model, context):
        calls.append(req.client_request_id)
        entered.set()
        assert release.wait(20)
        return real(req, model, context)

    monkeypatch.setattr(prompting, "prompt_ids", held_prompt_ids)

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1)) as s:
            await asyncio.sleep(0.06)
            first = asyncio.create_task(s.orch.submit(submit("dup")))
            assert await asyncio.to_thread(entered.wait, 10)
            waiting = [asyncio.create_task(s.orch.submit(submit("dup"))) for _ in range(3)]
            for _ in range(3):
                await asyncio.sleep(0)
            assert not any(t.done() for t in waiting)
            with pytest.raises(RequestError) as conflict:
                await s.orch.submit(submit("dup", prompt="another"))
            release.set()
            answers = await asyncio.gather(first, *waiting)
            # Over gRPC too: submits sent together with one id.
            together = await asyncio.gather(*(s.stub.SubmitRun(submit("grpc-dup")) for _ in range(4)))
            listed = await s.stub.ListRuns(opb.ListRunsRequest())
            return conflict.value, answers, together, listed

    conflict, answers, together, listed = run(main())
    assert conflict.code == grpc.StatusCode.ALREADY_EXISTS and "still being admitted" in conflict.message
    assert len({a.run_id for a in answers}) == 1 and len({a.run_id for a in together}) == 1
    assert calls == ["dup", "grpc-dup"]  # each id's prompt was tokenized once
    assert sorted(r.run_id for r in listed.runs) == sorted([answers[0].run_id, together[0].run_id])


def test_a_refused_submit_records_nothing_so_a_corrected_retry_with_its_id_runs(tmp_path: Path) -> None:
    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1, 2)) as s:
            await asyncio.sleep(0.06)
            invalid = await refusal(s.stub.SubmitRun, opb.SubmitRunRequest(prompt="hi", max_tokens=0,
                                                                           client_request_id="fix-me"))
            too_big = await refusal(s.stub.SubmitRun, submit("fix-me", stages=3))  # the pool has 2 nodes
            corrected = await s.stub.SubmitRun(submit("fix-me", stages=2))
            again = await s.stub.SubmitRun(submit("fix-me", stages=2))
            return invalid, too_big, corrected, again

    invalid, too_big, corrected, again = run(main())
    assert invalid[0] == grpc.StatusCode.INVALID_ARGUMENT and too_big[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert corrected.run_id and again == corrected


def test_a_retry_of_a_queued_run_gets_its_current_position_even_when_the_queue_is_full(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 101, 2], hold_after=1)  # the first run holds at sequence 1 until released

    async def main():
        async with serving(tmp_path, fleet, pool(1), limits=Limits(queue_depth=2), max_slots_per_stage=1) as s:
            await asyncio.sleep(0.06)
            active = await s.stub.SubmitRun(submit("a"))
            b = await s.stub.SubmitRun(submit("b"))
            c = await s.stub.SubmitRun(submit("c"))
            full = await refusal(s.stub.SubmitRun, submit("d"))
            c_again = await s.stub.SubmitRun(submit("c"))
            await s.stub.StopRun(opb.StopRunRequest(run_id=b.run_id))
            c_moved = await s.stub.SubmitRun(submit("c"))
            active_again = await s.stub.SubmitRun(submit("a"))
            fleet.release.set()
            return b, c, full, c_again, c_moved, active, active_again

    b, c, full, c_again, c_moved, active, active_again = run(main())
    assert (b.queue_position, c.queue_position) == (1, 2)
    assert full[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert c_again == c  # not refused by the full queue
    assert (c_moved.run_id, c_moved.queue_position) == (c.run_id, 1)
    assert active_again == active and active.queue_position == 0


def test_an_id_still_names_its_run_after_an_orchestrator_restart(tmp_path: Path) -> None:
    async def first():
        async with serving(tmp_path, FakeFleet([100, 2]), pool(1)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(submit("before-restart"))
            await collect(s.stub, resp.run_id)
            s.store.close()
            return resp

    fleet = FakeFleet([2])

    async def second():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            again = await s.stub.SubmitRun(submit("before-restart"))
            different = await refusal(s.stub.SubmitRun, submit("before-restart", prompt="new"))
            listed = await s.stub.ListRuns(opb.ListRunsRequest())
            return again, different, listed

    resp = run(first())
    again, different, listed = run(second())
    assert again == resp
    assert different[0] == grpc.StatusCode.ALREADY_EXISTS and str(resp.run_id) in different[1]
    assert [r.run_id for r in listed.runs] == [resp.run_id] and fleet.plans == []


def test_retention_deleting_a_run_frees_its_id(tmp_path: Path) -> None:
    keep_one = Limits(retention=RetentionPolicy(max_runs=1))

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1), limits=keep_one) as s:
            await asyncio.sleep(0.06)
            old = await s.stub.SubmitRun(submit("old"))
            await collect(s.stub, old.run_id)
            new = await s.stub.SubmitRun(submit("new"))
            await collect(s.stub, new.run_id)

            async def old_deleted() -> bool:
                return not any(r.run_id == old.run_id for r in (await s.stub.ListRuns(opb.ListRunsRequest())).runs)

            await until(old_deleted)
            reused = await s.stub.SubmitRun(submit("old"))
            return old, reused, s.store.request_run("old")

    old, reused, recorded = run(main())
    assert reused.run_id != old.run_id  # a new run: the id's old run is gone
    assert recorded is not None and recorded[0] == reused.run_id
