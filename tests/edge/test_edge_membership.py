"""Peers from membership: each driver publishes its endpoint and certificate fingerprint through
the host's real membership service (SWIM gossip across two namespaces) and pins peers by what the
other host gossiped; an edge then carries bytes with no static peer file."""

from __future__ import annotations

import secrets
from pathlib import Path

import grpc
import pytest

from swactor.v1 import common_pb2, edge_pb2, membership_pb2, membership_pb2_grpc
from tests.edge.cluster import EdgeHost, EventTap, wait_until
from tests.harness import NetnsCluster, netns_unavailable_reason

pytestmark = [pytest.mark.netns]


def _gossiped_edge(h: EdgeHost, node_id: int) -> membership_pb2.NodeMetadata | None:
    with grpc.insecure_channel(f"unix:{h.root / 'membership.sock'}") as ch:
        members = membership_pb2_grpc.MembershipStub(ch).ListMembers(membership_pb2.ListMembersRequest(), timeout=5)
    for m in members.members:
        if m.metadata.node_id == node_id and m.metadata.edge_cert_fingerprint:
            return m.metadata
    return None


def test_edge_over_membership_gossiped_fingerprints(tmp_path: Path) -> None:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    secret = tmp_path / "cluster.secret"
    secret.write_text(secrets.token_hex(32))
    with NetnsCluster(2, prefix="edgm") as cluster:
        hosts = [EdgeHost(f"m{h.index}", tmp_path / f"m{h.index}", addr=h.addr, netns=h) for h in cluster.hosts]
        try:
            for i, h in enumerate(hosts):
                h.root.mkdir()
                h.init_identity()
                h.start_membership(secret, None if i == 0 else f"{hosts[0].addr}:7946")
                h.start_arena()
                h.start_edge(None)
            a, b = hosts
            wait_until(lambda: _gossiped_edge(a, b.node_id) and _gossiped_edge(b, a.node_id),
                       "both drivers' edge material gossiped to the other", timeout=30, interval=0.1)
            md_b = _gossiped_edge(a, b.node_id)
            assert md_b is not None
            assert md_b.edge_cert_fingerprint == b.fingerprint and md_b.edge_endpoint == b.endpoint
            tap = EventTap(b.stub)  # type: ignore[arg-type]
            lt = a.lease(1, 64 << 10, common_pb2.RING_DIRECTION_EGRESS)
            lr = b.lease(1, 64 << 10, common_pb2.RING_DIRECTION_INGRESS)
            b.stub.EstablishRecv(edge_pb2.EstablishRecvRequest(edge_id=1, ring_id=lr.ring_id, ring_layout=lr, tx_node_id=a.node_id))  # type: ignore[union-attr]
            a.stub.EstablishSend(  # type: ignore[union-attr]
                edge_pb2.EstablishSendRequest(edge_id=1, rx_node_id=b.node_id, ring_id=lt.ring_id, ring_layout=lt)
            )
            prod, cons = a.producer(lt), b.consumer(lr)
            prod.write(b"gossiped and pinned")
            prod.close()
            tap.wait("closed", 1, timeout=15)
            assert cons.read(100) == b"gossiped and pinned"
            tap.close()
        finally:
            for h in hosts:
                h.close()
