"""The edge table and its pumps (spec §23-25, §35), a sending and a receiving core linked in memory
(tests/edge/memlink.py): bytes, credit, FIN, resets and wakes move only when the test says so; time
is a fake clock. Assertions are on the tables' events and the pumps' `edge.pump_state` events."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

import swactor_ring as sr
from swactor.common.ringerrors import RingClosed
from swactor.edge import preamble
from swactor.edge.pumpstate import InvalidTransition, RecvState, SendState
from swactor.edge.streamport import AppError
from swactor.edge.table import RECV, SEND, EdgeRecord, EdgeTable
from swactor.edge.timingflush import BACKLOG, TimingTaps
from swactor.v1 import common_pb2 as pb
from tests.edge.fakering import FakeConsumerEnd, FakeProducerEnd, FakeRing
from tests.edge.memlink import Clock, Link

QUEUE_LIMIT = 32 << 10


def table(timeout: float = 5.0) -> EdgeTable:
    return EdgeTable(rendezvous_timeout=timeout, stream_window=1 << 20, send_queue_limit=QUEUE_LIMIT)


class Pair:
    """Host A sends edge `edge_id` to host B; A's egress ring `tx`, B's ingress ring `rx`."""

    def __init__(self, tx_cap: int = 64 << 10, rx_cap: int = 16 << 10, edge_id: int = 7, *,
                 taps: bool = False, recv: bool = True) -> None:
        self.clock = Clock()
        self.a, self.b = table(), table()
        self.link = Link(self.a, self.b, self.clock)
        self.edge_id = edge_id
        self.tx = FakeRing(11, tx_cap, eventfds=False)
        self.rx = FakeRing(21, rx_cap, eventfds=False)
        self.timings = TimingTaps(on_done=lambda: None)
        self.send_tap = self.timings.new_tap(edge_id, SEND, 11) if taps else None
        self.recv_tap = self.timings.new_tap(edge_id, RECV, 21) if taps else None
        self.send = self.a.add_send(edge_id, 11, 2, FakeConsumerEnd(self.tx), self.send_tap)
        self.a.connected(self.send, self.link.conn_tx, self.clock.now_us)
        self.recv: EdgeRecord | None = self.establish_recv() if recv else None

    def establish_recv(self) -> EdgeRecord:
        self.recv = self.b.add_recv(self.edge_id, 21, 1, FakeProducerEnd(self.rx), self.recv_tap, self.clock.now,
                                    self.clock.now_us)
        return self.recv

    def move(self, data: bytes, *, close: bool = False, expect: int | None = None) -> bytes:
        """Produce `data` into tx (as ring space allows; then close it), run the link and consume
        rx until `expect` bytes (default: len(data)) arrived, or rx closed; what arrived."""
        out, view = bytearray(), memoryview(data)
        expect = len(data) if expect is None else expect
        if close and not view:
            self.tx.close()
        for _ in range(100_000):
            if view:
                view = view[self.tx.write(view):]
                if not view and close:
                    self.tx.close()
            self.link.run()
            closed = consume(self.rx, out)
            if closed or (not view and len(out) >= expect and not close):
                return bytes(out)
        raise AssertionError(f"only {len(out)} of {expect} bytes arrived")


def consume(ring: FakeRing, out: bytearray) -> bool:
    """Read everything readable into `out`; True once the producer closed the ring and all is read."""
    try:
        while view := ring.readable_view(1 << 20):
            out += view
            ring.advance_consume(len(view))
    except RingClosed:
        return True
    return False


def events(t: EdgeTable) -> list[tuple[str, int, str]]:
    """(kind, edge_id, fault reason name or "") of the table's events since the last call."""
    out = []
    for ev, edge_id, _ in t.outbox:
        kind = ev.WhichOneof("event")
        out.append((kind, edge_id, pb.StreamFaultReason.Name(ev.fault.reason) if kind == "fault" else ""))
    t.outbox.clear()
    return out


