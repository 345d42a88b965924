"""Fixtures for the edge tests: a two-host netns cluster, each host with an arena and a driver."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.edge.cluster import EdgeHost, write_peers  # noqa: E402
from tests.harness import NetnsCluster, netns_unavailable_reason  # noqa: E402

# Jumbo frames on the test bridge: the driver sizes datagrams from the route MTU (docs/edge.md).
TEST_MTU = 16384


@pytest.fixture(scope="module")
def netns_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetnsCluster, list[EdgeHost], Path]]:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("edge")
    with NetnsCluster(2, prefix="edge") as cluster:
        for h in cluster.hosts:
            h.run(["ip", "link", "set", "eth0", "mtu", str(TEST_MTU)])
            subprocess.run(
                ["ip", "-n", cluster.bridge_ns, "link", "set", f"v{h.index}", "mtu", str(TEST_MTU)], check=True
            )
        hosts = [EdgeHost(f"h{h.index}", root / f"h{h.index}", addr=h.addr, netns=h) for h in cluster.hosts]
        peers = root / "peers.toml"
        try:
            for h in hosts:
                h.root.mkdir()
                h.init_identity()
            write_peers(peers, hosts)
            for h in hosts:
                h.start_arena()
                h.start_edge(peers)
            yield cluster, hosts, peers
        finally:
            for h in hosts:
                h.close()
