"""The netns harness itself: reachability, one-way blocks, partitions, heal, guaranteed cleanup."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from . import NetnsCluster, cleanup_stale, netns_unavailable_reason
from .netns import NETNS_DIR

pytestmark = pytest.mark.netns

_ECHO = (
    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', 9000))\n"
    "while True:\n    d, a = s.recvfrom(64)\n    s.sendto(d, a)\n"
)
_PROBE = (
    "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.settimeout(0.3)\n"
    "try:\n    s.sendto(b'x', (sys.argv[1], 9000)); s.recvfrom(64); print('ok')\n"
    "except (TimeoutError, PermissionError):\n    print('lost')\n"
)


@pytest.fixture(autouse=True)
def _need_netns() -> None:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)


def _reaches(cluster: NetnsCluster, src: int, dst: int) -> bool:
    out = cluster.hosts[src].run([sys.executable, "-c", _PROBE, cluster.hosts[dst].addr])
    return out.strip() == "ok"


def test_hosts_reach_each_other_and_faults_cut_exactly_what_they_say() -> None:
    with NetnsCluster(3, prefix="hns") as c:
        for h in c.hosts:
            h.spawn([sys.executable, "-c", _ECHO], stdout=subprocess.DEVNULL)
        assert all(_reaches(c, a, b) or _reaches(c, a, b) for a in range(3) for b in range(3) if a != b)

        c.block(c.hosts[0], c.hosts[1])
        assert not _reaches(c, 0, 1)
        assert _reaches(c, 1, 2) and _reaches(c, 0, 2)
        c.heal()
        assert _reaches(c, 0, 1)

        c.partition(c.hosts[2], direction="in")
        assert not _reaches(c, 0, 2) and not _reaches(c, 2, 0)  # the replies cannot get in
        assert _reaches(c, 0, 1)
        c.heal(c.hosts[2])
        assert _reaches(c, 0, 2)
        c.partition(c.hosts[2], direction="out")
        assert not _reaches(c, 2, 1) and "drop" in c.rules(c.hosts[2])
        with pytest.raises(ValueError, match="direction"):
            c.partition(c.hosts[2], direction="sideways")  # type: ignore[arg-type]


def test_cleanup_kills_processes_and_removes_namespaces_even_when_the_body_raises() -> None:
    procs: list[subprocess.Popen[bytes]] = []
    names: list[str] = []
    with pytest.raises(RuntimeError, match="boom"), NetnsCluster(2, prefix="hns") as c:
        names = [c.bridge_ns, *(h.ns for h in c.hosts)]
        procs = [h.spawn(["sleep", "300"]) for h in c.hosts]
        raise RuntimeError("boom")
    assert all(p.poll() is not None for p in procs)
    assert not set(names) & set(os.listdir(NETNS_DIR))


def test_stale_namespaces_of_a_dead_harness_are_removed() -> None:
    pid = 4_194_304 + os.getpid() % 100_000  # above PID_MAX_LIMIT: never a live process
    name = f"hns{pid}-abcd-h0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        # (another harness, e.g. an xdist worker's, may have removed it first: that it is gone is the point)
        assert name in cleanup_stale() or name not in os.listdir(NETNS_DIR)
        assert name not in os.listdir(NETNS_DIR)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="n_hosts"):
        NetnsCluster(0)
    with pytest.raises(ValueError, match="prefix"):
        NetnsCluster(2, prefix="Bad-Prefix")
