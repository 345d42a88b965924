"""Placement that knows the network (issue 22 item 4): the ring orchestrator -> stages -> orchestrator costs the least
RTT, the orchestrator's own node saves a hop, pins and memory still rule, and the dry run shows each hop."""

from __future__ import annotations

import dataclasses
import itertools

from swactor.cli.render import plan_lines, rtt_lines
from swactor.orchestrator.planning.dry_run import plan_response
from swactor.orchestrator.planning.placement import MAX_ORDERS_TRIED, Network, Shortfall, fewest_stages, place
from swactor.orchestrator.planning.pool import Demand, PoolGate, PoolStatus
from swactor.v1 import orchestrator_pb2 as opb

from .test_placement import SMOL, GiB, need, nodes


def symmetric(**pairs: float) -> dict[tuple[int, int], float]:
    """RTTs given as a1b2=ms (nodes a and b), measured from both ends."""
    out = {}
    for key, ms in pairs.items():
        a, b = int(key[1:key.index("b")]), int(key[key.index("b") + 1:])
        out[a, b] = out[b, a] = ms
    return out


def ids(p) -> list[int]:
    return [n.node_id for n in p.nodes]


def test_with_nothing_measured_the_orchestrators_node_takes_stage_0_and_saves_a_hop() -> None:
    pool = nodes(*[64 * GiB] * 3)
    assert ids(place(pool, 3, 30, memory=need(SMOL))) == [1, 2, 3]  # no network: node-id order
    net = Network(origin=2)
    p = place(pool, 3, 30, memory=need(SMOL), network=net)
    assert ids(p) == [2, 1, 3]
    assert net.ring(ids(p)) == [0.0, None, None, None]  # three hops between hosts, where node-id order has four
    assert net.one_way_ms(ids(p)) is None
    assert ids(place(pool, 3, 30, network=Network(origin=99))) == [1, 2, 3]  # an orchestrator on no stage node


def test_a_far_node_is_left_out_and_the_ring_follows_the_near_ones() -> None:
    pool = nodes(*[64 * GiB] * 4)
    rtt = symmetric(a1b2=2, a1b3=3, a2b3=2, a1b4=80, a2b4=80, a3b4=80)
    p = place(pool, 3, 30, memory=need(SMOL), network=Network(1, rtt))
    assert ids(p) == [1, 2, 3] and Network(1, rtt).one_way_ms(ids(p)) == (0 + 2 + 2 + 3) / 2
    # all four: two regions ({1, 2} and {3, 4}, 40 ms apart); the ring crosses between them twice, not four times
    rtt = symmetric(a1b2=1, a3b4=1, a1b3=40, a1b4=40, a2b3=40, a2b4=40)
    net = Network(1, rtt)
    p = place(pool, 4, 30, memory=need(SMOL), network=net)
    assert sum(h is not None and h >= 40 for h in net.ring(ids(p))) == 2 and ids(p)[0] == 1
    best = min(sum(net.ring(o)) for o in itertools.permutations([1, 2, 3, 4]))  # type: ignore[arg-type]
    assert sum(net.ring(ids(p))) == best  # type: ignore[arg-type]


def test_pins_keep_their_order_whatever_the_network() -> None:
    pool = nodes(*[64 * GiB] * 3)
    rtt = symmetric(a1b2=90, a1b3=1, a2b3=1)
    assert ids(place(pool, 3, 30, (3, 1, 2), need(SMOL), Network(1, rtt))) == [3, 1, 2]


def test_a_near_ring_that_does_not_fit_gives_way_to_the_nodes_with_the_memory() -> None:
    small, big = SMOL.stage(0, 15, 4096).total // 2, 64 * GiB
    pool = nodes(small, small, big, big)  # 1 and 2 are near the orchestrator (node 1) but cannot hold the model
    rtt = symmetric(a1b2=1, a1b3=50, a1b4=50, a2b3=50, a2b4=50, a3b4=1)
    p = place(pool, 2, 30, memory=need(SMOL), network=Network(1, rtt))
    assert sorted(ids(p)) == [3, 4] and not p.over()
    try:
        place(pool, 2, 30, (1, 2), need(SMOL), Network(1, rtt))
    except Shortfall as e:
        assert "does not fit" in str(e)
    else:
        raise AssertionError("pinned small nodes should not fit")


def test_a_pool_too_large_to_try_every_order_is_walked_nearest_first() -> None:
    pool = nodes(*[64 * GiB] * 12)
    positions = {n.node_id: 10.0 * i for i, n in enumerate(reversed(pool))}  # node 12 at 0 ms ... node 1 at 110
    rtt = {(a, b): abs(positions[a] - positions[b]) for a in positions for b in positions if a != b}
    assert len(list(itertools.permutations(range(12), 6))) > MAX_ORDERS_TRIED
    p = place(pool, 6, 30, memory=need(SMOL), network=Network(12, rtt))
    assert ids(p) == [12, 11, 10, 9, 8, 7]


