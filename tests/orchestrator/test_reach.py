"""The reachability core (fleet/reach.py): which probes to start, when a node is provisionable, what its reason
says, when it is probed again. A scripted clock, no sockets."""

from __future__ import annotations

import dataclasses

import pytest

from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.fleet.reach import (
    PENDING,
    Changed,
    Endpoint,
    Failure,
    ReachConfig,
    ReachTracker,
    Unreachable,
    probe_timeout,
)
from swactor.orchestrator.planning.placement import place

EDGE, CONTROL = "10.0.0.5:17400", "10.0.0.5:17442"


def node(node_id: int = 1, state: NodeState = NodeState.AVAILABLE, edge: str = EDGE, control: str = CONTROL,
         epoch: int = 1) -> NodeInfo:
    return NodeInfo(node_id, state, edge_endpoint=edge, control_endpoint=control, epoch=epoch)


def edge_silent(address: str = EDGE, timeout_s: float = 3.0) -> Unreachable:
    return Unreachable(Endpoint.EDGE, address, Failure.EDGE_NO_ANSWER, timeout_s)


def tracker(**cfg: float) -> ReachTracker:
    return ReachTracker(ReachConfig(**cfg))  # type: ignore[arg-type]


def test_a_new_available_node_is_probed_once_and_is_not_provisionable_until_it_answers() -> None:
    t = tracker()
    probes = t.observe((node(),), 0.0)
    assert [(p.node_id, p.edge, p.control, p.timeout_s) for p in probes] == [(1, EDGE, CONTROL, 3.0)]
    assert t.observe((node(),), 0.5) == []  # the same endpoints: no second probe
    (masked,) = t.apply((node(),))
    assert not masked.provisionable and masked.reason == PENDING
    assert t.report(probes[0], (), 1.0) is None  # reachable at first sight: nothing to log
    assert t.apply((node(),)) == (node(),) and node().provisionable


def test_a_node_not_yet_available_is_not_probed_nor_masked() -> None:
    t = tracker()
    booting = node(state=NodeState.BOOTING)
    assert t.observe((booting, node(2, edge="")), 0.0) == []
    assert t.apply((booting,)) == (booting,)


def test_an_unreachable_edge_is_named_with_its_address_transport_and_what_failed() -> None:
    t = tracker()
    (p,) = t.observe((node(),), 0.0)
    changed = t.report(p, (edge_silent(),), 1.0)
    assert changed == Changed(1, (edge_silent(),), was_unreachable=False)
    (masked,) = t.apply((node(),))
    assert not masked.provisionable
    assert masked.reason == masked.unreachable == (
        "edge endpoint 10.0.0.5:17400 (UDP, QUIC) did not answer a version probe from the orchestrator's host in 3 s: "
        "check the port map (--advertise-port edge=...)")
    # the planner leaves it out: a second, reachable node holds the run alone
    (q,) = t.observe((node(), node(2, edge="10.0.0.6:17400")), 1.0)
    t.report(q, (), 1.1)
    view = t.apply((node(), node(2, edge="10.0.0.6:17400")))
    assert [n.node_id for n in place(view, 1, 8).nodes] == [2]


def test_every_unreachable_endpoint_is_named() -> None:
    t = tracker()
    (p,) = t.observe((node(),), 0.0)
    refused = Unreachable(Endpoint.CONTROL, CONTROL, Failure.CONTROL_REFUSED, 3.0)
    t.report(p, (edge_silent(), refused), 1.0)
    (masked,) = t.apply((node(),))
    assert "edge endpoint 10.0.0.5:17400" in masked.reason
    assert ("control endpoint 10.0.0.5:17442 (TCP, mutual TLS) refused the TCP connection from the orchestrator's "
            "host: check the port map (--advertise-port control=...)") in masked.reason


