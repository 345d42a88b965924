"""A run's step and first-token timeouts grow with its token ring's measured round trip: a pool whose hosts are 150 ms
apart must not time out a healthy run that a LAN's constants would. The FSM takes the ring from its plan (the
placement measured it on the orchestrator's Network); it reads no network itself."""

from __future__ import annotations

import itertools

import pytest

from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.planning.placement import Network, place
from swactor.orchestrator.planning.pool import PoolGate
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.run_messages import FIRST_TOKEN_RING_TRIPS, STEP_RING_TRIPS
from swactor.v1 import common_pb2 as pb

from .helpers import model_facts, pool
from .test_placement_network import symmetric

K = pb.LifecycleEventKind
EOS = 2
WAN = symmetric(a1b2=150, a1b3=150, a2b3=150)  # three hosts, 150 ms apart


def test_for_ring_adds_trips_of_the_ring_and_nothing_without_one() -> None:
    base = F.Timeouts(first_token_s=300.0, step_s=60.0)
    assert base.for_ring(0.0) == base and base.for_ring(0.0, prompt_chunks=8) == base
    grown = base.for_ring(450.0, prompt_chunks=3)
    assert grown.step_s == pytest.approx(60.0 + STEP_RING_TRIPS * 0.45)
    assert grown.first_token_s == pytest.approx(300.0 + FIRST_TOKEN_RING_TRIPS * 0.45 * 3)
    assert (grown.pool_s, grown.readiness_s, grown.teardown_s) == (base.pool_s, base.readiness_s, base.teardown_s)


def test_placement_records_the_rings_rtt_unmeasured_hops_as_the_mean() -> None:
    assert place(pool(1, 2, 3), 3, 30, network=Network(1, WAN)).ring_ms == 450.0  # 0 + 150 + 150 + 150
    assert place(pool(1, 2, 3), 3, 30).ring_ms == 0.0  # no network
    assert place(pool(1, 2, 3), 3, 30, network=Network(1)).ring_ms == 0.0  # nothing measured
    partly = {(1, 2): 100.0, (2, 1): 100.0, (2, 3): 200.0}  # 3 -> 1 unmeasured: the mean of 100, 100, 200
    assert place(pool(1, 2, 3), 3, 30, (1, 2, 3), network=Network(1, partly)).ring_ms == pytest.approx(
        100 + 200 + 400 / 3)


def run(network: Network | None, timeouts: F.Timeouts, prompt: tuple[int, ...] = (1, 2, 3),
        prefill_chunk: int = 0) -> tuple[F.RunFsm, list[F.Action]]:
    """A 3-stage run on nodes 1, 2, 3 (the orchestrator on node 1) planned on `network`, driven to RUNNING at t=2."""
    counter = itertools.count(1000)
    req = F.RunRequest(run_id=9, model=model_facts(), prompt_ids=prompt, stages=3, max_tokens=10,
                       sampling=SamplingPolicy(), eog_ids=frozenset({EOS}))
    cfg = F.FsmConfig(orchestrator_node_id=1, timeouts=timeouts, pool_window_s=1.0, prefill_chunk=prefill_chunk)
    seen = PoolGate(1.0)
    seen.network = network
    fsm = F.RunFsm(req, cfg, now=0.0, id_source=lambda: next(counter), pool_view=seen)
    fsm.handle(F.MembershipChanged(pool(1, 2, 3)), 0.0)
    out = fsm.handle(F.Tick(), 1.0)
    for s in fsm.plan.stages:
        fsm.handle(F.StageReady(s.stage_index), 2.0)
    fsm.handle(F.EndpointsReady(), 2.0)
    assert fsm.state is F.RunState.RUNNING
    return fsm, out


def planned(acts: list[F.Action]) -> dict[str, int]:
    return dict(next(a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_PLANNED).counters)


def test_a_ring_of_three_hosts_150_ms_apart_gets_four_rings_more_per_step() -> None:
    fsm, acts = run(Network(1, WAN), F.Timeouts(first_token_s=30.0, step_s=5.0))
    assert [s.node_id for s in fsm.plan.stages] == [1, 2, 3] and fsm.plan.ring_rtt_ms == 450.0
    step = 5.0 + 4 * 0.450
    assert fsm.timeouts.step_s == pytest.approx(step)
    assert fsm.timeouts.first_token_s == pytest.approx(30.0 + 4 * 0.450)  # one prompt object
    assert fsm.config.timeouts.step_s == 5.0  # the configured value stays as it was
    assert planned(acts).items() >= {"ring_rtt_ms": 450, "step_timeout_ms": 6800, "first_token_timeout_ms": 31800}.items()
    assert fsm.deadline() == pytest.approx(2.0 + 30.0 + 1.8)
    fsm.handle(F.TokenReceived(0, 42), 10.0)
    assert fsm.deadline() == pytest.approx(10.0 + step)
    assert fsm.handle(F.Tick(), 10.0 + 5.5) == []  # past the configured 5 s, within the grown step
    faulted = fsm.handle(F.Tick(), 10.0 + step)
    ev = next(a.event for a in faulted if isinstance(a, F.Emit) and a.event.kind == K.RUN_FAULTED)
    assert ev.reason == "RUN_FAULT_STEP_TIMEOUT" and "(6.8s)" in ev.detail


def test_first_token_margin_counts_each_prompt_chunk() -> None:
    fsm, acts = run(Network(1, WAN), F.Timeouts(first_token_s=30.0), prompt=tuple(range(3, 13)), prefill_chunk=4)
    assert fsm.plan.prompt_chunks == 3
    assert fsm.timeouts.first_token_s == pytest.approx(30.0 + 4 * 0.450 * 3)
    assert planned(acts)["first_token_timeout_ms"] == 35400


@pytest.mark.parametrize("network", [None, Network(1)], ids=["no network", "nothing measured"])
def test_with_no_rtt_known_the_configured_timeouts_apply(network: Network | None) -> None:
    timeouts = F.Timeouts(first_token_s=30.0, step_s=5.0)
    fsm, acts = run(network, timeouts)
    assert fsm.timeouts == timeouts and fsm.plan.ring_rtt_ms == 0.0
    assert planned(acts).items() >= {"ring_rtt_ms": 0, "step_timeout_ms": 5000, "first_token_timeout_ms": 30000}.items()
    fsm.handle(F.TokenReceived(0, 42), 10.0)
    assert fsm.deadline() == 15.0