def transitions(logs: list[dict], role: str, edge_id: int = 7) -> list[tuple[str, str]]:
    return [(e["old"], e["new"]) for e in logs
            if e["event"] == "edge.pump_state" and e["role"] == role and e["edge_id"] == edge_id]


def records(n: int, extent: int, first_seq: int = 0) -> bytes:
    return b"".join(bytes(sr.ObjectHeader(100 + s, s, extent, 0).encode()) + bytes([s % 251]) * extent
                    for s in range(first_seq, first_seq + n))


@pytest.fixture
def logs() -> Iterator[list[dict]]:
    with capture_logs() as cap:
        yield cap


def test_streaming_records_cross_intact_through_wraparound(logs: list[dict]) -> None:
    p = Pair(taps=True)
    data = records(40, 5000)  # 200 kB through a 16 kB ingress ring and a 64 kB egress ring
    got = p.move(data)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert events(p.a) == [("ready", 7, "")] and events(p.b) == [("ready", 7, "")]
    assert transitions(logs, "SEND")[:3] == [("WaitingForConnection", "WaitingForBytes"),
                                             ("WaitingForBytes", "OpenStream"), ("OpenStream", "Streaming")]
    assert transitions(logs, "RECV")[0] == ("WaitingForSpecAndStream", "Streaming")
    assert p.send.pump.bytes == p.recv.pump.bytes == len(data)  # type: ignore[union-attr]
    for tap in (p.send_tap, p.recv_tap):
        marks, dropped = tap.drain()  # type: ignore[union-attr]
        assert [(m.object_id, m.sequence, m.extent) for m in marks] == [(100 + s, s, 5000) for s in range(40)]
        assert dropped == 0


def test_backpressure_stalled_consumer_bounds_credit_and_send_queue(logs: list[dict]) -> None:
    p = Pair(tx_cap=64 << 10, rx_cap=16 << 10)
    data = bytes(range(256)) * 1024  # 256 kB; nobody consumes rx yet
    view = memoryview(data)
    for _ in range(50):
        view = view[p.tx.write(view):]
        p.link.run()
    send, recv = p.send.pump, p.recv.pump  # type: ignore[union-attr]
    assert p.rx.free() == 0 and p.tx.free() == 0  # both rings full: the producer is blocked
    assert recv.state is RecvState.BACKPRESSURED and send.state is SendState.BACKPRESSURED
    announced, received = p.link.conn_rx.credit(recv.stream_id)  # type: ignore[union-attr]
    assert announced - recv.delivered <= p.rx.capacity  # credit never ran ahead of the ring
    assert received <= announced and recv.pending_bytes == 0
    assert p.link.conn_tx.queued(send.stream_id) <= QUEUE_LIMIT  # type: ignore[arg-type]
    assert p.move(bytes(view), expect=len(data)) == data
    assert ("Streaming", "Backpressured") in transitions(logs, "SEND")
    assert ("Backpressured", "Streaming") in transitions(logs, "RECV")
    p.link.run()  # the last read's wake: space again
    assert recv.state is RecvState.STREAMING and send.state is SendState.STREAMING


def test_eof_mid_object_closes_both_ends_with_every_byte() -> None:
    p = Pair(taps=True)
    whole = records(1, 3000)
    data = whole + records(1, 3000, first_seq=1)[:1000]  # the producer dies inside object 1
    got = p.move(data, close=True)
    assert got == data and p.rx.state == "closed"
    assert events(p.a) == [("ready", 7, ""), ("closed", 7, "")]
    assert events(p.b) == [("ready", 7, ""), ("closed", 7, "")]  # byte-blind: the worker classifies
    assert [m.sequence for m in p.recv_tap.drain()[0]] == [0]  # type: ignore[union-attr]
    assert p.link.streams[p.send.pump.stream_id].fin_delivered  # type: ignore[index, union-attr]


