"""RingTokenEndpoints faults of issue 12 through the real establisher shell (the worker's unit fakes
below it): a lease queued past the pressure timeout, wake eventfds the driver cannot hand over, and a
close that cannot confirm its edges stopped."""

from __future__ import annotations

import asyncio

import pytest

from swactor.edge.wakefd import WakeFdError
from swactor.orchestrator.fleet.fleet import FleetError
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.tokens import token_endpoints
from swactor.v1 import common_pb2 as pb
from tests.worker_service import harness, node_fakes

from .test_token_endpoints import make_plan, wait_for

pytestmark = pytest.mark.timeout(30)


class QueuedForeverArena(node_fakes.FakeArenaPort):
    """The arena keeps every lease queued (pressure) until it is cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = asyncio.Event()

    async def lease(self, request_id, edge_id, direction, ring_spec):  # type: ignore[no-untyped-def]
        self.calls.append(("lease", edge_id))
        await self.cancelled.wait()
        return None  # cancelled

    async def cancel(self, request_id: int) -> None:
        await super().cancel(request_id)
        self.cancelled.set()


class NoWakeFdsDriver(node_fakes.FakeDriverPort):
    async def wake_fds(self, ring_id: int) -> tuple[int, int] | None:
        raise WakeFdError(f"ring {ring_id}: the wake socket refused the connection")


class NeverStoppingDriver(node_fakes.FakeDriverPort):
    async def stop_edge(self, edge_id: int, ring_id: int) -> bool:
        self.calls.append(("stop", edge_id))
        return True  # ...but no PumpStopped ever comes


def run(arena, driver, body, **kw):  # type: ignore[no-untyped-def]
    got: list[F.Input] = []

    async def main():  # type: ignore[no-untyped-def]
        ep = token_endpoints.RingTokenEndpoints(make_plan(), got.append, arena, driver, getattr(arena.arena, "arena", None),
                                                **kw)
        await ep.start()
        return await body(ep, got)

    return asyncio.run(main()), got


def test_a_lease_queued_past_the_pressure_timeout_faults_the_run_by_name() -> None:
    arena = QueuedForeverArena()

    async def body(ep, got):  # type: ignore[no-untyped-def]
        await wait_for(lambda: got, "a fault")
        await asyncio.wait_for(ep.close(), 5)

    _, got = run(arena, node_fakes.FakeDriverPort(), body, lease_timeout_s=0.1)
    (fault,) = got
    assert isinstance(fault, F.EndpointFault) and fault.reason == pb.RUN_FAULT_ARENA_PRESSURE_TIMEOUT
    assert "not granted within 0.1s" in fault.detail
    assert [k for k, _ in arena.calls].count("cancel") == 2  # both queued requests withdrawn


def test_wake_fds_unavailable_is_an_edge_establishment_failure_and_the_edges_tear_down() -> None:
    arena, driver = node_fakes.FakeArenaPort(harness.Arena()), NoWakeFdsDriver()

    async def body(ep, got):  # type: ignore[no-untyped-def]
        await wait_for(lambda: got, "a fault")
        await asyncio.wait_for(ep.close(), 5)

    _, got = run(arena, driver, body)
    assert F.EndpointsReady() not in got
    (fault,) = got
    assert isinstance(fault, F.EndpointFault) and fault.reason == pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED
    assert "wake eventfds unavailable" in fault.detail and "wake socket refused" in fault.detail
    assert sorted(k for k, _ in driver.calls if k == "stop") == ["stop", "stop"]
    assert [k for k, _ in arena.calls].count("release") == 2


def test_a_close_that_cannot_confirm_names_the_edges_left() -> None:
    arena, driver = node_fakes.FakeArenaPort(harness.Arena()), NeverStoppingDriver()

    async def body(ep, got):  # type: ignore[no-untyped-def]
        await wait_for(lambda: F.EndpointsReady() in got, "EndpointsReady")
        with pytest.raises(FleetError) as info:
            await asyncio.wait_for(ep.close(), 5)
        return info.value, ep

    (error, ep), _ = run(arena, driver, body, close_timeout_s=0.1)
    assert error.reason == pb.RUN_FAULT_TEARDOWN_TIMEOUT
    plan = ep.plan
    assert f"token-in edge {plan.token_in.edge_id} (StoppingPump)" in error.detail
    assert f"token-out edge {plan.token_out.edge_id} (StoppingPump)" in error.detail
    assert "not stopped within 0.1s" in error.detail
