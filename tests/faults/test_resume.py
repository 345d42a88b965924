"""A request that outlives a lost host (issue 24, docs/orchestrator.md "Resumed requests"): submitted with
`resume`, a 2-stage run on h1 -> h2 loses h2 mid-decode (every process killed). The run itself ends once,
faulted by the loss; its request goes on as a new run placed on the healthy hosts, prefilled with the prompt
and the tokens already delivered. The client's one WatchRun stream carries every token once, and the greedy
tokens are those of the same run uninterrupted."""

from __future__ import annotations

import time

import pytest

from swactor.orchestrator.runs.manager import RESUMABLE
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from tests.faults import inject
from tests.faults.pool import FaultPool

TOKENS = 24
BEFORE_LOSS = 6


def test_a_resumed_request_outlives_its_lost_stage_host(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    solo = pool.run(hosts=(1, 2), max_tokens=TOKENS, timeout_s=300)
    assert solo.finished is not None and solo.finished.outcome == opb.RUN_OUTCOME_COMPLETED, solo.describe()

    watch = pool.submit(hosts=(1, 2), max_tokens=TOKENS, resume=True)
    watch.wait_tokens(BEFORE_LOSS)
    lost_at = inject.kill_host(pool, 2)
    assert watch.wait_end(240), f"the request did not end: {watch.describe()}"
    assert not watch.error, watch.error

    first = pool.get_run(watch.run_id)
    last = watch.finished
    assert last is not None and last.outcome == opb.RUN_OUTCOME_COMPLETED, watch.describe()
    # The run itself: one outcome, the host's loss; its record names the run that continued the request.
    assert first.outcome == opb.RUN_OUTCOME_FAULTED and first.reason in RESUMABLE, first
    assert first.resumed_by and first.resume
    chain = [first]
    while chain[-1].resumed_by:
        chain.append(pool.get_run(chain[-1].resumed_by))
    assert chain[-1].run_id == last.run_id and last.resumed_from == chain[-2].run_id
    delivered_before = sum(len(r.token_ids) for r in chain[:-1])
    assert last.resumed_tokens == delivered_before and len(last.token_ids) == TOKENS - delivered_before
    # Placed anew, without the lost host.
    assert pool.node_id(2) not in {s.node_id for s in last.placement}, last.placement
    resumed = [e for e in watch.events if e.kind == pb.RUN_RESUMED]
    assert resumed and resumed[0].run_id == first.run_id and resumed[0].counters["resumed_by"] == first.resumed_by

    # The client's one stream: every token once, and the uninterrupted run's greedy tokens.
    assert watch.tokens == solo.tokens, (watch.tokens, solo.tokens)
    assert pool.leases_left((0, 1), timeout_s=10) == {}

    next_tokens = [e.time_us for e in watch.events if e.kind == pb.TOKEN_RECEIVED and e.run_id == last.run_id]
    print(f"\nresume: host lost after {len(first.token_ids)} tokens; {len(chain) - 1} resume(s); next token "
          f"{next_tokens[0] / 1e6 - lost_at:.2f} s after the loss; run {first.run_id} {first.reason} -> "
          f"run {last.run_id} on {[s.node_id for s in last.placement]} (at {time.strftime('%H:%M:%S')})")