def test_close_waits_until_the_last_byte_is_in_the_ring(logs: list[dict]) -> None:
    p = Pair(rx_cap=16 << 10)
    data = bytes(40 << 10)
    p.tx.write(data)
    p.tx.close()
    p.link.run()
    # The sender is done once QUIC holds every byte and FIN; the receiver took 16 kB and waits for
    # the consumer: its ring closes only after the last byte, and so does its pump
    assert p.send.pump.state is SendState.CLOSED and events(p.a)[-1] == ("closed", 7, "")
    assert p.rx.state == "open" and p.recv.pump.state is RecvState.BACKPRESSURED  # type: ignore[union-attr]
    assert events(p.b) == [("ready", 7, "")]
    got = p.move(b"", close=True)
    assert len(got) == len(data) and p.rx.state == "closed"
    assert events(p.b) == [("closed", 7, "")]
    assert transitions(logs, "RECV")[-1] == ("Streaming", "Closed")
    # StopEdge after the close: PumpStopped follows, no second end event; the ring is the caller's
    assert [r.role for r in p.b.stop_edge(7)] == [RECV] and events(p.b) == [("pump_stopped", 7, "")]
    assert p.b.stop_edge(7) == [] and events(p.b) == []


def test_malformed_preamble_stops_that_stream_and_the_link_lives_on() -> None:
    p = Pair(recv=False)
    bad = p.link.raw_stream(b"GARBAGE-PREAMBLE")
    short = p.link.raw_stream(preamble.MAGIC, fin=True)  # ends inside the preamble
    p.link.run()
    assert events(p.b) == [("fault", 0, "STREAM_FAULT_MALFORMED_PREAMBLE")] * 2
    assert all(p.link.streams[s].gone for s in (bad, short))  # stopped, answered with a reset
    p.establish_recv()
    assert p.move(b"still fine") == b"still fine"
    assert events(p.b) == [("ready", 7, "")]


def test_malformed_object_header_turns_the_tap_off_not_the_pump(logs: list[dict]) -> None:
    p = Pair(taps=True)
    data = records(1, 100) + b"XXXX" + bytes(36) + b"payload" + records(1, 100, first_seq=2)
    assert p.move(data) == data  # the pumps are byte-blind movers
    assert p.recv.pump.state is RecvState.STREAMING  # type: ignore[union-attr]
    live = {(7, SEND): p.send_tap, (7, RECV): p.recv_tap}
    batches = p.timings.drain(live.get, lambda _: True)
    assert [(ev.objects.role, [m.sequence for m in ev.objects.objects]) for ev, _ in batches] == [(SEND, [0]), (RECV, [0])]
    assert sorted(e["role"] for e in logs if e["event"] == "edge.object_timing_off") == [SEND, RECV]
    assert p.timings.drain(live.get, lambda _: True) == []  # turned off: dropped


def test_timings_nobody_watched_yet_wait_for_the_first_watcher_of_their_edge() -> None:
    """A run's owner subscribes while its edges come up; objects that passed before it did are still reported to it."""
    p = Pair(taps=True)
    live = {(7, SEND): p.send_tap, (7, RECV): p.recv_tap}
    data = records(3, 50)
    assert p.move(data) == data
    assert p.timings.drain(live.get, lambda edge_id: edge_id != 7) == []  # the watchers there take other edges
    assert p.timings.take_backlog({8}) == []
    more = records(BACKLOG, 10, first_seq=3)
    assert p.move(more) == more
    assert p.timings.drain(live.get, lambda _: False) == []
    batches = p.timings.take_backlog({7})
    assert [(ev.objects.role, ev.objects.dropped, len(ev.objects.objects)) for ev, edge_id in batches] == [
        (SEND, 3, BACKLOG), (RECV, 3, BACKLOG)]  # bounded: the oldest are counted, not kept
    assert [m.sequence for m in batches[0][0].objects.objects][-1] == BACKLOG + 2
    assert p.timings.take_backlog({7}) == []  # handed to one watcher
    assert p.move(records(1, 5, first_seq=500)) is not None
    del live[(7, SEND)]  # that pump is gone: its last marks go with it, watched or not
    assert p.timings.drain(live.get, lambda _: False) == []
    assert [ev.objects.role for ev, _ in p.timings.take_backlog(set())] == [RECV]


