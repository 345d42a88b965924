"""Every host behind NAT (issue 22 item 1; localcluster/nat.py): each service binds its usual port and advertises
another, and another host reaches it only through that mapping. The pool forms, every node gossips the advertised
endpoints, a bound port is not reachable from another host, and a 3-stage run (weights fetched from host 0's model
server, QUIC edges between the hosts) gives llama.cpp's greedy tokens. SWACTOR_LOCALCLUSTER_NAT=1 runs every other
pool test of the suite in this mode too."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.layout import CONTROL_PORT, EDGE_PORT, MEMBERSHIP_PORT, MODEL_PORT
from swactor.localcluster.nat import PUBLIC_OFFSET
from swactor.localcluster.netns import Netns
from swactor.localcluster.run import follow
from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import membership_pb2_grpc, orchestrator_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb

from .conftest import assert_torn_down, needs_model
from .test_pipeline import fixture_case

WHY = Netns.available()
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(300), needs_model,
              pytest.mark.skipif(WHY is not None, reason=str(WHY))]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(ClusterSpec(hosts=3, netns=True, nat=True), progress=lambda line: print(line, flush=True))
    with c:
        pids, root, netns = [s.pid for s in c.services], c.root, list(c.netns.created) if c.netns else []
        yield c
    assert_torn_down(c, pids, root, netns)


def tcp_reaches(c: LocalCluster, from_host: int, addr: str, port: int) -> bool:
    """Whether a TCP connection from inside host `from_host` to addr:port is accepted within 2 s."""
    code = (f"import socket, sys\ntry:\n    socket.create_connection(({addr!r}, {port}), timeout=2).close()\n"
            f"except OSError:\n    sys.exit(1)")
    assert c.netns is not None
    return subprocess.run([*c.netns.exec_prefix(from_host), sys.executable, "-c", code], timeout=20).returncode == 0


def test_a_pool_behind_nat_gossips_its_public_ports_and_serves_a_run_through_them(cluster: LocalCluster) -> None:
    assert cluster.nat
    h0 = cluster.hosts[0].addr
    with cluster.channel() as ch:
        nodes = orchestrator_pb2_grpc.OrchestratorStub(ch).ListNodes(opb.ListNodesRequest(), timeout=5).nodes
    assert {n.edge_endpoint.rsplit(":", 1)[1] for n in nodes} == {str(EDGE_PORT + PUBLIC_OFFSET)}
    assert {n.control_endpoint.rsplit(":", 1)[1] for n in nodes} == {str(CONTROL_PORT + PUBLIC_OFFSET)}
    with grpc.insecure_channel(f"unix:{cluster.hosts[1].sock('membership')}") as mch:
        members = membership_pb2_grpc.MembershipStub(mch).ListMembers(mpb.ListMembersRequest(), timeout=5).members
    assert {m.gossip_address.rsplit(":", 1)[1] for m in members} == {str(MEMBERSHIP_PORT + PUBLIC_OFFSET)}
    # from host 1: host 0's control and model server only through the mapping, never on their bound ports
    for port in (CONTROL_PORT, MODEL_PORT):
        assert tcp_reaches(cluster, 1, h0, port + PUBLIC_OFFSET), port
        assert not tcp_reaches(cluster, 1, h0, port), f"bound port {port} reachable from another host"

    case, n = fixture_case("Write a Python function that reverses a string.", chat=True)
    with cluster.channel() as ch:
        res = follow(orchestrator_pb2_grpc.OrchestratorStub(ch),
                     opb.SubmitRunRequest(prompt=case["question"], stages=3, max_tokens=n), timeout_s=240)
    assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, res.summary()
    assert {p.node_id for p in res.finished.placement} == set(cluster.node_ids)
    assert res.token_ids == case["greedy_tokens"][:n]