def test_the_gate_places_on_its_network_and_the_dry_run_shows_each_hop() -> None:
    pool = tuple(dataclasses.replace(n, memory_bytes=64 * GiB) for n in nodes(1, 1, 1))
    rtt = symmetric(a1b2=20.0, a1b3=30.0, a2b3=10.0)
    gate = PoolGate(0.0)
    gate.network = Network(3, rtt)
    gate.observe(pool, 0.0)
    demand = Demand(3, (), 30, need(SMOL))
    status = gate.check(1.0, demand)
    # three nodes: every ring over them costs the same, so the orchestrator's node goes first, the rest by id
    assert status.ready and status.placement is not None and ids(status.placement) == [3, 1, 2]
    answer = plan_response("smol", pool, demand, status, prompt_tokens=5, max_seq_len=4096, network=gate.network)
    assert [s.node_id for s in answer.placement] == [3, 1, 2] and answer.orchestrator_node_id == 3
    assert list(answer.hop_rtt_ms) == [0.0, 30.0, 20.0, 10.0] and answer.network_ms_per_token == 30.0
    ring = next(line for line in plan_lines(answer) if line.startswith("  ring"))
    assert ring == ("  ring (RTT): orchestrator (node 3) -[same host]-> stage 0 -[30.0 ms]-> stage 1 -[20.0 ms]-> "
                    "stage 2 -[10.0 ms]-> orchestrator; the hops add 30.0 ms to each token (one way each)")
    unmeasured = plan_response("smol", pool, demand, PoolStatus(True, "ok"), prompt_tokens=5, max_seq_len=4096,
                               network=Network(3, {(3, 2): 1.0}))
    assert list(unmeasured.hop_rtt_ms) == [0.0, -1.0, -1.0, 1.0] and not unmeasured.HasField("network_ms_per_token")
    assert "not measured -> " not in plan_lines(unmeasured)[-3] and "not every hop measured" in plan_lines(unmeasured)[-3]


def test_nodes_shows_the_rtt_matrix() -> None:
    resp = opb.ListNodesResponse(nodes=[opb.Node(node_id=i) for i in (1, 2, 3)], orchestrator_node_id=1,
                                 rtts=[opb.NodeRtt(from_node_id=1, to_node_id=2, rtt_ms=0.25),
                                       opb.NodeRtt(from_node_id=2, to_node_id=1, rtt_ms=0.5)])
    lines = rtt_lines(resp)
    assert lines[0].startswith("RTT ms (row pinged column; * the orchestrator's node 1)")
    assert lines[2].split() == ["*1", "-", "0.25", "?"] and lines[3].split() == ["2", "0.50", "-", "?"]
    assert rtt_lines(opb.ListNodesResponse()) == ["RTT between nodes: none measured yet"]


def test_the_last_runs_ring_stays_unless_another_is_cheaper_by_more_than_the_margin() -> None:
    pool = nodes(*[64 * GiB] * 4)
    # origin 1; ring 1-2-3 costs 10 + 10 + 12 = 32 ms, ring 1-2-4 costs 10 + 10 + 13.5 = 33.5 ms (within 10 % + 2 ms)
    rtt = symmetric(a1b2=10, a2b3=10, a1b3=12, a2b4=10, a1b4=13.5, a3b4=10)
    assert ids(place(pool, 3, 30, memory=need(SMOL), network=Network(1, rtt))) == [1, 2, 3]
    warm = Network(1, rtt, warm={3: ((1, 0), (2, 0), (4, 0))})
    assert ids(place(pool, 3, 30, memory=need(SMOL), network=warm)) == [1, 2, 4]  # its weights are loaded: it stays
    far = Network(1, {**rtt, **symmetric(a1b4=40)}, warm={3: ((1, 0), (2, 0), (4, 0))})
    assert ids(place(pool, 3, 30, memory=need(SMOL), network=far)) == [1, 2, 3]  # 60 ms against 32: it moves
    gone = Network(1, rtt, warm={3: ((1, 0), (2, 0), (4, 0))})
    assert ids(place(pool[:3], 3, 30, memory=need(SMOL), network=gone)) == [1, 2, 3]  # node 4 left the pool


def test_the_fewest_stages_that_fit_are_chosen_when_the_request_leaves_it_open() -> None:
    one = need(SMOL).stage(0, 30).total
    half = max(need(SMOL).stage(0, 15).total, need(SMOL).stage(15, 30).total)
    assert half < one
    pool = nodes(*[(half + one) // 2] * 3)  # holds half the model, not all of it
    assert fewest_stages(pool, 30, need(SMOL), Network(1)) == 2
    assert fewest_stages(nodes(*[one] * 3), 30, need(SMOL)) == 1
    assert fewest_stages(pool, 30, None) == 1  # memory unknown: one stage, as before
    assert fewest_stages(nodes(*[GiB // 8] * 3), 30, need(SMOL)) == 3  # nothing fits: the placement names why
    assert fewest_stages((), 30, need(SMOL)) == 1