def test_second_stream_for_an_edge_faults_its_sender_unknown_edge() -> None:
    p = Pair()
    p.move(b"first")
    other = table()
    dup_link = Link(other, p.b, p.clock, tx_node=1)  # the producer again, on a second connection
    dup_ring = FakeRing(12, 4096, eventfds=False)
    dup = other.add_send(7, 12, 2, FakeConsumerEnd(dup_ring), None)
    other.connected(dup, dup_link.conn_tx, p.clock.now_us)
    dup_ring.write(b"me too")
    dup_link.run()
    assert events(other) == [("ready", 7, ""), ("fault", 7, "STREAM_FAULT_UNKNOWN_EDGE")]
    assert p.move(b" and more") == b" and more"  # the first stream is untouched
    assert events(p.b) == [("ready", 7, "")]


def intruder(p: Pair, node: int = 3) -> tuple[EdgeTable, Link]:
    """Host `node` (not edge 7's planned producer, node 1) sends edge 7 to B too."""
    other = table()
    link = Link(other, p.b, p.clock, tx_node=node)
    ring = FakeRing(13, 4096, eventfds=False)
    rec = other.add_send(7, 13, 2, FakeConsumerEnd(ring), None)
    other.connected(rec, link.conn_tx, p.clock.now_us)
    ring.write(b"take this instead")
    link.run()
    return other, link


def test_stream_from_a_node_other_than_the_planned_producer_is_refused(logs: list[dict]) -> None:
    p = Pair()
    p.move(b"first")
    other, _ = intruder(p)
    assert events(other) == [("ready", 7, ""), ("fault", 7, "STREAM_FAULT_WRONG_PRODUCER")]
    assert p.move(b" and more") == b" and more"  # the producer's stream is untouched
    assert p.rx.read(100) == b""  # and not one intruder byte reached the ring
    assert events(p.b) == [("ready", 7, "")]
    assert p.b.streams_wrong_producer == 1
    (refused,) = [e for e in logs if e["event"] == "edge.stream_refused"]
    assert refused["reason"] == "STREAM_FAULT_WRONG_PRODUCER" and refused["peer_node_id"] == 3
    assert refused["edge_id"] == 7 and refused["log_level"] == "warning"


def test_refused_intruder_then_the_planned_producer_streams() -> None:
    p = Pair()
    intruder(p)  # first, while B waits for node 1
    assert p.b.next_deadline() == p.clock.now + 5.0
    got = p.move(b"the real bytes")
    assert got == b"the real bytes"
    assert p.b.next_deadline() is None
    p.clock.advance(10.0)
    p.b.expire(p.clock.now)
    assert events(p.b) == [("ready", 7, "")]


def test_intruder_parked_before_establish_recv_is_refused_then() -> None:
    p = Pair(recv=False)
    other, link = intruder(p)
    assert p.b.parked_streams == 1 and events(other) == [("ready", 7, "")]
    p.establish_recv()
    link.run()
    assert p.b.parked_streams == 0
    assert events(other) == [("fault", 7, "STREAM_FAULT_WRONG_PRODUCER")]
    assert p.move(b"mine") == b"mine"
    assert events(p.b) == [("ready", 7, "")]


def test_planned_producer_that_never_comes_faults_the_edge_with_a_reason() -> None:
    p = Pair()
    p.send.pump.stop()  # node 1 never sends (its edge was stopped before it had bytes)
    intruder(p)
    p.clock.advance(4.9)
    p.b.expire(p.clock.now)
    assert events(p.b) == [("ready", 7, "")]
    p.clock.advance(0.1)
    p.b.expire(p.clock.now)
    out = p.b.outbox[:]
    assert events(p.b) == [("fault", 7, "STREAM_FAULT_WRONG_PRODUCER")]
    detail = out[0][0].fault.detail
    assert "node 3" in detail and "node 1" in detail and "did not open" in detail
    assert p.recv.pump.state is RecvState.FAULTED  # type: ignore[union-attr]


