"""Link conditions (swactor.localcluster.linkshaping) with real packets on bare network namespaces: two hosts on a
bridge as the local cluster makes them (netns.py), shaped as the cluster shapes them, and probes
(tests/harness/linkprobe.py) inside the namespaces; no pool. Bounds are wide: the box is shared, and what is
asserted is what a broken shaper could not do, not timing to the millisecond."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkshaping import LinkShaping, ShapedHost, unavailable
from swactor.localcluster.netns import Netns, namespaces
from tests.harness.procs import pid_alive, poll

REPO = Path(__file__).resolve().parents[2]
PORT = 9300
WHY = Netns.available() or unavailable()
# serial: it measures the shaped links' delay and rate, which a busy neighbour would move
pytestmark = [pytest.mark.netns, pytest.mark.serial, pytest.mark.skipif(WHY is not None, reason=str(WHY)),
              pytest.mark.timeout(60)]


class Pair:
    """Two hosts' namespaces and the probes started in them (killed with the namespaces)."""

    def __init__(self, tmp: Path) -> None:
        self.net = Netns(2)
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def ns(self, i: int) -> str:
        return self.net.host(i)

    def addr(self, i: int) -> str:
        return self.net.addrs[i]

    def probe(self, i: int, *argv: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(i), sys.executable, "-m", "tests.harness.linkprobe",
                                 *argv], cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        return proc

    def server(self, i: int, *argv: str) -> subprocess.Popen[str]:
        proc = self.probe(i, *argv)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    def shaping(self, conditions: LinkConditions) -> LinkShaping:
        return LinkShaping(conditions, [ShapedHost(f"h{i}", self.ns(i), self.tmp / f"h{i}") for i in range(2)])

    def leftovers(self) -> list[str]:
        """nft tables and link delayers still in the namespaces."""
        found = []
        for i in range(2):
            ns = self.ns(i)
            tables = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "tables"], capture_output=True,
                                    text=True, check=True).stdout.split("\n")
            found += [f"{ns}: {t}" for t in tables if t.strip()]
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                with contextlib.suppress(OSError):
                    if b"swactor.localcluster.linkdelay" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found.append(f"{ns}: link delayer {pid}")
        return found


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    p = Pair(tmp_path)
    p.net.create()
    try:
        yield p
    finally:
        p.net.destroy()
        for proc in p.procs:
            proc.wait(5)


@contextlib.contextmanager
def shaped(pair: Pair, conditions: LinkConditions) -> Iterator[LinkShaping]:
    shaping = pair.shaping(conditions)
    try:
        shaping.apply(timeout_s=20)
        yield shaping
    finally:
        shaping.remove()
    assert pair.leftovers() == []


def result(proc: subprocess.Popen[str], timeout_s: float = 30.0) -> dict[str, object]:
    out, _ = proc.communicate(timeout=timeout_s)
    return json.loads(out.strip().splitlines()[-1])


def rtts(pair: Pair, src: int, dst: int, count: int = 10) -> list[float]:
    got = result(pair.probe(src, "rtt", "--to", f"{pair.addr(dst)}:{PORT}", "--count", str(count)))["rtt_ms"]
    assert isinstance(got, list)
    return got


def test_a_40ms_link_makes_the_round_trip_between_hosts_at_least_80ms_and_leaves_a_host_to_itself_alone(
        pair: Pair) -> None:
    pair.server(0, "udp-echo", "--port", str(PORT))
    pair.server(1, "udp-echo", "--port", str(PORT))
    with shaped(pair, LinkConditions(delay_ms=40)):
        between = rtts(pair, 0, 1)
        itself = rtts(pair, 0, 0)
    print(f"40 ms one way: RTT h0->h1 min {min(between):.1f} median {statistics.median(between):.1f} "
          f"max {max(between):.1f} ms; h0->h0 median {statistics.median(itself):.2f} ms")
    assert min(between) >= 80.0
    assert statistics.median(between) < 200.0
    assert statistics.median(itself) < 5.0
    assert statistics.median(rtts(pair, 0, 1)) < 5.0  # and none once the shaping is gone


