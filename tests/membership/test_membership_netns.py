"""Acceptance: real swactor-membership processes, one per network namespace on one bridge.

Stated bounds (generous for a noisy shared 2-core box; the LAN profile probes every 1 s and its
suspicion timeout is 3-12 s depending on confirmations):
  convergence of 5 hosts            <= 15 s
  SIGKILL -> dead on every host      <= 20 s
  SIGTERM -> left on every host      <= 5 s
  metadata change on every host      <= 5 s
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from swactor.localcluster.linkconditions import LinkConditions
from swactor.localcluster.linkshaping import LinkShaping, ShapedHost
from swactor.v1 import membership_pb2 as pb
from tests.membership.cluster import MembershipCluster, Node, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.serial]  # suspicion timeouts under a CPU hog: alone on the box

CONVERGE_S = 15.0
DEAD_S = 20.0
LEFT_S = 5.0
METADATA_S = 5.0


def _converged(cluster: MembershipCluster, nodes: list[Node]) -> bool:
    ids = {n.node_id for n in nodes}
    views = cluster.live_views(nodes)
    if any(set(v) != ids for v in views.values()):
        return False
    # Same metadata for every member on every host.
    for node_id in ids:
        seen = {views[viewer][node_id].metadata.SerializeToString(deterministic=True) for viewer in views}
        if len(seen) != 1:
            return False
    return True


def _all_see(nodes: list[Node], node_id: int, status: int) -> bool:
    return all(n.status_of(node_id) == status for n in nodes)


@pytest.mark.parametrize("membership_cluster", [5], indirect=True)
def test_five_hosts_converge_with_same_metadata_and_state_change_spreads(
    membership_cluster: MembershipCluster,
) -> None:
    cluster = membership_cluster
    nodes = cluster.start_all(list(range(5)))
    wait_until(lambda: _converged(cluster, nodes), CONVERGE_S, "5 hosts to list each other alive")

    views = cluster.live_views(nodes)
    target = nodes[2]
    md = views[nodes[0].node_id][target.node_id].metadata
    assert md.node_id == target.node_id
    assert md.edge_endpoint == f"{target.host.addr}:4433"
    assert md.control_endpoint == f"{target.host.addr}:7000"
    assert md.edge_cert_fingerprint == f"{2:064x}"
    assert [(g.kind, g.name, g.memory_bytes) for g in md.gpus] == [("CPU", "fake-2", 3 * 2**30)]
    assert md.state == pb.NODE_STATE_BOOTING
    assert md.software_version

    watches = [cluster.watch(n) for n in nodes if n is not target]
    before = target.get_self().self.incarnation
    reply = target.stub.SetLocalState(pb.SetLocalStateRequest(state=pb.NODE_STATE_AVAILABLE), timeout=5)
    assert reply.self.metadata.state == pb.NODE_STATE_AVAILABLE
    assert reply.self.incarnation > before

    def everyone_sees_available() -> bool:
        return all(
            v[target.node_id].metadata.state == pb.NODE_STATE_AVAILABLE
            for v in cluster.live_views(nodes).values()
            if target.node_id in v
        ) and _converged(cluster, nodes)

    wait_until(everyone_sees_available, METADATA_S, "state AVAILABLE to reach every host")
    wait_until(
        lambda: all(w.of(target.node_id, pb.MEMBER_EVENT_KIND_METADATA_CHANGED) for w in watches),
        METADATA_S, "a METADATA_CHANGED watch event on every other host",
    )
    for w in watches:
        assert w.of(target.node_id, pb.MEMBER_EVENT_KIND_METADATA_CHANGED)[-1].incarnation > before


@pytest.mark.parametrize("membership_cluster", [5], indirect=True)
def test_sigkill_is_dead_sigterm_is_left_and_identity_survives_restart(
    membership_cluster: MembershipCluster,
) -> None:
    cluster = membership_cluster
    nodes = cluster.start_all(list(range(5)))
    wait_until(lambda: _converged(cluster, nodes), CONVERGE_S, "convergence")
    watches = {n.node_id: cluster.watch(n) for n in nodes[:3]}

    killed, leaver = nodes[4], nodes[3]
    t0 = time.monotonic()
    killed.signal(signal.SIGKILL)
    survivors = nodes[:4]
    wait_until(lambda: _all_see(survivors, killed.node_id, pb.MEMBER_STATUS_DEAD), DEAD_S,
               f"SIGKILLed node to be dead on every host within {DEAD_S} s")
    detect_s = time.monotonic() - t0

    t1 = time.monotonic()
    leaver.signal(signal.SIGTERM)
    assert leaver.proc.wait(timeout=10) == 0, leaver.log_tail()
    wait_until(lambda: _all_see(nodes[:3], leaver.node_id, pb.MEMBER_STATUS_LEFT), LEFT_S,
               f"SIGTERMed node to be left on every host within {LEFT_S} s")
    left_s = time.monotonic() - t1
    for w in watches.values():
        assert w.of(leaver.node_id, pb.MEMBER_EVENT_KIND_LEFT)
        assert not w.of(leaver.node_id, pb.MEMBER_EVENT_KIND_DEAD), "a graceful leave was seen as a death"
        assert w.of(killed.node_id, pb.MEMBER_EVENT_KIND_DEAD)
        assert not w.of(killed.node_id, pb.MEMBER_EVENT_KIND_LEFT)
    print(f"dead after SIGKILL in {detect_s:.1f} s, left after SIGTERM in {left_s:.1f} s")

    # Dead and left members are remembered, and only listed on request.
    view = nodes[0].members(include_departed=True)
    assert {m.metadata.node_id: m.status for m in view if m.status >= pb.MEMBER_STATUS_DEAD} == {
        killed.node_id: pb.MEMBER_STATUS_DEAD, leaver.node_id: pb.MEMBER_STATUS_LEFT,
    }
    assert {m.metadata.node_id for m in nodes[0].members()} == {n.node_id for n in nodes[:3]}

    # The node id persists in the state dir: a restart comes back under the same identity.
    old_id = leaver.node_id
    again = cluster.ready(cluster.start(3))
    assert again.node_id == old_id
    wait_until(lambda: _all_see(nodes[:3], old_id, pb.MEMBER_STATUS_ALIVE), CONVERGE_S,
               "the restarted node to be alive again on every host")


@pytest.mark.parametrize("membership_cluster", [4], indirect=True)
def test_one_way_partition_suspect_then_dead_then_rejoins_with_higher_incarnation(
    membership_cluster: MembershipCluster,
) -> None:
    cluster = membership_cluster
    nodes = cluster.start_all(list(range(4)))
    wait_until(lambda: _converged(cluster, nodes), CONVERGE_S, "convergence")
    victim, others = nodes[3], nodes[:3]
    watches = [cluster.watch(n) for n in others]
    inc0 = victim.get_self().self.incarnation

    cluster.net.partition(victim.host, direction="in")
    wait_until(lambda: _all_see(others, victim.node_id, pb.MEMBER_STATUS_DEAD), DEAD_S,
               "the partitioned node to be dead on every other host")
    for w in watches:
        assert w.of(victim.node_id, pb.MEMBER_EVENT_KIND_SUSPECT), "dead without being suspect first"
        suspect_at = w.of(victim.node_id, pb.MEMBER_EVENT_KIND_SUSPECT)[0].at
        assert suspect_at <= w.of(victim.node_id, pb.MEMBER_EVENT_KIND_DEAD)[0].at
    dead_inc = max(w.of(victim.node_id, pb.MEMBER_EVENT_KIND_DEAD)[-1].incarnation for w in watches)

    cluster.net.heal()
    wait_until(lambda: _converged(cluster, nodes), 30.0, "the healed node to rejoin every view")
    for n in others:
        m = next(m for m in n.members() if m.metadata.node_id == victim.node_id)
        assert m.incarnation > max(dead_inc, inc0), f"rejoined at incarnation {m.incarnation}, dead at {dead_inc}"
    for w in watches:
        back = [e for e in w.events if e.node_id == victim.node_id
                and e.kind in (pb.MEMBER_EVENT_KIND_JOIN, pb.MEMBER_EVENT_KIND_ALIVE)]
        assert back and back[-1].incarnation > dead_inc


_HOG = "import time\nend = time.monotonic() + {secs}\nwhile time.monotonic() < end: pass\n"


@pytest.mark.parametrize("membership_cluster", [4], indirect=True)
def test_no_false_positive_under_cpu_hog_or_short_sigstop(membership_cluster: MembershipCluster) -> None:
    cluster = membership_cluster
    nodes = cluster.start_all(list(range(4)))
    wait_until(lambda: _converged(cluster, nodes), CONVERGE_S, "convergence")
    victim, others = nodes[3], nodes[:3]
    watches = [cluster.watch(n) for n in others]

    # Phase 1: the victim's host is busy: three CPU-bound processes on a 2-core machine for 6 s.
    hogs = [victim.host.spawn([sys.executable, "-c", _HOG.format(secs=6)], stdout=subprocess.DEVNULL)
            for _ in range(3)]
    for h in hogs:
        h.wait(timeout=30)

    # Phase 2: the membership process itself is frozen for 2 s, below the 3 s minimum
    # suspicion timeout (suspicion_mult 3 x 1 s probe interval at n = 4).
    victim.signal(signal.SIGSTOP)
    time.sleep(2.0)
    victim.signal(signal.SIGCONT)
    time.sleep(8.0)  # longer than the longest suspicion timeout a death would have needed

    for w in watches:
        assert not w.of(victim.node_id, pb.MEMBER_EVENT_KIND_DEAD), "false death"
    assert _all_see(others, victim.node_id, pb.MEMBER_STATUS_ALIVE)
    assert len(victim.members()) == 4
    refuted = victim.get_self().counters.refutations
    print(f"victim refuted {refuted} suspicion(s); health {victim.get_self().counters.local_health}")


@pytest.mark.parametrize("membership_cluster", [4], indirect=True)
def test_node_with_another_secret_never_joins_and_is_counted(membership_cluster: MembershipCluster) -> None:
    cluster = membership_cluster
    good = cluster.start_all([0, 1, 2])
    wait_until(lambda: _converged(cluster, good), CONVERGE_S, "convergence of the good hosts")
    wrong = cluster.write_secret(b"another cluster's secret, same length....", "wrong.secret")
    intruder = cluster.ready(cluster.start(3, seeds=[0, 1], secret_file=wrong))

    wait_until(lambda: good[0].get_self().counters.rejected_packets > 0, 10.0,
               "the seed to count the intruder's packets as rejected")
    time.sleep(3.0)  # several probe rounds and join retries of the intruder
    for n in good:
        assert intruder.node_id not in {m.metadata.node_id for m in n.members(include_departed=True)}
    assert [m.metadata.node_id for m in intruder.members(include_departed=True)] == [intruder.node_id]
    counters = good[0].get_self().counters
    assert counters.decrypt_failures > 0
    assert counters.rejected_packets >= counters.decrypt_failures
    assert intruder.get_self().counters.alive == 1


@pytest.mark.parametrize("membership_cluster", [2], indirect=True)
def test_join_retries_until_a_seed_appears(membership_cluster: MembershipCluster) -> None:
    cluster = membership_cluster
    early = cluster.ready(cluster.start(1, seeds=[0]))  # its only seed is not running yet
    time.sleep(3.0)  # more than one join attempt fails meanwhile
    assert early.get_self().counters.alive == 1
    # the seed's host refused the handshake (its membership was not up): a round trip measured all the same
    assert list(_events(early, "membership_seed_rtt")[0]["rtt_ms"]) == [f"{cluster.net.hosts[0].addr}:7946"]
    seed = cluster.ready(cluster.start(0, seeds=[]))
    wait_until(lambda: _converged(cluster, [early, seed]), CONVERGE_S, "the late seed to be found by a retry")


@pytest.mark.parametrize("membership_cluster", [2], indirect=True)
def test_a_joining_node_starts_on_the_probe_timings_its_seeds_round_trip_calls_for(
        membership_cluster: MembershipCluster, tmp_path: Path) -> None:
    """150 ms of round trip between the hosts (75 ms one way on arrival, the local pool's delayer): the joining node
    measures its seed before its engine starts and starts on 6.5 x that round trip (probe_timing.py), not on the LAN
    timings; the first host, with no seed, starts as configured. Both then hold each other alive."""
    cluster = membership_cluster
    hosts = [ShapedHost(f"h{h.index}", h.ns, tmp_path / f"link-h{h.index}") for h in cluster.net.hosts]
    for h in hosts:
        h.log_dir.mkdir()
    shaping = LinkShaping(LinkConditions(delay_ms=75), hosts)
    shaping.apply(timeout_s=30)
    try:
        first = cluster.ready(cluster.start(0, seeds=[]), timeout=60)
        joiner = cluster.ready(cluster.start(1, seeds=[0]), timeout=60)
        seed = f"{first.host.addr}:7946"
        measured = _events(joiner, "membership_seed_rtt")
        assert len(measured) == 1 and measured[0]["rtt_ms"][seed] >= 150 and measured[0]["unanswered"] == [], measured
        applied = _events(joiner, "membership_probe_timing_applied")
        assert [(e["reason"], e["source"], e["configured_probe_timeout_s"]) for e in applied] == \
            [("seed_rtt", seed, 0.5)], applied
        assert applied[0]["probe_timeout_s"] == pytest.approx(6.5 * measured[0]["rtt_ms"][seed] / 1000, abs=0.01)
        assert applied[0]["probe_interval_s"] == pytest.approx(2 * applied[0]["probe_timeout_s"], abs=0.002)  # 3 decimals
        assert _events(first, "membership_seed_rtt") == _events(first, "membership_probe_timing_applied") == []
        wait_until(lambda: _converged(cluster, [first, joiner]), 60, "the pair to converge across 150 ms")
    finally:
        shaping.remove()


def _events(node: Node, name: str) -> list[dict[str, Any]]:
    """`node`'s structured events called `name`, from its log's whole lines (the node may be writing the next)."""
    lines = node.log_path.read_text().split("\n")[:-1]
    return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("event") == name]
