"""Resumed requests (SubmitRunRequest.resume) on the Orchestrator with a fake fleet (no sockets): a run faulted
by a shared part goes on as a new run placed without the lost node, its watchers follow it with the token
sequence continuing, StopRun of the first run stops the one it goes on as, and what is not resumed (a fault of
its own, a request without resume, no placement that fits) ends with the run's own outcome. The end-to-end
check with a real host lost is tests/faults/test_resume.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from swactor.cli.render import run_detail
from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.runs.manager import Orchestrator
from swactor.orchestrator.runs.runner import RunUpdates
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.worker.compute.sampling import Sampler

from .helpers import pool
from .test_admission import EOS, InFlightFleet, orchestrator, submit, until

pytestmark = pytest.mark.timeout(60)


def run(coro):
    return asyncio.run(coro)


async def collect(orch: Orchestrator, run_id: int, into: list[opb.RunUpdate]) -> None:
    async for u in orch.watch(run_id):
        into.append(u)


def tokens(updates: list[opb.RunUpdate]) -> list[tuple[int, int]]:
    return [(u.token.sequence, u.token.token_id) for u in updates if u.HasField("token")]


def placed_on(fleet: InFlightFleet, run_id: int) -> list[int]:
    return [s.node_id for s in fleet.plans[run_id].stages]


def test_a_run_faulted_by_its_lost_node_goes_on_as_a_new_run_its_watcher_follows(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2))
        first = await orch.submit(submit(0, resume=True))
        seen: list[opb.RunUpdate] = []
        watcher = asyncio.create_task(collect(orch, first.run_id, seen))
        await until(lambda: first.run_id in fleet.decoding, "the first run decoding")
        lost = placed_on(fleet, first.run_id)[0]
        orch.set_members(pool(*({1, 2} - {lost})))  # its node is gone
        await until(lambda: orch.get(first.run_id).resumed_by in fleet.decoding, "the resumed run decoding")
        second = orch.get(first.run_id).resumed_by
        fleet.finish(second)
        await asyncio.wait_for(watcher, 10)
        await orch.shutdown()
        return orch.get(first.run_id), orch.get(second), seen

    first, second, seen = run(main())
    assert first.outcome == opb.RUN_OUTCOME_FAULTED and first.reason == "RUN_FAULT_MEMBERSHIP_LOST"
    assert first.resume and first.resumed_by == second.run_id and list(first.token_ids) == [100]
    assert second.outcome == opb.RUN_OUTCOME_COMPLETED and second.resumed_from == first.run_id
    assert (second.resumed_tokens, second.prompt_tokens, second.max_tokens) == (1, first.prompt_tokens + 1, 9)
    # One stream: the first run's token, then the second's, numbered on; its `finished` is the last run's.
    assert tokens(seen) == [(0, 100), (1, 100), (2, EOS)]
    assert [u.finished.run_id for u in seen if u.HasField("finished")] == [second.run_id]
    resumed = [u.event for u in seen if u.HasField("event") and u.event.kind == pb.RUN_RESUMED]
    assert len(resumed) == 1 and resumed[0].counters["resumed_by"] == second.run_id
    # `swactor show` of either run names the other
    assert f"resumed as run {second.run_id}" in run_detail(first)
    assert f"resumes run {first.run_id}: its request's 1 token(s)" in run_detail(second)


def test_the_resumed_run_avoids_the_lost_node_and_stop_of_the_first_stops_it(tmp_path: Path) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2))
        first = await orch.submit(submit(0, resume=True))
        await until(lambda: first.run_id in fleet.decoding, "the first run decoding")
        lost = placed_on(fleet, first.run_id)[0]
        orch.set_members(pool(*({1, 2} - {lost})))
        await until(lambda: orch.get(first.run_id).resumed_by in fleet.decoding, "the resumed run decoding")
        second = orch.get(first.run_id).resumed_by
        stopped = await orch.stop(first.run_id, "client stop")  # the request's first run id
        replayed = [u async for u in orch.watch(first.run_id)]  # both finished: from the store, chained
        await orch.shutdown()
        return lost, placed_on(fleet, second), stopped, replayed, second

    lost, where, stopped, replayed, second = run(main())
    assert where and lost not in where
    assert stopped.run_id == second and stopped.outcome == opb.RUN_OUTCOME_STOPPED
    assert [u.finished.run_id for u in replayed if u.HasField("finished")] == [second]
    assert tokens(replayed)[0] == (0, 100) and tokens(replayed)[1][0] == 1


@pytest.mark.parametrize("case", ["no resume asked", "nowhere to go", "stopped, not faulted"])
def test_what_is_not_resumed_ends_with_its_own_outcome(tmp_path: Path, case: str) -> None:
    fleet = InFlightFleet()

    async def main():
        orch = orchestrator(tmp_path, fleet, pool(1, 2) if case != "nowhere to go" else pool(1))
        first = await orch.submit(submit(0, resume=case != "no resume asked"))
        seen: list[opb.RunUpdate] = []
        watcher = asyncio.create_task(collect(orch, first.run_id, seen))
        await until(lambda: first.run_id in fleet.decoding, "the run decoding")
        if case == "stopped, not faulted":
            await orch.stop(first.run_id, "operator")
        else:
            lost = placed_on(fleet, first.run_id)[0]
            orch.set_members(pool(*({1, 2} - {lost})) if case != "nowhere to go" else ())
        await asyncio.wait_for(watcher, 10)
        await orch.shutdown()
        return orch.get(first.run_id), seen

    first, seen = run(main())
    assert first.resumed_by == 0
    assert [u.finished.run_id for u in seen if u.HasField("finished")] == [first.run_id]
    want = opb.RUN_OUTCOME_STOPPED if case == "stopped, not faulted" else opb.RUN_OUTCOME_FAULTED
    assert first.outcome == want


def test_chained_updates_number_tokens_on_through_every_run() -> None:
    async def main():
        a, b, c = RunUpdates(), RunUpdates(), RunUpdates()
        for updates, n in ((a, 2), (b, 3), (c, 1)):
            for i in range(n):
                updates.append(opb.RunUpdate(token=opb.TokenDelta(sequence=i, token_id=10 * n + i)))
        a.continue_with(b, 2)
        a.append(opb.RunUpdate(finished=opb.Run(run_id=1)))
        b.continue_with(c, 3)
        b.append(opb.RunUpdate(finished=opb.Run(run_id=2)))
        c.append(opb.RunUpdate(finished=opb.Run(run_id=3)))
        return [u async for u in a.watch()], [u async for u in b.watch()]

    from_a, from_b = run(main())
    assert tokens(from_a) == [(0, 20), (1, 21), (2, 30), (3, 31), (4, 32), (5, 10)]
    assert tokens(from_b) == [(0, 30), (1, 31), (2, 32), (3, 10)]  # b's own watchers: unshifted
    assert [u.finished.run_id for u in from_a if u.HasField("finished")] == [3]


def test_a_sampler_that_skips_the_draws_made_goes_on_with_the_same_tokens() -> None:
    rng = np.random.default_rng(7)
    logits = [rng.normal(size=50) for _ in range(12)]
    policy = SamplingPolicy(temperature=0.9, top_k=20, seed=1234)
    one = Sampler(policy)
    whole = [one(x) for x in logits]
    resumed = Sampler(SamplingPolicy(temperature=0.9, top_k=20, seed=1234, skip_draws=5))
    assert [resumed(x) for x in logits[5:]] == whole[5:]
