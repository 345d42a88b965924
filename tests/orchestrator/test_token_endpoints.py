"""RingTokenEndpoints: both token edges through the worker's EdgeEstablisher core with this process
as ring host, over real ring-rs rings in a memfd arena. The arena-manager and edge-driver ports are
the worker's unit fakes (rings from a real memfd arena; edges ready at once, pumps stop on request);
the test plays stage 0 and the last stage on the other end of the rings."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

import swactor_ring as sr
from swactor.common import ringport
from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.fleet.fleet import FleetError
from swactor.orchestrator.planning.planner import plan_run
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.tokens import token_endpoints, token_rings
from swactor.v1 import arena_pb2
from swactor.v1 import common_pb2 as pb
from tests.worker_service import harness, node_fakes

from .helpers import model_facts, node

pytestmark = pytest.mark.timeout(30)


def read(cons: ringport.ConsumerEnd, max_bytes: int) -> bytes:
    """Up to `max_bytes` committed bytes, consumed (stage 0's side of the token-in ring)."""
    data = bytes(cons.readable(max_bytes))
    cons.advance_consume(len(data))
    return data


def make_plan():
    ids = itertools.count(700)
    return plan_run(run_id=3, model=model_facts(), pool=(node(1), node(2)), stages=2, max_tokens=8, prompt_tokens=4,
                    sampling=SamplingPolicy(), orchestrator_node_id=9, id_source=lambda: next(ids))


async def wait_for(pred, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def test_token_edges_lease_install_establish_carry_tokens_and_tear_down_in_order() -> None:
    arena = harness.Arena()
    arena_port, driver = node_fakes.FakeArenaPort(arena), node_fakes.FakeDriverPort()
    plan = make_plan()
    got: list[F.Input] = []

    async def connect():
        return arena_port, driver, arena.arena

    async def main():
        factory = token_endpoints.RingEndpointFactory(connect)
        ep = await factory.open(plan, got.append)
        await wait_for(lambda: F.EndpointsReady() in got, "EndpointsReady")
        tin = ep.edges.core.records[plan.token_in.edge_id]
        tout = ep.edges.core.records[plan.token_out.edge_id]
        assert tin.layout.data_capacity >= plan.token_in.ring_data_capacity
        # the far ends, sharing the orchestrator handles' eventfds (the driver's pumps in production)
        orch_in, orch_out = ep._ends[tin.ring_id], ep._ends[tout.ring_id]
        stage0 = ringport.open_consumer(arena.arena, tin.layout, readable_fd=orch_in.readable_fd,
                                        writable_fd=orch_in.writable_fd)
        last = ringport.open_producer(arena.arena, tout.layout, readable_fd=orch_out.readable_fd,
                                      writable_fd=orch_out.writable_fd)
        last_writer = token_rings.TokenWriter(last, plan.token_out.object_spec)

        await ep.inject(0, [1, 2, 3, 4])
        header = sr.ObjectHeader.parse(read(stage0, sr.OBJECT_HEADER_LEN), 2**64 - 1, 1)
        assert (header.sequence, header.extent) == (0, 16)
        assert np.frombuffer(read(stage0, 16), dtype="<i4").tolist() == [1, 2, 3, 4]
        await last_writer.write(0, [42])
        await wait_for(lambda: F.TokenReceived(0, 42) in got, "token 0")
        await ep.inject(1, [42])
        assert sr.ObjectHeader.parse(read(stage0, sr.OBJECT_HEADER_LEN), 2**64 - 1, 1).sequence == 1
        await last_writer.write(1, [43])
        await wait_for(lambda: F.TokenReceived(1, 43) in got, "token 1")
        await asyncio.wait_for(ep.close(), 5)
        return ep

    ep = asyncio.run(main())
    rings = {r.ring_id for r in ep.edges.core.records.values()}
    kinds = [k for k, _ in arena_port.calls]
    assert kinds.count("lease") == 2 and kinds.count("attach") == 2 and kinds.count("release") == 2
    assert {r for k, r in arena_port.calls if k == "release"} == rings
    assert sorted(k for k, _ in driver.calls) == ["recv", "send", "stop", "stop"]
    assert all(r.state.name == "STOPPED" for r in ep.edges.core.records.values())
    assert not [g for g in got if isinstance(g, F.EndpointFault)]
    assert ep._ends == {}  # both ring handles closed before the leases were released


class RejectingArena(node_fakes.FakeArenaPort):
    async def lease(self, request_id, edge_id, direction, ring_spec):
        from swactor.edgeend.establisher import RingLeaseRejected

        self.calls.append(("lease", edge_id))
        return RingLeaseRejected(request_id, arena_pb2.LEASE_REJECT_EXCEEDS_CEILING,
                                 "ring of 4 MiB exceeds the 1 MiB ceiling")


def test_lease_rejection_is_an_endpoint_fault_by_name() -> None:
    got: list[F.Input] = []

    async def connect():
        return RejectingArena(), node_fakes.FakeDriverPort(), None

    async def main():
        ep = await token_endpoints.RingEndpointFactory(connect).open(make_plan(), got.append)
        await wait_for(lambda: got, "a fault")
        await asyncio.wait_for(ep.close(), 5)

    asyncio.run(main())
    (fault,) = got
    assert isinstance(fault, F.EndpointFault) and fault.reason == pb.RUN_FAULT_RING_REQUEST_OVERSIZED
    assert "LEASE_REJECT_EXCEEDS_CEILING" in fault.detail and "token-" in fault.detail


class LateGrantArena(node_fakes.FakeArenaPort):
    """The arena grants each lease only after the test allows it (a grant racing CancelLease)."""

    def __init__(self) -> None:
        super().__init__()
        self.grant = asyncio.Event()

    async def lease(self, request_id, edge_id, direction, ring_spec):
        await self.grant.wait()
        return await super().lease(request_id, edge_id, direction, ring_spec)

    async def release(self, ring_id: int, never_installed: bool) -> None:
        self.calls.append(("release-never-installed" if never_installed else "release", ring_id))


def test_close_while_leases_are_in_flight_releases_the_late_grants() -> None:
    # Seen on a local pool: a run refused at provisioning closed its endpoints while the arena was
    # granting their leases; the grants were cancelled away with close()'s tasks and stayed leased.
    arena = LateGrantArena()

    async def connect():
        return arena, node_fakes.FakeDriverPort(), None

    async def main():
        ep = await token_endpoints.RingEndpointFactory(connect).open(make_plan(), lambda inp: None)
        closing = asyncio.ensure_future(ep.close())
        await wait_for(lambda: sum(c[0] == "cancel" for c in arena.calls) == 2, "both CancelLease calls")
        arena.grant.set()  # too late to cancel: the arena answers with the leases
        await asyncio.wait_for(closing, 5)

    asyncio.run(main())
    assert sorted(c[0] for c in arena.calls if c[0].startswith("release")) == ["release-never-installed"] * 2


def test_unreachable_local_services_refuse_by_name() -> None:
    async def connect():
        raise ConnectionRefusedError("/run/swactor/arena-fd.sock")

    async def main():
        with pytest.raises(FleetError) as err:
            await token_endpoints.RingEndpointFactory(connect).open(make_plan(), lambda inp: None)
        return err.value

    err = asyncio.run(main())
    assert err.reason == pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED and "arena-fd.sock" in err.detail


def test_factory_connects_again_after_the_arena_is_lost() -> None:
    arena = harness.Arena()
    made: list[int] = []

    async def connect():
        made.append(1)
        return node_fakes.FakeArenaPort(arena), node_fakes.FakeDriverPort(), arena.arena

    async def main():
        factory = token_endpoints.RingEndpointFactory(connect)
        for forget in (False, True, False):
            if forget:
                factory.forget("arena-manager (pid 9) closed the hand-out connection")
            ep = await factory.open(make_plan(), lambda inp: None)
            await ep.close()
        assert len(made) == 2  # once at first use, once after the arena was lost

    asyncio.run(main())
