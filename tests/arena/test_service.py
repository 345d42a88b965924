"""The real swactor-arena process over its real sockets: leases, queueing, bad input, events."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from swactor.arena.client import (
    NEVER_INSTALLED,
    ArenaCallError,
    AsyncArenaClient,
    Cancelled,
    Leased,
    Queued,
    Rejected,
    connect_holder,
)
from swactor.v1 import arena_pb2, common_pb2

from .conftest import MIB, ArenaProc, start_arena
from .sync_client import ArenaClient

INGRESS = common_pb2.RING_DIRECTION_INGRESS


def spec(capacity: int, alignment: int = 64, **kw: int) -> common_pb2.RingSpec:
    return common_pb2.RingSpec(data_capacity=capacity, alignment=alignment, **kw)


def lease(client: ArenaClient, request_id: int, capacity: int, edge_id: int = 11, **kw: object) -> Leased:
    out = client.lease(
        request_id=request_id,
        requester="test",
        edge_id=edge_id,
        direction=INGRESS,
        ring_spec=spec(capacity),
        **kw,
    )
    assert isinstance(out, Leased), out
    return out


def test_lease_release_round_trip_with_stats_and_events(arena: ArenaProc) -> None:
    with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
        out = lease(client, 1, MIB, edge_id=42)
        assert out.layout.data_capacity == MIB and out.layout.data_offset == out.layout.arena_offset + 256
        st = client.stats()
        assert st.state == arena_pb2.ARENA_STATE_READY
        assert st.ceiling_bytes == arena.ceiling
        assert st.leased_bytes == out.layout.total_len
        assert st.free_bytes == arena.ceiling - out.layout.total_len
        assert st.largest_free_range == st.free_bytes
        (info,) = st.leases
        assert (info.ring_id, info.edge_id, info.requester, info.owner_pid) == (
            out.ring_id,
            42,
            "test",
            os.getpid(),
        )
        assert client.release(out.ring_id) == out.layout.total_len
        st = client.stats()
        assert st.free_bytes == arena.ceiling and st.free_ranges == 1 and not st.leases
    leased = arena.wait_event("ring_leased", ring_id=out.ring_id)
    released = arena.wait_event("ring_released", ring_id=out.ring_id)
    for ev in (leased, released):
        assert ev["edge_id"] == 42 and ev["requester"] == "test" and ev["component"] == "COMPONENT_ARENA"


def test_fresh_ring_header_is_initialised_through_ring_rs(arena: ArenaProc) -> None:
    import swactor_ring

    with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
        out = lease(client, 1, 64 * 1024)
        status = swactor_ring.open_ring(hold.map(), out.ring_layout())
        assert (status.ring_id, status.capacity, status.commit, status.consume) == (
            out.ring_id,
            64 * 1024,
            0,
            0,
        )
        assert status.state == 1  # open


def test_released_pages_go_back_to_the_os(arena: ArenaProc) -> None:
    import swactor_ring

    with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
        out = lease(client, 1, 8 * MIB)
        producer = swactor_ring.Producer(hold.map(), out.ring_layout())
        assert producer.write(b"\xab" * (8 * MIB - 4096)) == 8 * MIB - 4096
        allocated = os.fstat(hold.fd).st_blocks * 512
        assert allocated >= 8 * MIB - 4096
        del producer
        client.release(out.ring_id)
        assert os.fstat(hold.fd).st_blocks * 512 < 64 * 1024  # the hole was punched
        again = lease(client, 2, 8 * MIB)  # the same range, zeroed
        assert again.layout.arena_offset == out.layout.arena_offset
        assert again.ring_id != out.ring_id


def test_queued_leases_are_served_fifo_as_space_frees(arena: ArenaProc) -> None:
    async def scenario() -> None:
        with connect_holder(arena.fd_socket) as hold:
            async with AsyncArenaClient(hold, arena.socket) as client:
                big = await client.lease(
                    request_id=1, requester="t", edge_id=1, direction=INGRESS, ring_spec=spec(48 * MIB)
                )
                assert isinstance(big, Leased)
                async def wait_for(request_id: int, capacity: int) -> Leased:
                    updates = []
                    async for u in client.lease_updates(
                        request_id=request_id,
                        requester="t",
                        edge_id=request_id,
                        direction=INGRESS,
                        ring_spec=spec(capacity),
                    ):
                        updates.append(u)
                    assert isinstance(updates[0], Queued) and isinstance(updates[-1], Leased), updates
                    return updates[-1]

                a = asyncio.create_task(wait_for(2, 20 * MIB))
                await _until_queued(client, 1)
                b = asyncio.create_task(wait_for(3, 4 * MIB))  # would fit now, must not overtake
                await _until_queued(client, 2)
                st = await client.stats()
                assert [q.request_id for q in st.queued] == [2, 3]
                await client.release(big.ring_id)
                la, lb = await asyncio.wait_for(asyncio.gather(a, b), 10)
                assert la.layout.arena_offset + la.layout.total_len <= lb.layout.arena_offset

    asyncio.run(scenario())
    # The grant order is the arena's own (its journal); the two streams may deliver in either order.
    arena.wait_event("ring_leased", request_id=3)
    granted = [e["request_id"] for e in arena.events if e.get("event") == "ring_leased"]
    assert granted == [1, 2, 3]
    queued = arena.wait_event("ring_lease_queued", request_id=2)
    assert queued["ring_id"] == 0 and queued["edge_id"] == 2 and queued["requester"] == "t"


async def _until_queued(client: AsyncArenaClient, n: int) -> None:
    for _ in range(200):
        if len((await client.stats()).queued) == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"queue never reached {n}")


def test_cancel_of_a_queued_lease_ends_its_stream(arena: ArenaProc) -> None:
    async def scenario() -> None:
        with connect_holder(arena.fd_socket) as hold:
            async with AsyncArenaClient(hold, arena.socket) as client:
                full = await client.lease(
                    request_id=1, requester="t", edge_id=1, direction=INGRESS, ring_spec=spec(60 * MIB)
                )
                assert isinstance(full, Leased)
                waiting = asyncio.create_task(
                    client.lease(
                        request_id=2, requester="t", edge_id=2, direction=INGRESS, ring_spec=spec(8 * MIB)
                    )
                )
                await _until_queued(client, 1)
                await client.cancel(2)
                assert await asyncio.wait_for(waiting, 10) == Cancelled(2, arena_pb2.LEASE_CANCEL_CANCEL_LEASE)
                with pytest.raises(ArenaCallError) as e:
                    await client.cancel(2)
                assert e.value.code is grpc.StatusCode.FAILED_PRECONDITION
                with pytest.raises(ArenaCallError) as e:
                    await client.cancel(12345)
                assert e.value.code is grpc.StatusCode.NOT_FOUND and "request_id" in e.value.message
                # queue timeout: CancelLease sent by the client itself
                out = await client.lease(
                    request_id=3,
                    requester="t",
                    edge_id=3,
                    direction=INGRESS,
                    ring_spec=spec(8 * MIB),
                    queue_timeout_s=0.2,
                )
                assert out == Cancelled(3, arena_pb2.LEASE_CANCEL_CANCEL_LEASE)
                # a caller that walks away from its stream: the request leaves the queue
                updates = client.lease_updates(
                    request_id=4, requester="t", edge_id=4, direction=INGRESS, ring_spec=spec(8 * MIB)
                )
                assert isinstance(await anext(updates), Queued)
                await updates.aclose()
                for _ in range(200):
                    if not (await client.stats()).queued:
                        break
                    await asyncio.sleep(0.01)
                assert not (await client.stats()).queued

    asyncio.run(scenario())
    ev = arena.wait_event("ring_lease_cancelled", request_id=4)
    assert ev["reason"] == "LEASE_CANCEL_STREAM_CLOSED"


def test_never_fitting_lease_is_rejected(arena: ArenaProc) -> None:
    with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
        out = client.lease(
            request_id=1, requester="t", edge_id=9, direction=INGRESS, ring_spec=spec(64 * MIB)
        )
        assert isinstance(out, Rejected) and out.reason == arena_pb2.LEASE_REJECT_EXCEEDS_CEILING
        assert str(64 * MIB) in out.detail
        assert not client.stats().queued
    ev = arena.wait_event("ring_lease_rejected", request_id=1)
    assert (ev["ring_id"], ev["edge_id"], ev["requester"], ev["reason"]) == (
        0,
        9,
        "t",
        "LEASE_REJECT_EXCEEDS_CEILING",
    )


BAD = [
    (dict(ring_spec=spec(0)), grpc.StatusCode.INVALID_ARGUMENT, "ring_spec.data_capacity"),
    (dict(ring_spec=spec(1 << 60)), grpc.StatusCode.INVALID_ARGUMENT, "ring_spec.data_capacity"),
    (dict(ring_spec=spec(4096, alignment=3)), grpc.StatusCode.INVALID_ARGUMENT, "ring_spec.alignment"),
    (dict(ring_spec=spec(4096, alignment=0)), grpc.StatusCode.INVALID_ARGUMENT, "ring_spec.alignment"),
    (dict(ring_spec=spec(100)), grpc.StatusCode.INVALID_ARGUMENT, "ring_spec.data_capacity"),
    (dict(direction=0), grpc.StatusCode.INVALID_ARGUMENT, "direction"),
    (dict(requester=""), grpc.StatusCode.INVALID_ARGUMENT, "requester"),
    (dict(request_id=0), grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
    (dict(request_id=1), grpc.StatusCode.ALREADY_EXISTS, "request_id"),
]


def test_bad_input_gets_a_status_naming_the_field_and_changes_nothing(arena: ArenaProc) -> None:
    with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
        live = lease(client, 1, MIB)
        attacher = connect_holder(arena.fd_socket)
        with ArenaClient(attacher, arena.socket) as other:
            other.attach(live.ring_id, arena_pb2.ATTACH_ROLE_WORKER_RING)
            before = client.stats()
            for overrides, code, field in BAD:
                args: dict = dict(
                    request_id=99, requester="t", edge_id=1, direction=INGRESS, ring_spec=spec(4096)
                )
                args.update(overrides)
                with pytest.raises(ArenaCallError) as e:
                    client.lease(**args)
                assert (e.value.code, e.value.message.split(":")[0]) == (code, field), e.value
            calls = [
                (lambda: client.release(777), grpc.StatusCode.NOT_FOUND, "ring_id"),
                (lambda: client.release(live.ring_id, proof=0), grpc.StatusCode.INVALID_ARGUMENT, "proof"),
                # still attached by the other holder: no release before its detach proof
                (lambda: client.release(live.ring_id), grpc.StatusCode.FAILED_PRECONDITION, "ring_id"),
                (lambda: other.release(live.ring_id), grpc.StatusCode.FAILED_PRECONDITION, "holder_id"),
                (lambda: client.cancel(555), grpc.StatusCode.NOT_FOUND, "request_id"),
                (lambda: client.cancel(1), grpc.StatusCode.FAILED_PRECONDITION, "request_id"),
                (lambda: other.detach(live.ring_id, 0), grpc.StatusCode.INVALID_ARGUMENT, "proof"),
                (lambda: client.attach(live.ring_id, 42), grpc.StatusCode.INVALID_ARGUMENT, "role"),
            ]
            for call, code, field in calls:
                with pytest.raises(ArenaCallError) as e:
                    call()
                assert (e.value.code, e.value.message.split(":")[0]) == (code, field), e.value
            assert client.stats() == before  # the service kept serving, table unchanged
            # the owner may hand the release over to the last detach instead of retrying
            assert client.release(live.ring_id, when_detached=True) == 0
            assert not client.stats().leases[0].owner_holds
            assert other.detach(live.ring_id, arena_pb2.DETACH_PROOF_RING_QUIESCED) is True
            assert not client.stats().leases
            with pytest.raises(ArenaCallError) as e:
                client.release(live.ring_id)
            assert (
                e.value.code is grpc.StatusCode.FAILED_PRECONDITION and "already released" in e.value.message
            )
        attacher.close()
    assert arena.proc.poll() is None


def test_shutdown_rejects_new_and_queued_leases_but_release_works(arena: ArenaProc) -> None:
    async def scenario() -> None:
        with connect_holder(arena.fd_socket) as hold:
            async with AsyncArenaClient(hold, arena.socket) as client:
                full = await client.lease(
                    request_id=1, requester="t", edge_id=1, direction=INGRESS, ring_spec=spec(60 * MIB)
                )
                assert isinstance(full, Leased)
                waiting = asyncio.create_task(
                    client.lease(
                        request_id=2, requester="t", edge_id=2, direction=INGRESS, ring_spec=spec(8 * MIB)
                    )
                )
                await _until_queued(client, 1)
                with ArenaClient(hold, arena.socket) as sync:
                    assert sync.shutdown().state == arena_pb2.ARENA_STATE_SHUTTING_DOWN
                out = await asyncio.wait_for(waiting, 10)
                assert isinstance(out, Rejected) and out.reason == arena_pb2.LEASE_REJECT_SHUTTING_DOWN
                out = await client.lease(
                    request_id=3, requester="t", edge_id=3, direction=INGRESS, ring_spec=spec(MIB)
                )
                assert isinstance(out, Rejected) and out.reason == arena_pb2.LEASE_REJECT_SHUTTING_DOWN
                assert await client.release(full.ring_id, NEVER_INSTALLED) > 0
                assert (await client.stats()).state == arena_pb2.ARENA_STATE_SHUTTING_DOWN

    asyncio.run(scenario())
    arena.wait_event("arena_state_changed", new="shutting_down")


def test_ring_ids_are_never_reused_across_restarts(short_dir: Path) -> None:
    seen: list[int] = []
    for _ in range(2):
        a = start_arena(short_dir)
        try:
            with connect_holder(a.fd_socket) as hold, ArenaClient(hold, a.socket) as client:
                for i in range(3):
                    out = lease(client, 100 + i, MIB)
                    client.release(out.ring_id)
                    seen.append(out.ring_id)
        finally:
            assert a.stop() == 0
    assert len(set(seen)) == 6 and seen == sorted(seen)


def test_second_arena_on_the_same_state_dir_fails_to_boot(arena: ArenaProc) -> None:
    import subprocess
    import sys

    other = subprocess.run(
        [
            sys.executable,
            "-m",
            "swactor.arena.main",
            "--config",
            str(arena.dir / "swactor.toml"),
            "--socket",
            str(arena.dir / "b.sock"),
            "--fd-socket",
            str(arena.dir / "bf.sock"),
            "--state-dir",
            str(arena.state_dir),
            "--ceiling-bytes",
            str(arena.ceiling),
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert other.returncode == 1
    assert b"arena_boot_failed" in other.stderr and b"locked by another swactor-arena" in other.stderr


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [("--ceiling-bytes", "1000", "ceiling_bytes"), ("--ceiling-bytes", str(1 << 62), str(1 << 62))],
)
def test_boot_failure_exits_without_ready(short_dir: Path, flag: str, value: str, needle: str) -> None:
    import subprocess
    import sys

    (short_dir / "c.toml").write_text("")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swactor.arena.main",
            "--config",
            str(short_dir / "c.toml"),
            "--socket",
            str(short_dir / "a.sock"),
            "--fd-socket",
            str(short_dir / "f.sock"),
            "--state-dir",
            str(short_dir / "s"),
            flag,
            value,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert b"arena_boot_failed" in proc.stderr and needle.encode() in proc.stderr
    assert b"arena_ready" not in proc.stderr
    assert not (short_dir / "a.sock").exists()


def test_bad_config_key_is_named(short_dir: Path) -> None:
    import subprocess
    import sys

    (short_dir / "c.toml").write_text("[arena]\nceiling = 5\n")
    proc = subprocess.run(
        [sys.executable, "-m", "swactor.arena.main", "--config", str(short_dir / "c.toml")],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and b"ceiling" in proc.stderr and b"Traceback" not in proc.stderr
