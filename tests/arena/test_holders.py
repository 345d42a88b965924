"""Second processes: fd hand-out over SCM_RIGHTS, SO_PEERCRED refusal, and holder death (§38)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import swactor_ring
from swactor.arena.client import AsyncArenaClient, Leased, connect_holder
from swactor.v1 import arena_pb2, common_pb2
from tests.arena.sync_client import ArenaClient

from .conftest import MIB, ArenaProc

CHILD = Path(__file__).with_name("holder_child.py")


def child(arena: ArenaProc, *args: object, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), args[0], str(arena.fd_socket), str(arena.socket), *map(str, args[1:])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[arg-type]
    )


def lease(client: ArenaClient, request_id: int, capacity: int, direction: int) -> Leased:
    out = client.lease(
        request_id=request_id,
        requester="test",
        edge_id=request_id,
        direction=direction,
        ring_spec=common_pb2.RingSpec(data_capacity=capacity, alignment=64),
    )
    assert isinstance(out, Leased), out
    return out


def test_second_process_maps_the_fd_and_both_see_each_others_bytes(arena: ArenaProc) -> None:
    with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
        to_child = lease(client, 1, 64 * 1024, common_pb2.RING_DIRECTION_EGRESS)
        from_child = lease(client, 2, 64 * 1024, common_pb2.RING_DIRECTION_INGRESS)
        mapped = hold.map()
        producer = swactor_ring.Producer(mapped, to_child.ring_layout())
        consumer = swactor_ring.Consumer(mapped, from_child.ring_layout())
        proc = child(arena, "pingpong", to_child.ring_id, from_child.ring_id)
        producer.write(b"ping from %d\n" % os.getpid())
        out, _ = proc.communicate(timeout=30)
        assert out.strip() == "done" and proc.returncode == 0
        buf = bytearray(256)
        n = consumer.read_into(buf)
        assert bytes(buf[:n]) == b"pong from %d after ping from %d\n" % (proc.pid, os.getpid())
        # the child detached with proofs: the owner may release both
        del producer, consumer
        client.release(to_child.ring_id)
        client.release(from_child.ring_id)
        assert client.stats().free_bytes == arena.ceiling
    detached = arena.wait_event("ring_detached", ring_id=to_child.ring_id)
    assert detached["proof"] == "DETACH_PROOF_RING_QUIESCED"


def test_peer_outside_root_and_swactor_group_is_refused(arena: ArenaProc) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run a peer as another uid")
    os.chmod(arena.dir, 0o755)  # let uid 65534 reach the socket; SO_PEERCRED must still refuse it
    proc = child(arena, "connect-as", 65534)
    out, _ = proc.communicate(timeout=30)
    assert out.startswith("denied") and "uid 65534" in out, out
    ev = arena.wait_event("arena_holder_denied")
    assert ev["uid"] == 65534 and ev["pid"] == proc.pid
    with connect_holder(arena.fd_socket) as hold:  # root still gets it
        assert hold.holder_id and hold.arena_len == arena.ceiling


def _start_holder(arena: ArenaProc, capacity: int) -> tuple[subprocess.Popen[str], int, int]:
    proc = child(arena, "lease", capacity)
    assert proc.stdout is not None
    word, ring_id, holder_id = proc.stdout.readline().split()
    assert word == "ring"
    return proc, int(ring_id), int(holder_id)


def test_killed_holder_ranges_become_reusable_and_never_before_it_is_gone(arena: ArenaProc) -> None:
    proc, ring_id, holder_id = _start_holder(arena, 60 * MIB)
    assert proc.stdin is not None and proc.stdout is not None

    async def scenario() -> None:
        with connect_holder(arena.fd_socket) as hold:
            async with AsyncArenaClient(hold, arena.socket) as client:
                waiting = asyncio.create_task(
                    client.lease(
                        request_id=1,
                        requester="test",
                        edge_id=5,
                        direction=common_pb2.RING_DIRECTION_INGRESS,
                        ring_spec=common_pb2.RingSpec(data_capacity=32 * MIB, alignment=64),
                    )
                )
                while not (await client.stats()).queued:
                    await asyncio.sleep(0.01)
                # 1. the holder closes its connection but lives on (and still maps the ring)
                proc.stdin.write("close\n")
                proc.stdin.flush()
                assert proc.stdout.readline().strip() == "closed"
                await asyncio.to_thread(arena.wait_event, "arena_holder_disconnected", holder_id=holder_id)
                st = await client.stats()
                (info,) = st.leases
                assert (
                    info.ring_id == ring_id
                    and info.owner_holds
                    and list(info.attached_holder_ids) == [holder_id]
                )
                assert [q.request_id for q in st.queued] == [1] and not waiting.done()
                # 2. SIGKILL: the process is gone, so its range is reclaimed and the queue served
                os.kill(proc.pid, signal.SIGKILL)
                out = await asyncio.wait_for(waiting, 10)
                assert isinstance(out, Leased)
                assert out.layout.arena_offset == info.layout.arena_offset
                assert (await client.release(out.ring_id)) > 0

    try:
        asyncio.run(scenario())
    finally:
        proc.kill()
        proc.wait()
    gone = arena.wait_event("arena_holder_gone", holder_id=holder_id)
    assert gone["pid"] == proc.pid
    reclaimed = arena.wait_event("ring_reclaimed", ring_id=ring_id)
    assert reclaimed["cause"] == "HOLDER_EXITED" and reclaimed["edge_id"] == 77
    assert reclaimed["requester"] == "holder-child"


def test_holder_is_not_gone_while_a_forked_child_keeps_its_connection(arena: ArenaProc) -> None:
    proc, ring_id, holder_id = _start_holder(arena, MIB)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("fork\n")
    proc.stdin.flush()
    word, grandchild = proc.stdout.readline().split()
    assert word == "forked"
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        arena.wait_event("arena_holder_exited_connection_open", holder_id=holder_id)
        with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
            (info,) = client.stats().leases
            assert info.ring_id == ring_id and info.owner_holds  # the fork still maps it
            os.kill(int(grandchild), signal.SIGKILL)
            arena.wait_event("ring_reclaimed", ring_id=ring_id)
            assert not client.stats().leases
    finally:
        _kill_quietly(int(grandchild))


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # reparented to init or to us; wait until it is gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def test_attach_returns_the_layout_and_draining_refuses_new_attachments(arena: ArenaProc) -> None:
    proc, ring_id, holder_id = _start_holder(arena, MIB)
    try:
        with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
            layout = client.attach(ring_id, arena_pb2.ATTACH_ROLE_WORKER_RING)
            assert layout.ring_id == ring_id and layout.data_capacity == MIB
            os.kill(proc.pid, signal.SIGKILL)  # owner gone, we are still attached: draining
            arena.wait_event("arena_holder_gone", holder_id=holder_id)
            (info,) = client.stats().leases
            assert not info.owner_holds and list(info.attached_holder_ids) == [hold.holder_id]
            assert client.detach(ring_id, arena_pb2.DETACH_PROOF_RING_QUIESCED) is True
            assert not client.stats().leases
    finally:
        proc.kill()
        proc.wait()


def test_child_given_the_connection_keeps_the_holders_ranges_after_the_parent_dies(arena: ArenaProc) -> None:
    """A parent passing memfd + hand-out connection to a child (like the gpu-worker's compute process)."""
    code = (
        "import os, subprocess, sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from swactor.arena.client import connect_holder\n"
        "from tests.arena.sync_client import ArenaClient\n"
        "from swactor.v1 import common_pb2\n"
        f"hold = connect_holder({str(arena.fd_socket)!r})\n"
        f"client = ArenaClient(hold, {str(arena.socket)!r})\n"
        "out = client.lease(request_id=1, requester='parent', edge_id=3, direction=1,"
        " ring_spec=common_pb2.RingSpec(data_capacity=65536, alignment=64))\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'],"
        " pass_fds=(hold.fd, hold.connection_fileno()))\n"
        "print(out.ring_id, hold.holder_id, kid.pid, flush=True)\n"
        "time.sleep(3600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    ring_id, holder_id, kid = map(int, parent.stdout.readline().split())
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        arena.wait_event("arena_holder_exited_connection_open", holder_id=holder_id)
        with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
            assert [i.ring_id for i in client.stats().leases] == [ring_id]
            os.kill(kid, signal.SIGKILL)
            reclaimed = arena.wait_event("ring_reclaimed", ring_id=ring_id)
            assert reclaimed["cause"] == "HOLDER_EXITED"
            assert not client.stats().leases
    finally:
        _kill_quietly(kid)
