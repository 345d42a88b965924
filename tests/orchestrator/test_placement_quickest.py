"""Which hosts, and how many stages, by predicted time per token (issue 22 item 4): a token costs the stages' compute
one after another plus each hop one way; the fastest measured hosts replace the ring's choice, and more stages than the
fewest that fit replace the fewest, only when predicted at most a third as long (QUICKER_SHARE). Pure: tables of nodes."""

from __future__ import annotations

import dataclasses

import pytest

from swactor.cli.render import plan_lines
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.planning.dry_run import plan_response
from swactor.orchestrator.planning.placement import QUICKER_SHARE, Network, place, stage_count
from swactor.orchestrator.planning.pool import Demand, PoolStatus

from .test_placement import SMOL, GiB, need
from .test_placement_network import ids, symmetric
from .test_placement_speed import hosts

ONE = need(SMOL).stage(0, 30).total  # the whole model on one stage
HALF = max(need(SMOL).stage(0, 15).total, need(SMOL).stage(15, 30).total)
WORK = need(SMOL).compute_layers(0, 30)  # a token's decode work in layers: the 30 blocks and the head (~42)


def with_memory(pool: tuple[NodeInfo, ...], **memory: int) -> tuple[NodeInfo, ...]:
    """Node k's memory as n<k>=bytes."""
    return tuple(dataclasses.replace(n, memory_bytes=memory.get(f"n{n.node_id}", n.memory_bytes)) for n in pool)


def test_a_host_many_times_faster_takes_the_run_from_the_orchestrators_slow_host() -> None:
    """Node 1, the orchestrator's host, is a CPU box (2 ms a layer); node 2, 1 ms away, a GPU host (0.1 ms): one stage
    on node 2 is predicted 4.2 + 1 ms a token against 84 on node 1. Without measured speeds the ring's choice stays."""
    net = Network(1, symmetric(a1b2=1))
    p = place(hosts(2.0, 0.1), 1, 30, memory=need(SMOL), network=net)
    assert ids(p) == [2] and p.predicted_ms_per_token() == pytest.approx(0.1 * WORK + 1)
    assert ids(place(hosts(2.0, 0.0), 1, 30, memory=need(SMOL), network=net)) == [1]  # node 2 not measured yet
    assert ids(place(hosts(0.0, 0.1), 1, 30, memory=need(SMOL), network=net)) == [1]  # nothing to compare it with
    assert stage_count(hosts(2.0, 0.1), 30, need(SMOL), net) == 1


@pytest.mark.parametrize("speeds", [(2.0, 1.0), (1.76, 0.87), (1.5, 0.6)])
def test_hosts_of_one_kind_measured_apart_by_noise_keep_the_rings_choice(speeds: tuple[float, float]) -> None:
    """2x apart (one host of tests/e2e/test_slow_host.py measured 0.87 and 1.76 ms a layer in two runs), even 2.5x:
    the faster host is predicted at more than QUICKER_SHARE of the time, so the run stays where the ring puts it (no
    reload for a figure noise gives)."""
    net = Network(1, symmetric(a1b2=1))
    p = place(hosts(*speeds), 1, 30, memory=need(SMOL), network=net)
    assert ids(p) == [1]
    assert stage_count(hosts(*speeds), 30, need(SMOL), net) == 1


def test_a_far_fast_host_is_not_worth_its_hops() -> None:
    """10x faster but 150 ms away: 8.4 + 150 ms a token against 84 on the orchestrator's host."""
    net = Network(1, symmetric(a1b2=150))
    assert ids(place(hosts(2.0, 0.2), 1, 30, memory=need(SMOL), network=net)) == [1]


def test_more_stages_when_the_fast_hosts_hold_the_model_only_together() -> None:
    """Node 1 (the orchestrator's, slow) holds the whole model; nodes 2 and 3 (fast, 1 ms from it and each other)
    each hold half: one stage is the fewest that fit (84 ms a token), two on the fast hosts are predicted 4.2 + 1.5 ms
    (three 1 ms hops, one way each)."""
    pair = {"n1": 64 * GiB, "n2": (HALF + ONE) // 2, "n3": (HALF + ONE) // 2}
    net = Network(1, symmetric(a1b2=1, a1b3=1, a2b3=1))
    pool = with_memory(hosts(2.0, 0.1, 0.1), **pair)
    assert stage_count(pool, 30, need(SMOL), net) == 2
    p = place(pool, 2, 30, memory=need(SMOL), network=net)
    assert sorted(ids(p)) == [2, 3] and p.predicted_ms_per_token() == pytest.approx(0.1 * WORK + 1.5)
    # 0.3 ms a layer: 12.6 + 1.5 ms, under a third of 84: still taken
    assert stage_count(with_memory(hosts(2.0, 0.3, 0.3), **pair), 30, need(SMOL), net) == 2
    # 0.8 ms a layer: 33.6 + 1.5 ms, more than QUICKER_SHARE of 84: the one stage stays
    assert 0.8 * WORK + 1.5 > QUICKER_SHARE * 2.0 * WORK
    assert stage_count(with_memory(hosts(2.0, 0.8, 0.8), **pair), 30, need(SMOL), net) == 1
    assert stage_count(pool, 30, need(SMOL), None) == 1  # no network: the fewest that fit, as before


def test_the_operator_who_keeps_the_memory_split_keeps_the_rings_hosts() -> None:
    """[orchestrator].split_by_speed = false: measured speeds move nothing, neither blocks nor hosts."""
    net = Network(1, symmetric(a1b2=1), by_speed=False)
    assert ids(place(hosts(2.0, 0.1), 1, 30, memory=need(SMOL), network=net)) == [1]


def test_pins_and_a_requested_stage_count_are_kept() -> None:
    net = Network(1, symmetric(a1b2=1, a1b3=1, a2b3=1))
    pool = hosts(2.0, 0.1, 0.1)
    assert ids(place(pool, 1, 30, (1,), need(SMOL), net)) == [1]
    assert len(place(pool, 3, 30, memory=need(SMOL), network=net).nodes) == 3


def test_the_dry_run_prints_the_predicted_time_per_token() -> None:
    net = Network(1, symmetric(a1b2=1))
    pool = hosts(2.0, 0.1)
    resp = plan_response("smol", pool, Demand(1, (), 30, need(SMOL)), PoolStatus(True, "ready"), prompt_tokens=4,
                         max_seq_len=4096, network=net)
    assert [s.node_id for s in resp.placement] == [2]
    assert resp.compute_ms_per_token == pytest.approx(0.1 * WORK) and resp.network_ms_per_token == pytest.approx(1.0)
    assert resp.predicted_ms_per_token == pytest.approx(0.1 * WORK + 1)  # the figure the planner chose node 2 by
    assert any(f"with the hops, {0.1 * WORK + 1:.1f} ms predicted a token" in line for line in plan_lines(resp)), \
        plan_lines(resp)


def test_the_dry_run_prints_no_total_while_a_hop_is_not_measured() -> None:
    """predicted_ms_per_token counts an unmeasured hop as the mean of the measured ones (none here: 0); the line
    prints the total only when every hop of the ring was measured (network_ms_per_token)."""
    resp = plan_response("smol", hosts(2.0, 0.1), Demand(1, (), 30, need(SMOL)), PoolStatus(True, "ready"),
                         prompt_tokens=4, max_seq_len=4096, network=Network(1, {}))
    assert resp.HasField("predicted_ms_per_token") and not resp.HasField("network_ms_per_token")
    assert not any("with the hops" in line for line in plan_lines(resp)), plan_lines(resp)
