"""A host's own figures (worker/host_metrics.py, StageControl.GetHostMetrics): completed steps counted per stage
index, the local services asked at call time, and one that does not answer named instead of failing the call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swactor.v1 import arena_pb2, edge_pb2, stage_pb2
from swactor.worker.host_metrics import HostSources, StepTotals, host_metrics
from swactor.worker.node import StageNode
from swactor.worker.stage_scheduler import StepScheduler

from .node_fakes import FakeCtl
from .test_runs_in_flight_node import complete, loaded, out_edges, run_plan, steps
from .test_service import serve, settle, stub, updates

pytestmark = pytest.mark.timeout(60)


def test_step_totals_add_per_stage_index() -> None:
    t = StepTotals()
    t.completed(1, 0.25)
    t.completed(1, 0.5)
    t.completed(0, 0.125)
    t.completed(0, -1.0)  # a clock that went back counts as no time, not negative
    assert [(p.stage_index, p.count, p.seconds) for p in t.protos()] == [(0, 2, 0.125), (1, 2, 0.75)]


def test_a_dispatch_carries_when_it_was_sent() -> None:
    from .test_stage_scheduler import asked

    s = StepScheduler()
    s.ask(asked(1))
    d = s.next(now=12.5)
    assert d is not None and d.sent_at == 12.5


def sources(arena: Any, edge: Any, steps: StepTotals | None = None) -> HostSources:
    return HostSources(node_id=5, arena_stats=arena, driver_status=edge, weights_received=lambda: 4096,
                       steps=steps or StepTotals())


def test_every_figure_when_the_local_services_answer() -> None:
    async def arena() -> arena_pb2.ArenaStats:
        return arena_pb2.ArenaStats(ceiling_bytes=1 << 30, leased_bytes=1 << 20, free_bytes=(1 << 30) - (1 << 20),
                                    leases=[arena_pb2.ArenaLeaseInfo(ring_id=1), arena_pb2.ArenaLeaseInfo(ring_id=2)])

    async def edge() -> edge_pb2.EdgeDriverStatus:
        return edge_pb2.EdgeDriverStatus(traffic=[edge_pb2.PeerTraffic(peer_node_id=6, sent_bytes=100, lost_packets=1)])

    steps = StepTotals()
    steps.completed(0, 0.5)
    m = asyncio.run(host_metrics(sources(arena, edge, steps)))
    assert m.node_id == 5 and not m.errors
    assert (m.arena.ceiling_bytes, m.arena.leased_bytes, m.arena.leases) == (1 << 30, 1 << 20, 2)
    assert [(t.peer_node_id, t.sent_bytes, t.lost_packets) for t in m.traffic] == [(6, 100, 1)]
    assert m.weights_fetched_bytes == 4096 and [(s.stage_index, s.count) for s in m.steps] == [(0, 1)]


def test_a_local_service_down_or_silent_is_named_and_the_rest_reported() -> None:
    async def arena_down() -> arena_pb2.ArenaStats:
        raise ConnectionRefusedError("arena.sock")

    async def edge_silent() -> edge_pb2.EdgeDriverStatus:
        await asyncio.sleep(30)
        raise AssertionError("not reached")

    m = asyncio.run(host_metrics(sources(arena_down, edge_silent), timeout_s=0.05))
    assert not m.HasField("arena") and not m.traffic
    assert m.errors[0].startswith("arena: ConnectionRefusedError") and m.errors[1] == "edge: no answer within 0.05 s"
    assert m.weights_fetched_bytes == 4096


def test_completed_steps_are_counted_and_reported_over_stage_control() -> None:
    ctl = FakeCtl()

    async def body(port: int, node: StageNode, _membership: Any) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(run_plan(71, stage_index=1))
            await updates(s, 71, "ready")
            assert not (await s.GetHostMetrics(stage_pb2.GetHostMetricsRequest())).steps
            node._on_worker(loaded(node, 71, 0, 1))
            (step,) = steps(ctl)
            complete(node, step, out_edges(node, 71))
            m = await s.GetHostMetrics(stage_pb2.GetHostMetricsRequest())
            assert [(p.stage_index, p.count) for p in m.steps] == [(1, 1)] and m.steps[0].seconds >= 0

    asyncio.run(serve(body, ctl=ctl))
