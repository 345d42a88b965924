"""A broken port map is named, not a timeout inside a run (fleet/reach.py): a 2-host pool behind NAT
(localcluster/nat.py) whose host 1 loses the mapping of its advertised edge port. The orchestrator's probe from
host 0 names that endpoint unreachable in ListNodes and `swactor nodes`, a 2-stage run is refused with that
reason, a 1-stage run is placed on host 0 only, and once the mapping is back host 1 is provisionable again."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.layout import EDGE_PORT
from swactor.localcluster.nat import PUBLIC_OFFSET, TABLE
from swactor.localcluster.netns import Netns
from swactor.localcluster.ready import NotReady, wait_for
from swactor.localcluster.run import follow
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

from .conftest import assert_torn_down, needs_model

WHY = Netns.available()
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(300), needs_model,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]
EDGE_PUBLIC = EDGE_PORT + PUBLIC_OFFSET


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # probed again every second, reachable or not, so the test need not restart a host to be noticed
    spec = ClusterSpec(hosts=2, netns=True, nat=True, orchestrator={"reach_recheck_s": 1.0, "reach_retry_s": 1.0})
    c = LocalCluster(spec, progress=lambda line: print(line, flush=True))
    with c:
        pids, root, netns = [s.pid for s in c.services], c.root, list(c.netns.created) if c.netns else []
        yield c
    assert_torn_down(c, pids, root, netns)


def nft(c: LocalCluster, host: int, *args: str) -> str:
    assert c.netns is not None
    return subprocess.run([*c.netns.exec_prefix(host), "nft", *args], capture_output=True, text=True, check=True,
                          timeout=10).stdout


def nodes(c: LocalCluster) -> dict[int, opb.Node]:
    with c.channel() as ch:
        return {n.node_id: n for n in orchestrator_pb2_grpc.OrchestratorStub(ch).ListNodes(opb.ListNodesRequest(),
                                                                                            timeout=5).nodes}


def until_node(c: LocalCluster, node_id: int, what: str, holds) -> opb.Node:  # type: ignore[no-untyped-def]
    def probe() -> opb.Node:
        n = nodes(c).get(node_id)
        if n is None or not holds(n):
            raise NotReady(f"node {node_id}: {n.reason if n else 'not listed'}")
        return n

    return wait_for(what, probe, 60.0, check=c.check_alive)


def test_an_unmapped_edge_port_is_named_and_the_run_avoids_that_host(cluster: LocalCluster) -> None:
    h0, h1 = cluster.node_ids
    until_node(cluster, h1, "host 1 provisionable", lambda n: n.provisionable)
    # the NAT box of host 1 forgets its edge mapping: datagrams to the advertised port reach nothing
    chain = nft(cluster, 1, "-a", "list", "chain", "ip", TABLE, "prerouting")
    handle = re.search(rf"udp dport {EDGE_PUBLIC} dnat to :{EDGE_PORT} # handle (\d+)", chain)
    assert handle is not None, chain
    nft(cluster, 1, "delete", "rule", "ip", TABLE, "prerouting", "handle", handle.group(1))

    edge = f"{cluster.hosts[1].addr}:{EDGE_PUBLIC}"
    n = until_node(cluster, h1, "host 1's edge named unreachable", lambda n: not n.provisionable)
    assert n.reason.startswith(f"edge endpoint {edge} (UDP, QUIC) "), n.reason
    assert "check the port map (--advertise-port edge=...)" in n.reason and "control endpoint" not in n.reason
    assert nodes(cluster)[h0].provisionable
    event = [line for line in cluster.service("h0/orchestrator").log.read_text().splitlines()
             if '"node_endpoint_unreachable"' in line]
    assert event and f'"node_id": {h1}' in event[0] and '"reason": "EDGE_PORT_CLOSED"' in event[0], event
    shown = subprocess.run([sys.executable, "-m", "swactor.cli.main", "--address", cluster.orchestrator_address,
                            "nodes"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and f"edge endpoint {edge} (UDP, QUIC)" in shown.stdout, shown.stdout + shown.stderr

    with cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        with pytest.raises(grpc.RpcError) as refused:
            stub.SubmitRun(opb.SubmitRunRequest(prompt="Hello", stages=2, max_tokens=2), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"node {h1} is unreachable: edge endpoint {edge}" in (refused.value.details() or "")
        res = follow(stub, opb.SubmitRunRequest(prompt="Hello", stages=1, max_tokens=4), timeout_s=240)
    assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, res.summary()
    assert [p.node_id for p in res.finished.placement] == [h0]

    # the mapping is back: host 1 answers the next probe and may hold stages again
    nft(cluster, 1, "add", "rule", "ip", TABLE, "prerouting", "iifname", "eth0", "udp", "dport", str(EDGE_PUBLIC),
        "dnat", "to", f":{EDGE_PORT}")
    n = until_node(cluster, h1, "host 1 provisionable again", lambda n: n.provisionable)
    assert not n.reason
