"""The edge-driver's QUIC traffic counts per peer: the ledger, QUIC loss counted by the recovery, and the
counts and object transfers GetStatus reports after real object records crossed loopback."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from swactor.edge.status import driver_status
from swactor.edge.traffic import Traffic, TrafficLedger, traffic_protos
from swactor.v1 import edge_pb2
from tests.edge.fakering import FakeRing, produce_all
from tests.edge.inproc import next_event, start_nodes, stop_nodes
from tests.edge.test_loopback_inproc import _consume
from tests.edge.test_object_timing import record
from tests.edge.test_quic_conn import _CLOCK, CLIENT_ADDR, SERVER_ADDR, _exchange, _pair

OBJECTS = 16


def test_gone_connections_keep_counting_under_their_peer() -> None:
    ledger = TrafficLedger()
    ledger.retire(7, Traffic(sent_bytes=100, sent_datagrams=2, lost_packets=1))
    ledger.retire(None, Traffic(received_bytes=5, received_datagrams=1))
    totals = ledger.totals([(7, Traffic(sent_bytes=10, sent_datagrams=1)), (9, Traffic(received_bytes=3))])
    assert totals == {7: Traffic(sent_bytes=110, sent_datagrams=3, lost_packets=1),
                      0: Traffic(received_bytes=5, received_datagrams=1), 9: Traffic(received_bytes=3)}
    assert [p.peer_node_id for p in traffic_protos(totals)] == [0, 7, 9]
    assert ledger.retired[7].sent_bytes == 100  # totals() reads the ledger, never adds to it


def test_packets_dropped_on_the_way_are_counted_lost(tmp_path: Path) -> None:
    client, server = _pair(tmp_path)
    _exchange(client, server)
    assert client.lost_packets == 0
    sid = client.get_next_available_stream_id(is_unidirectional=True)
    client.send_stream_data(sid, b"z" * 20_000)
    now, sent = _CLOCK[0], 0
    for _ in range(200):  # client -> server, its 2nd and 3rd datagrams dropped; later ones get acknowledged
        moved = 0
        for data, _addr in client.datagrams_to_send(now=now):
            sent += 1
            moved += 1
            if sent not in (2, 3):
                server.receive_datagram(data, CLIENT_ADDR, now=now)
        for data, _addr in server.datagrams_to_send(now=now):
            client.receive_datagram(data, SERVER_ADDR, now=now)
            moved += 1
        if not moved:
            timers = [t for t in (client.get_timer(), server.get_timer()) if t is not None]
            if not timers or min(timers) > now + 1:
                break
            now = max(now, min(timers))
            for conn in (client, server):
                if (t := conn.get_timer()) is not None and t <= now:
                    conn.handle_timer(now=now)
    _CLOCK[0] = now
    assert sent > 5
    assert client.lost_packets == 2
    assert server.lost_packets == 0


def test_status_reports_bytes_both_ways_per_peer(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            tx = a.rings.add(FakeRing(11, 256 << 10))
            rx = b.rings.add(FakeRing(21, 128 << 10))
            await b.driver.establish_recv(7, 21, a.node_id, None)
            await a.driver.establish_send(7, b.node_id, 11, None)
            await next_event(a, "ready", 7)
            data = b"".join(record(i, i, 64 << 10) for i in range(OBJECTS))
            await asyncio.wait_for(asyncio.gather(produce_all(tx, data), _consume(rx, len(data), hashlib.sha256())), 60)

            def traffic(node, peer):  # type: ignore[no-untyped-def]
                d = node.driver
                st = driver_status(node.node_id, "", d.endpoint, d.table)
                return next(t for t in st.traffic if t.peer_node_id == peer)

            sent, got = traffic(a, b.node_id), traffic(b, a.node_id)
            a.driver._flush_timings()  # what the flush timer does
            b.driver._flush_timings()
            [sent_objects] = a.driver.status().transfers
            [got_objects] = b.driver.status().transfers
            assert (sent_objects.peer_node_id, sent_objects.role) == (b.node_id, edge_pb2.EDGE_ROLE_SEND)
            assert (got_objects.peer_node_id, got_objects.role) == (a.node_id, edge_pb2.EDGE_ROLE_RECV)
            assert got_objects.objects == sent_objects.objects == OBJECTS and got_objects.seconds >= 0
            assert sent.sent_bytes > len(data) and sent.sent_datagrams > 0
            assert got.received_bytes > len(data) and got.received_datagrams > 0
            assert sent.received_datagrams > 0  # acknowledgements came back
            # the connection goes: its counts stay with the peer
            for conn in list(a.driver.endpoint.connections):
                conn.close(reason="test")
            await asyncio.sleep(0.2)
            after = traffic(a, b.node_id)
            assert after.sent_bytes >= sent.sent_bytes
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())