def test_stream_for_an_unknown_edge_parks_then_times_out() -> None:
    p = Pair(recv=False)
    p.tx.write(b"anyone?")
    p.link.run()
    assert p.b.parked_streams == 1 and p.b.next_deadline() == p.clock.now + 5.0
    p.clock.advance(4.9)
    p.b.expire(p.clock.now)
    assert events(p.b) == []
    p.clock.advance(0.1)
    p.b.expire(p.clock.now)
    p.link.run()
    assert events(p.b) == [("fault", 7, "STREAM_FAULT_RENDEZVOUS_TIMEOUT")]
    assert events(p.a) == [("ready", 7, ""), ("fault", 7, "STREAM_FAULT_RENDEZVOUS_TIMEOUT")]
    assert p.b.parked_streams == 0 and p.b.next_deadline() is None


def test_parked_stream_keeps_its_bytes_until_the_edge_is_established() -> None:
    p = Pair(recv=False)
    p.tx.write(b"early bytes")
    p.link.run()
    p.clock.advance(4.0)
    p.establish_recv()
    p.link.run()
    assert p.rx.read(100) == b"early bytes"
    p.clock.advance(10.0)
    p.b.expire(p.clock.now)
    assert events(p.b) == [("ready", 7, "")]


def test_recv_ring_fault_resets_the_stream_and_late_bytes_are_dropped() -> None:
    p = Pair()
    p.move(b"x" * 1000)
    p.tx.write(b"y" * 5000)
    p.rx.fault()
    p.link.run()  # the recv pump faults on its wake; bytes in flight still arrive, then the reset
    assert events(p.b) == [("ready", 7, ""), ("fault", 7, "STREAM_FAULT_RING_FAULT")]
    assert events(p.a) == [("ready", 7, ""), ("fault", 7, "STREAM_FAULT_PEER_STOPPED")]
    assert p.link.streams[p.send.pump.stream_id].gone  # type: ignore[index, union-attr]


def test_send_ring_fault_resets_the_stream() -> None:
    p = Pair()
    p.move(b"x" * 1000)
    p.tx.fault()
    p.link.run()
    assert events(p.a)[-1] == ("fault", 7, "STREAM_FAULT_RING_FAULT")
    assert events(p.b)[-1] == ("fault", 7, "STREAM_FAULT_PEER_STOPPED")


def test_stop_edge_on_either_side() -> None:
    p = Pair()
    p.move(b"before")
    assert [r.role for r in p.b.stop_edge(7)] == [RECV]  # STOP_SENDING: the sender faults
    p.link.run()
    assert events(p.b)[-1] == ("pump_stopped", 7, "")
    assert events(p.a)[-1] == ("fault", 7, "STREAM_FAULT_PEER_STOPPED")
    q = Pair()
    q.move(b"before")
    assert [r.role for r in q.a.stop_edge(7)] == [SEND]  # FIN after what QUIC holds
    q.link.run()
    assert events(q.a)[-1] == ("pump_stopped", 7, "")
    assert events(q.b)[-1] == ("closed", 7, "") and q.rx.state == "closed"


def test_connection_lost_faults_every_edge_on_it() -> None:
    p = Pair()
    p.move(b"hello")
    p.link.lose()
    assert events(p.a)[-1] == ("fault", 7, "STREAM_FAULT_CONNECTION_LOST")
    assert events(p.b)[-1] == ("fault", 7, "STREAM_FAULT_CONNECTION_LOST")


def test_pumps_refuse_moves_outside_the_spec_fsm() -> None:
    p = Pair()
    p.move(b"done", close=True)
    assert p.recv.pump.state is RecvState.CLOSED  # type: ignore[union-attr]
    with pytest.raises(InvalidTransition, match="Closed -> Streaming"):
        p.recv.pump.start(p.link.conn_rx, 99, b"", False, 0)  # type: ignore[union-attr]
    assert p.b.stop_edge(7) and p.recv.pump.state is RecvState.STOPPED  # type: ignore[union-attr]
    assert AppError.EDGE_STOPPED not in {s.stop_code for s in p.link.streams.values()}  # closed: nothing to stop
