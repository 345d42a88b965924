"""A 3-host local pool at WAN conditions (issue 22 item 5): every packet between two hosts held 50 ms and 2 % of them
lost (linkshaping.py). A 3-stage run fetches its weights over those links, gives llama.cpp's greedy tokens and ends
once, completed, with no lease left; the members measure the round trip the links impose."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import pytest

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkshaping import unavailable
from swactor.localcluster.netns import Netns
from swactor.localcluster.ready import NotReady, wait_for
from swactor.localcluster.run import follow
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

from .conftest import assert_torn_down, needs_model
from .test_pipeline import arena_leases, fixture_case

WHY = Netns.available() or unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(420), needs_model,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
LINKS = LinkConditions(delay_ms=50, loss_pct=2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(ClusterSpec(hosts=3, netns=True, links=LINKS, readiness_timeout_s=300.0),
                     progress=lambda line: print(line, flush=True))
    with c:
        pids, root, netns = [s.pid for s in c.services], c.root, list(c.netns.created) if c.netns else []
        yield c
    assert_torn_down(c, pids, root, netns)


def test_three_stages_at_50ms_and_2pct_loss_give_the_exact_tokens_and_one_clean_outcome(cluster: LocalCluster) -> None:
    case, n = fixture_case("Write a Python function that reverses a string.", chat=True)
    with cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        res = follow(stub, opb.SubmitRunRequest(prompt=case["question"], stages=3, max_tokens=n), timeout_s=360)

        def measured() -> list[float]:
            rtts = [r.rtt_ms for r in stub.ListNodes(opb.ListNodesRequest(), timeout=5).rtts]
            if len(rtts) < 6:
                raise NotReady(f"{len(rtts)} of 6 pairs measured")
            return rtts

        rtts = wait_for("every pair's RTT", measured, 60)
    assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, res.summary()
    assert res.finished.reason == "max_tokens" and res.token_ids == case["greedy_tokens"][:n]
    assert [e.kind for e in res.events].count(pb.RUN_COMPLETED) == 1 and res.events[-1].kind == pb.RUN_TORN_DOWN
    fetched = [e for e in res.events if e.kind == pb.WEIGHTS_DOWNLOADED and e.counters["bytes_fetched"] > 0]
    assert set(cluster.node_ids[1:]) <= {e.node_id for e in fetched}  # over the links from host 0's model server
    assert not any(arena_leases(cluster).values())
    assert all(2 * LINKS.delay_ms <= r < 4 * LINKS.delay_ms for r in rtts), rtts
    gaps = sorted(b - a for a, b in itertools.pairwise(res.token_s))
    print(f"{n} tokens; TTFT {res.ttft_s:.2f} s; median gap between tokens {gaps[len(gaps) // 2] * 1000:.0f} ms "
          f"(3 host hops x 50 ms = 150 ms of it); weights fetched by {len(fetched)} hosts; RTTs {rtts}")


def test_every_host_starts_on_the_probe_timings_its_seeds_round_trip_calls_for(cluster: LocalCluster) -> None:
    """Across these links every host's membership measured its seeds before its engine started (host 0, which founds
    the pool, lists the other two) and started on 6.5 x that round trip, not on the pool's configured 0.25 s."""
    for h in cluster.hosts:
        whole = (h.log_dir / "membership.log").read_text().split("\n")[:-1]  # not a line still being written
        events = [json.loads(line) for line in whole if line.startswith("{")]
        applied = [e for e in events if e["event"] == "membership_probe_timing_applied"]
        assert [e["reason"] for e in applied] == ["seed_rtt"], (h.name, applied)
        assert 2 * LINKS.delay_ms <= applied[0]["seed_rtt_ms"] < 4 * LINKS.delay_ms, (h.name, applied)
        assert applied[0]["probe_timeout_s"] > applied[0]["configured_probe_timeout_s"]