def test_jitter_spreads_the_delay_but_keeps_one_flow_in_order(pair: Pair) -> None:
    pair.server(1, "udp-echo", "--port", str(PORT))
    with shaped(pair, LinkConditions(delay_ms=40, jitter_ms=20)):
        samples = rtts(pair, 0, 1, count=12)
        counter = pair.server(1, "udp-count", "--port", str(PORT + 1), "--idle-s", "1.0")
        result(pair.probe(0, "udp-send", "--to", f"{pair.addr(1)}:{PORT + 1}", "--count", "300"))
        burst = result(counter)
    print(f"40 +- 20 ms one way: RTT min {min(samples):.1f} max {max(samples):.1f} ms; "
          f"300 datagrams of one flow: {burst}")
    assert min(samples) >= 40.0 and max(samples) < 200.0
    assert max(samples) - min(samples) > 5.0  # two uniform draws per round trip: 12 within 5 ms is next to impossible
    assert burst == {"received": 300, "in_order": True}


def test_half_loss_drops_about_half_of_400_datagrams(pair: Pair) -> None:
    with shaped(pair, LinkConditions(loss_pct=50)) as shaping:
        assert shaping.delayer_pids == []  # loss alone is a kernel rule
        counter = pair.server(1, "udp-count", "--port", str(PORT), "--idle-s", "1.0")
        result(pair.probe(0, "udp-send", "--to", f"{pair.addr(1)}:{PORT}", "--count", "400"))
        got = result(counter)
    received = got["received"]
    assert isinstance(received, int)
    print(f"50 % loss: {received} of 400 datagrams arrived ({1 - received / 400:.2f} lost)")
    assert 120 <= received <= 280  # binomial(400, 0.5): 200 +- 10; a shaper that does nothing, or drops all, fails


def test_a_rate_cap_caps_a_bulk_transfer(pair: Pair) -> None:
    size = 1_500_000
    with shaped(pair, LinkConditions(rate_mbit=8.0)):  # 1 MB/s
        sink = pair.server(1, "tcp-sink", "--port", str(PORT))
        result(pair.probe(0, "tcp-send", "--to", f"{pair.addr(1)}:{PORT}", "--bytes", str(size)))
        got = result(sink)
    assert got["bytes"] == size
    seconds = got["seconds"]
    assert isinstance(seconds, float)
    rate = size / seconds
    print(f"8 Mbit/s cap: {size} bytes over TCP in {seconds:.2f} s = {rate / 1e6:.2f} MB/s ({rate * 8 / 1e6:.1f} Mbit/s)")
    assert 0.3e6 < rate < 1.1e6  # the veth alone carries hundreds of MB/s


def test_teardown_leaves_nothing_even_after_a_delayer_died(pair: Pair) -> None:
    shaping = pair.shaping(LinkConditions(delay_ms=5, jitter_ms=2, loss_pct=1.5, rate_mbit=50.0))
    shaping.apply(timeout_s=20)
    try:
        pids = shaping.delayer_pids
        assert len(pids) == 2 and len(pair.leftovers()) == 4  # a filter table and a delayer per host
        os.kill(pids[1], signal.SIGKILL)
        poll(lambda: shaping.dead() is not None, 5.0)
        assert "h1/link-delay" in (shaping.dead() or "")
    finally:
        shaping.remove()
    assert pair.leftovers() == []
    assert not any(pid_alive(p) for p in pids)
    shaping.remove()  # twice is harmless


# An owner that shapes its namespaces with a reaper, reports, then waits to be killed.
OWNER = r"""
import json, sys, time
from pathlib import Path
from swactor.localcluster.lifeline import Lifeline
from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkshaping import LinkShaping, ShapedHost
from swactor.localcluster.netns import Netns
from swactor.common.events import configure_logging
configure_logging("test-owner")
line = Lifeline()
net = Netns(2)
line.own_netns(net.name)
net.create()
shaping = LinkShaping(LinkConditions(delay_ms=10), [ShapedHost(f"h{i}", net.host(i), Path(sys.argv[1]))
                                                   for i in range(2)], line)
shaping.apply(timeout_s=20)
print(json.dumps({"pids": shaping.delayer_pids, "namespaces": net.created, "reaper": line.reaper_pid}), flush=True)
time.sleep(600)
"""



def test_an_owner_killed_while_shaping_leaves_nothing_behind(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
        assert len(info["pids"]) == 2
        owner.kill()
        owner.wait()

        def gone() -> bool:
            """no delayer, namespace or reaper left"""
            return (not any(pid_alive(p) for p in info["pids"]) and not pid_alive(info["reaper"])
                    and not set(info["namespaces"]) & set(namespaces()))

        print(f"owner SIGKILLed: delayers and namespaces gone {poll(gone, 3.0):.2f} s later")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
