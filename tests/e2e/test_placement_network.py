"""Placement that knows the network (issue 22 item 4) on a real 4-host local cluster whose host 3 is far: every
packet arriving at it is held FAR_RTT_MS (linkshaping.py, NFQUEUE), so it is that far from each other host, which stay
near each other. The members measure it (membership/rtt.py), `swactor nodes` shows the matrix, and the planner leaves
the far host out of a 3-stage run, puts stage 0 on the orchestrator's own host and says what the hops cost."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkshaping import unavailable
from swactor.localcluster.netns import Netns
from swactor.localcluster.ready import NotReady, wait_for
from swactor.localcluster.run import follow
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

from .conftest import assert_torn_down, needs_model
from .test_pipeline import fixture_case

WHY = Netns.available() or unavailable()
# serial: it compares measured RTTs, which a busy neighbour would move
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.serial, pytest.mark.timeout(300), needs_model,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
FAR_RTT_MS = 60


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    spec = ClusterSpec(hosts=4, netns=True, host_links={3: LinkConditions(delay_ms=FAR_RTT_MS)})
    c = LocalCluster(spec, progress=lambda line: print(line, flush=True))
    with c:
        pids, root, netns = [s.pid for s in c.services], c.root, list(c.netns.created) if c.netns else []
        yield c
    assert_torn_down(c, pids, root, netns)


def cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swactor.cli.main", "--address", c.orchestrator_address, *args],
                          capture_output=True, text=True, timeout=60)


def rtt_matrix(c: LocalCluster) -> dict[tuple[int, int], float]:
    """Every ordered pair, once the orchestrator holds them all (each node measures its peers every 2 s and
    broadcasts its row)."""
    def full() -> dict[tuple[int, int], float]:
        with c.channel() as ch:
            resp = orchestrator_pb2_grpc.OrchestratorStub(ch).ListNodes(opb.ListNodesRequest(), timeout=5)
        got = {(r.from_node_id, r.to_node_id): r.rtt_ms for r in resp.rtts}
        if len(got) < 12:
            raise NotReady(f"{len(got)} of 12 pairs measured")
        return got

    return wait_for("every pair's RTT at the orchestrator", full, 60)


def test_the_far_host_is_measured_and_left_out_and_stage_0_is_the_orchestrators_host(cluster: LocalCluster) -> None:
    h0, h1, h2, far = cluster.node_ids
    rtt = rtt_matrix(cluster)
    for (a, b), ms in rtt.items():
        if far in (a, b):
            assert FAR_RTT_MS <= ms < 4 * FAR_RTT_MS, ((a, b), ms)
        else:
            assert ms < FAR_RTT_MS / 3, ((a, b), ms)  # near hosts: the machine's own speed, not the far link
    nodes = cli(cluster, "nodes")
    assert nodes.returncode == 0, nodes.stderr
    assert f"RTT ms (row pinged column; * the orchestrator's node {h0}):" in nodes.stdout
    assert any(line.split()[0] == f"*{h0}" for line in nodes.stdout.splitlines() if line.strip())

    dry = cli(cluster, "submit", "--prompt", "Hello", "--stages", "3", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[1].startswith(f"  stage 0: node {h0} ") and str(far) not in "\n".join(lines[1:4]), dry.stdout
    ring = lines[4]
    assert ring.startswith(f"  ring (RTT): orchestrator (node {h0}) -[same host]-> stage 0 -[")
    assert ring.endswith(" ms to each token (one way each)"), ring

    with cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        plan = stub.Plan(opb.SubmitRunRequest(prompt="Hello", stages=3, max_tokens=8), timeout=30)
        assert plan.network_ms_per_token < FAR_RTT_MS / 4, plan
        far_plan = stub.Plan(opb.SubmitRunRequest(prompt="Hello", node_ids=[h0, far, h1], max_tokens=8), timeout=30)
        assert far_plan.network_ms_per_token >= FAR_RTT_MS  # in and out of the far host: its round trip, one way
        case, n = fixture_case("Write a Python function that reverses a string.", chat=True)
        res = follow(stub, opb.SubmitRunRequest(prompt=case["question"], stages=3, max_tokens=n), timeout_s=240)
    assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, res.finished
    assert [p.node_id for p in res.finished.placement] == [s.node_id for s in plan.placement]
    assert res.finished.placement[0].node_id == h0 and far not in {p.node_id for p in res.finished.placement}
    assert {p.node_id for p in res.finished.placement} == {h0, h1, h2}
    assert res.token_ids == case["greedy_tokens"][:n]  # llama.cpp's, up to its first top-2 gap under 0.1
