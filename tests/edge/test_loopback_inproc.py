"""Two edge drivers in one process over loopback QUIC with fake rings: pumps, rendezvous, faults."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from swactor.edge import preamble
from swactor.edge.driver import Driver
from swactor.edge.table import EdgeError
from swactor.v1 import common_pb2, edge_pb2
from tests.edge.fakering import FakeRing, produce_all, wait_fd
from tests.edge.inproc import next_event, queued, start_nodes, stop_nodes, until


async def _consume(ring: FakeRing, total: int, h: hashlib._Hash) -> None:
    got = 0
    while got < total:
        chunk = ring.read(1 << 20)
        if chunk:
            h.update(chunk)
            got += len(chunk)
            continue
        if not ring.arm_readable():
            await wait_fd(ring.readable_fd)
            ring.ack_readable()


def test_bytes_cross_intact_recv_first(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            tx = a.rings.add(FakeRing(11, 256 << 10))
            rx = b.rings.add(FakeRing(21, 128 << 10))
            await b.driver.establish_recv(7, 21, a.node_id, None)
            await a.driver.establish_send(7, b.node_id, 11, None)
            await next_event(a, "ready", 7)
            data = os.urandom(8 << 20)
            want = hashlib.sha256(data).hexdigest()
            h = hashlib.sha256()
            await asyncio.wait_for(asyncio.gather(produce_all(tx, data), _consume(rx, len(data), h)), 60)
            assert h.hexdigest() == want
            tx.close()
            await next_event(b, "closed", 7)
            assert rx.state == "closed"
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_stream_first_rendezvous_and_shared_connection(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            for e in range(1, 5):
                tx = a.rings.add(FakeRing(10 + e, 64 << 10))
                await a.driver.establish_send(e, b.node_id, 10 + e, None)
                await next_event(a, "ready", e)
                tx.write(b"hello %d" % e)
            await until(lambda: b.driver.table.parked_streams == 4, "4 parked streams")  # no EstablishRecv yet
            for e in range(1, 5):
                rx = b.rings.add(FakeRing(20 + e, 64 << 10))
                await b.driver.establish_recv(e, 20 + e, a.node_id, None)
                await until(lambda rx=rx: rx.avail() >= 7, f"edge {e}'s bytes")
                assert rx.read(100) == b"hello %d" % e
            conns_a = [c for c in a.driver.endpoint.connections if not c.closed]
            conns_b = [c for c in b.driver.endpoint.connections if not c.closed]
            assert len(conns_a) == 1 and len(conns_b) == 1
            assert [c.streams for c in b.driver.status().connections] == [4]
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_rendezvous_timeout_faults_both_ends(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path, rendezvous_timeout=0.3)
        try:
            tx = a.rings.add(FakeRing(11, 64 << 10))
            await a.driver.establish_send(9, b.node_id, 11, None)
            await next_event(a, "ready", 9)
            tx.write(b"x" * 100)
            ev_b = await next_event(b, "fault", 9)
            assert ev_b.fault.reason == common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT
            ev_a = await next_event(a, "fault", 9)
            assert ev_a.fault.reason == common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_malformed_preamble_faults_and_driver_survives(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            conn = await a.driver.endpoint.connection_to(b.node_id)
            sid = conn.quic.get_next_available_stream_id(is_unidirectional=True)
            conn.quic.send_stream_data(sid, b"GARBAGE-PREAMBLE")
            conn.transmit()
            ev = await next_event(b, "fault", 0)
            assert ev.fault.reason == common_pb2.STREAM_FAULT_MALFORMED_PREAMBLE
            # the same connection still carries a good edge
            tx = a.rings.add(FakeRing(11, 64 << 10))
            rx = b.rings.add(FakeRing(21, 64 << 10))
            await b.driver.establish_recv(5, 21, a.node_id, None)
            await a.driver.establish_send(5, b.node_id, 11, None)
            await next_event(a, "ready", 5)
            tx.write(b"ok")
            await until(lambda: rx.avail() == 2, "the good edge's bytes")
            assert rx.read(10) == b"ok"
            assert len(preamble.encode(5)) == preamble.PREAMBLE_LEN
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_ring_fault_on_recv_side(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            tx = a.rings.add(FakeRing(11, 64 << 10))
            rx = b.rings.add(FakeRing(21, 16 << 10))
            await b.driver.establish_recv(3, 21, a.node_id, None)
            await a.driver.establish_send(3, b.node_id, 11, None)
            await next_event(a, "ready", 3)
            tx.write(b"a" * (32 << 10))
            await until(lambda: rx.free() == 0, "a full ingress ring")
            rx.fault()
            ev = await next_event(b, "fault", 3)
            assert ev.fault.reason == common_pb2.STREAM_FAULT_RING_FAULT
            ev = await next_event(a, "fault", 3)
            assert ev.fault.reason == common_pb2.STREAM_FAULT_PEER_STOPPED
            assert b.driver.stop_edge(3) and a.driver.stop_edge(3)
            await next_event(b, "pump_stopped", 3)
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_keepalive_holds_a_quiet_connection_open(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path, idle_timeout=0.6, keepalive_interval=0.15)
        try:
            tx = a.rings.add(FakeRing(11, 64 << 10))
            rx = b.rings.add(FakeRing(21, 64 << 10))
            await b.driver.establish_recv(1, 21, a.node_id, None)
            await a.driver.establish_send(1, b.node_id, 11, None)
            await next_event(a, "ready", 1)
            tx.write(b"first")
            await until(lambda: rx.avail() == 5, "the first bytes")
            conn = a.driver.endpoint.cached(b.node_id)
            assert conn is not None
            # 13 acknowledged PINGs 0.15 s apart: > 3 idle timeouts (1.8 s) without payload
            await until(lambda: conn.pings_acked >= 13, "13 keepalive PINGs acknowledged", timeout=20)
            tx.write(b"second")
            await until(lambda: rx.avail() == 11, "the second bytes")
            assert rx.read(100) == b"firstsecond"
            assert len([c for c in a.driver.endpoint.connections if not c.closed]) == 1
            assert all(e.WhichOneof("event") != "fault" for e in queued(a.watcher))
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_a_lost_ring_wake_up_costs_a_check_interval_not_the_edge(tmp_path: Path) -> None:
    """A commit (send side) or a consume (recv side) whose eventfd signal went missing: the pump that
    sleeps on it is looked at again within WAKE_CHECK_S, goes on, and the loss is an event."""
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            tx = a.rings.add(FakeRing(11, 64 << 10))
            rx = b.rings.add(FakeRing(21, 1000))
            await b.driver.establish_recv(1, 21, a.node_id, None)
            await a.driver.establish_send(1, b.node_id, 11, None)
            await next_event(a, "ready", 1)
            with capture_logs() as logs:
                tx._consumer_waiting = False  # the send pump sleeps, but this commit will not signal it
                tx.write(b"x" * 1500)  # more than the receiving ring holds: its pump backpressures
                await until(lambda: rx.avail() == 1000, "the bytes the receiving ring holds", timeout=5)
                recv = b.driver.table.edges[(1, edge_pb2.EDGE_ROLE_RECV)].pump
                await until(lambda: recv.state.value == "Backpressured", "the recv pump backpressured")
                rx._producer_waiting = False  # it sleeps on free space, and this consume will not signal it
                assert rx.read(1000) == b"x" * 1000
                await until(lambda: rx.avail() == 500, "the rest of the bytes", timeout=5)
            missed = [(e["role"], e["ring_id"]) for e in logs if e["event"] == "edge.ring_wake_missed"]
            assert missed == [("EDGE_ROLE_SEND", 11), ("EDGE_ROLE_RECV", 21)]
            assert all(e.WhichOneof("event") != "fault" for e in queued(a.watcher) + queued(b.watcher))
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_stalled_consumer_bounds_queues_and_credit(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path, send_queue_limit=512 << 10, stream_window=4 << 20)
        try:
            tx = a.rings.add(FakeRing(11, 256 << 10))
            rx = b.rings.add(FakeRing(21, 128 << 10))
            await b.driver.establish_recv(1, 21, a.node_id, None)
            await a.driver.establish_send(1, b.node_id, 11, None)
            await next_event(a, "ready", 1)
            data = os.urandom(16 << 20)
            producer = asyncio.ensure_future(produce_all(tx, data))
            send = a.driver.table.edges[(1, edge_pb2.EDGE_ROLE_SEND)].pump
            recv = b.driver.table.edges[(1, edge_pb2.EDGE_ROLE_RECV)].pump
            # nobody consumes rx: everything upstream fills, then both pumps wait
            await until(lambda: rx.free() == 0 and tx.free() == 0 and send.state.value == recv.state.value == "Backpressured",
                        "both rings full and both pumps backpressured")
            assert send.conn is not None
            assert not producer.done()
            queued = send.conn.quic.queued_bytes(send.stream_id)  # type: ignore[arg-type]
            assert queued <= 512 << 10
            announced, received = recv.conn.quic.stream_credit(recv.stream_id)
            # credit never ran ahead of the ring: everything the peer may send fits in what was free
            assert announced - recv.delivered <= 128 << 10
            assert received <= announced
            assert recv.pending_bytes <= 128 << 10
            assert recv.state.value == "Backpressured"
            h = hashlib.sha256()
            await asyncio.wait_for(asyncio.gather(producer, _consume(rx, len(data), h)), 60)
            assert h.hexdigest() == hashlib.sha256(data).hexdigest()
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_stop_edge_send_side_closes_stream_and_recv_side_faults_sender(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            for e in (1, 2):
                a.rings.add(FakeRing(10 + e, 64 << 10)).write(b"x" * 100)
                b.rings.add(FakeRing(20 + e, 64 << 10))
                await b.driver.establish_recv(e, 20 + e, a.node_id, None)
                await a.driver.establish_send(e, b.node_id, 10 + e, None)
            await until(lambda: all(b.rings.rings[20 + e].avail() == 100 for e in (1, 2)), "both edges' bytes")
            assert a.driver.stop_edge(1)
            assert (await next_event(a, "pump_stopped", 1)).pump_stopped.ring_id == 11
            assert a.rings.rings[11].released
            await next_event(b, "closed", 1)
            assert b.driver.stop_edge(2)
            ev = await next_event(a, "fault", 2)
            assert ev.fault.reason == common_pb2.STREAM_FAULT_PEER_STOPPED
            assert not a.driver.stop_edge(99)
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_unknown_peer_faults_edge_unreachable(tmp_path: Path) -> None:
    async def main() -> None:
        (a,) = await start_nodes(tmp_path, n=1)
        try:
            a.rings.add(FakeRing(11, 64 << 10))
            await a.driver.establish_send(1, 424242, 11, None)
            ev = await next_event(a, "fault", 1)
            assert ev.fault.reason == common_pb2.STREAM_FAULT_PEER_UNREACHABLE
            assert "424242" in ev.fault.detail
            with pytest.raises(EdgeError, match="already established"):
                await a.driver.establish_send(1, 424242, 11, None)
            with pytest.raises(EdgeError, match="cannot open"):
                await a.driver.establish_recv(2, 999, 7, None)
        finally:
            await stop_nodes([a])

    asyncio.run(main())


def test_restarted_peer_gets_new_edges_not_the_dead_connection(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path, idle_timeout=30.0, keepalive_interval=0.1)
        try:
            a.rings.add(FakeRing(11, 64 << 10))
            b.rings.add(FakeRing(21, 64 << 10))
            await b.driver.establish_recv(1, 21, a.node_id, None)
            await a.driver.establish_send(1, b.node_id, 11, None)
            await next_event(a, "ready", 1)
            old = a.driver.endpoint.cached(b.node_id)
            # b "crashes": its socket vanishes without a CONNECTION_CLOSE ...
            ep = b.driver.endpoint
            assert ep.sock is not None
            port = ep.address[1]  # type: ignore[index]
            ep.loop.remove_reader(ep.sock.fileno())
            ep.sock.close()
            ep.sock = None
            ep.connections.clear()
            # a's cached connection goes quiet: nothing heard for two keepalive intervals
            await until(lambda: ep.loop.time() - old.last_rx > 2 * a.driver.config.keepalive_interval,  # type: ignore[union-attr]
                        "the old connection to go quiet")
            # ... and comes back on the same port with the same identity and dials a
            b2_cfg = dataclasses.replace(b.driver.config, bind=f"127.0.0.1:{port}")
            b2 = Driver(node_id=b.node_id, config=b2_cfg, identity=b.driver.identity, directory=b.driver.directory, rings=b.rings)
            b2.start()
            b.rings.add(FakeRing(22, 64 << 10))
            a.rings.add(FakeRing(12, 64 << 10))
            await a.driver.establish_recv(2, 12, b.node_id, None)
            await b2.establish_send(2, a.node_id, 22, None)
            await until(lambda: a.driver.endpoint.cached(b.node_id) is not old, "the new connection in a's cache")
            new = a.driver.endpoint.cached(b.node_id)
            assert new is not None and new is not old and not new.initiated_here
            await b2.close()
        finally:
            await stop_nodes([a])

    asyncio.run(main())


def test_new_edge_to_a_restarted_peer_dials_instead_of_using_the_quiet_connection(tmp_path: Path) -> None:
    # The peer restarts on its address; before the old connection's idle timeout, this side opens
    # a new edge to it: that edge must get a new connection, not die with the old one (seen on a
    # local pool: the next run after a host restart faulted STREAM_FAULT_CONNECTION_LOST).
    async def main() -> None:
        a, b = await start_nodes(tmp_path, idle_timeout=30.0, keepalive_interval=0.1)
        try:
            a.rings.add(FakeRing(11, 64 << 10))
            b.rings.add(FakeRing(21, 64 << 10))
            await b.driver.establish_recv(1, 21, a.node_id, None)
            await a.driver.establish_send(1, b.node_id, 11, None)
            await next_event(a, "ready", 1)
            old = a.driver.endpoint.cached(b.node_id)
            assert old is not None
            ep = b.driver.endpoint
            assert ep.sock is not None
            port = ep.address[1]  # type: ignore[index]
            ep.loop.remove_reader(ep.sock.fileno())
            ep.sock.close()
            ep.sock = None
            ep.connections.clear()
            await until(lambda: ep.loop.time() - old.last_rx > 2 * a.driver.config.keepalive_interval,
                        "the old connection to go quiet")
            b2_cfg = dataclasses.replace(b.driver.config, bind=f"127.0.0.1:{port}")
            b2 = Driver(node_id=b.node_id, config=b2_cfg, identity=b.driver.identity, directory=b.driver.directory, rings=b.rings)
            b2.start()
            b.rings.add(FakeRing(22, 64 << 10))
            a.rings.add(FakeRing(12, 64 << 10))
            await b2.establish_recv(2, 22, a.node_id, None)
            await a.driver.establish_send(2, b.node_id, 12, None)
            await next_event(a, "ready", 2)
            new = a.driver.endpoint.cached(b.node_id)
            assert new is not None and new is not old and new.initiated_here and not old.closed
            await b2.close()
        finally:
            await stop_nodes([a])

    asyncio.run(main())