def test_an_unreachable_node_is_probed_again_every_retry_and_is_provisionable_once_it_answers() -> None:
    t = tracker(retry_s=10.0, recheck_s=0.0)
    (p,) = t.observe((node(),), 0.0)
    t.report(p, (edge_silent(),), 1.0)
    assert t.deadline() == 11.0 and t.due(10.9) == []
    (again,) = t.due(11.0)
    assert t.deadline() is None  # in flight
    # the same failure again (the socket's words may differ): nothing new to log
    assert t.report(again, (dataclasses.replace(edge_silent(), detail="other words"),), 12.0) is None
    (third,) = t.due(22.0)
    assert t.report(third, (), 22.5) == Changed(1, (), was_unreachable=True)
    assert t.apply((node(),)) == (node(),)
    assert t.deadline() is None  # recheck_s = 0: a reachable node is probed again only on a change


def test_a_reachable_node_is_rechecked_so_a_broken_port_map_is_noticed() -> None:
    t = tracker(recheck_s=60.0)
    (p,) = t.observe((node(),), 0.0)
    t.report(p, (), 1.0)
    assert t.deadline() == 61.0
    (again,) = t.due(61.0)
    assert t.report(again, (edge_silent(),), 62.0) == Changed(1, (edge_silent(),), was_unreachable=False)
    assert not t.apply((node(),))[0].provisionable


def test_new_endpoints_or_a_restart_are_probed_afresh_and_a_stale_result_is_ignored() -> None:
    t = tracker()
    (old,) = t.observe((node(),), 0.0)
    moved = node(edge="10.0.0.5:27400")
    (new,) = t.observe((moved,), 0.5)
    assert new.edge == "10.0.0.5:27400"
    assert t.report(old, (edge_silent(),), 1.0) is None  # for endpoints it no longer advertises
    assert t.apply((moved,))[0].reason == PENDING
    t.report(new, (), 1.0)
    assert t.apply((moved,)) == (moved,)
    (restarted,) = t.observe((dataclasses.replace(moved, epoch=2),), 2.0)
    assert restarted.epoch == 2


def test_a_node_that_left_is_forgotten_and_judged_afresh_when_it_comes_back() -> None:
    t = tracker()
    (p,) = t.observe((node(),), 0.0)
    t.report(p, (edge_silent(),), 1.0)
    assert t.observe((node(state=NodeState.SUSPECT),), 2.0) == []  # suspect: the verdict stands
    assert t.observe((node(state=NodeState.LEFT),), 3.0) == []
    assert t.deadline() is None and t.apply((node(),)) == (node(),)
    assert len(t.observe((node(),), 4.0)) == 1


def test_the_probe_timeout_grows_with_the_measured_round_trip() -> None:
    assert probe_timeout(3.0, None) == 3.0
    assert probe_timeout(3.0, 150.0) == 3.0
    assert probe_timeout(3.0, 1000.0) == 4.0
    t = tracker()
    t.rtt_ms = {1: 2000.0}
    (p,) = t.observe((node(),), 0.0)
    assert p.timeout_s == 8.0


@pytest.mark.parametrize("cfg", [{"timeout_s": 0.0}, {"retry_s": -1.0}, {"recheck_s": -1.0}, {"tries": 0}])
def test_config_is_checked(cfg: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ReachConfig(**cfg)  # type: ignore[arg-type]


def test_the_submit_refusal_and_the_pool_gate_name_an_unreachable_node() -> None:
    from swactor.orchestrator.planning.dry_run import pool_refusal
    from swactor.orchestrator.planning.pool import Demand, PoolGate

    why = edge_silent().text()
    view = (node(1), dataclasses.replace(node(2, edge="10.0.0.6:17400"), unreachable=why, reason=why))
    refused = pool_refusal(view, Demand(2))
    assert refused.endswith(f"the pool has 1 on 1 Available node(s) (of 2 known); node 2 is unreachable: {why}")
    gate = PoolGate(window_s=0.0)
    gate.observe(view, 0.0)
    assert f"2 is unreachable: {why}" in gate.check(1.0, Demand(2)).detail
    assert f"pinned node 2 is unreachable: {why}" in gate.check(1.0, Demand(1, (2,))).detail
