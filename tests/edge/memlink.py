"""Edge tables linked in memory, for the core tests: no sockets, no event loop, no sleeps.

A `Link` joins a sending table and a receiving table the way one QUIC connection would: each side
has a `MemConn` (the `StreamPort` the cores talk to), and `run()` moves what the cores queued —
stream bytes within the receiver's credit, FIN, STOP_SENDING (answered by a reset, as QUIC does),
RESET_STREAM, ACKs — and delivers the rings' wake signals, until nothing moves. Time is a `Clock`
the test advances; rings are `FakeRing(eventfds=False)`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from swactor.edge.table import SEND, EdgeTable
from tests.edge.fakering import FakeRing

_uids = itertools.count(1000)


@dataclass
class Clock:
    now: float = 100.0  # monotonic seconds (rendezvous)

    @property
    def now_us(self) -> int:  # wall-clock µs (object taps): any monotone value will do here
        return int(self.now * 1e6)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class MemStream:
    """One uni-stream as both ends see it (offsets count from the preamble's first byte)."""

    stream_id: int
    max_data: int  # MAX_STREAM_DATA the receiver announced
    data: bytearray = field(default_factory=bytearray)  # everything the sender queued
    fin: bool = False
    delivered: int = 0  # offset handed to the receiving table (and acknowledged)
    fin_delivered: bool = False
    stop_code: int | None = None  # STOP_SENDING from the receiver, not yet delivered
    reset_code: int | None = None  # RESET_STREAM from the sender, not yet delivered
    gone: bool = False  # reset delivered: QUIC drops everything after


class MemConn:
    """The StreamPort of one side of a Link."""

    def __init__(self, link: Link, peer_node_id: int) -> None:
        self.link = link
        self.uid = next(_uids)
        self.closed = False
        self._peer = peer_node_id

    @property
    def peer_node_id(self) -> int | None:
        return self._peer

    def open_stream(self, first: bytes) -> int:
        return self.link.open_stream(first)

    def send(self, stream_id: int, data: bytes | memoryview, end: bool = False) -> None:
        s = self.link.streams[stream_id]
        assert not s.fin, "write after FIN"
        s.data += data  # a copy, as aioquic's stream buffer
        s.fin = s.fin or end

    def queued(self, stream_id: int) -> int:
        s = self.link.streams.get(stream_id)
        return 0 if s is None or s.gone else len(s.data) - s.delivered

    def reset_stream(self, stream_id: int, code: int) -> None:
        self.link.streams[stream_id].reset_code = code

    def credit(self, stream_id: int) -> tuple[int, int]:
        s = self.link.streams.get(stream_id)
        return (0, 0) if s is None or s.gone else (s.max_data, s.delivered)

    def grant(self, stream_id: int, limit: int) -> bool:
        s = self.link.streams[stream_id]
        if limit <= s.max_data:
            return False
        s.max_data = limit
        return True

    def stop_stream(self, stream_id: int, code: int) -> None:
        s = self.link.streams[stream_id]
        if not s.gone:
            s.stop_code = code


class Link:
    def __init__(self, tx: EdgeTable, rx: EdgeTable, clock: Clock, *, initial_window: int = 16 << 10,
                 tx_node: int = 1, rx_node: int = 2) -> None:
        self.tx, self.rx, self.clock = tx, rx, clock
        self.initial_window = initial_window
        self.conn_tx = MemConn(self, rx_node)  # the sender's view: its peer is the receiver
        self.conn_rx = MemConn(self, tx_node)
        self.streams: dict[int, MemStream] = {}
        self._ids = itertools.count(2, 4)  # client-initiated uni-stream ids, as QUIC numbers them

    def open_stream(self, first: bytes) -> int:
        sid = next(self._ids)
        self.streams[sid] = MemStream(sid, self.initial_window, bytearray(first))
        return sid

    def raw_stream(self, data: bytes, fin: bool = False) -> int:
        """A stream a misbehaving peer opens (no pump behind it)."""
        sid = self.open_stream(data)
        self.streams[sid].fin = fin
        return sid

    def lose(self, reason: str = "idle timeout") -> None:
        """The connection dies under both tables."""
        for table, conn in ((self.tx, self.conn_tx), (self.rx, self.conn_rx)):
            conn.closed = True
            table.connection_lost(conn, reason, False)

    def run(self, rounds: int = 10_000) -> None:
        """Move everything that can move; return when nothing does."""
        for _ in range(rounds):
            if not (self._deliver() | self._control() | _wake(self.tx, self.clock) | _wake(self.rx, self.clock)):
                return
        raise AssertionError("the link never went quiet")

    def _deliver(self) -> bool:
        moved = False
        now, now_us = self.clock.now, self.clock.now_us
        for s in list(self.streams.values()):
            if s.gone:
                continue
            end_at = min(len(s.data), s.max_data)
            chunk = bytes(s.data[s.delivered:end_at])
            fin = s.fin and end_at == len(s.data) and not s.fin_delivered
            if chunk or fin:
                s.delivered = end_at
                s.fin_delivered = s.fin_delivered or fin
                self.rx.stream_data(self.conn_rx, s.stream_id, chunk, fin, now, now_us)
                moved = True
        if moved:
            self.tx.progress(self.conn_tx, now_us)  # what arrived is acknowledged
        return moved

    def _control(self) -> bool:
        moved = False
        for s in list(self.streams.values()):
            if s.stop_code is not None:
                code, s.stop_code = s.stop_code, None
                self.tx.stop_sending(self.conn_tx, s.stream_id, code)
                if s.reset_code is None and not s.gone:
                    s.reset_code = code  # QUIC answers STOP_SENDING with RESET_STREAM
                moved = True
            if s.reset_code is not None and not s.gone:
                s.gone = True
                self.rx.stream_reset(self.conn_rx, s.stream_id, s.reset_code)
                moved = True
        return moved


def _wake(table: EdgeTable, clock: Clock) -> bool:
    """Deliver ring wakes the table's pumps are owed (what the driver's fd readers do)."""
    moved = False
    for rec in list(table.edges.values()):
        ring: FakeRing = rec.pump.ring.ring  # type: ignore[union-attr]
        if rec.role == SEND and ring.readable_signal:
            ring.ack_readable()
        elif rec.role != SEND and ring.writable_signal:
            ring.ack_writable()
        else:
            continue
        table.ring_wake(rec, clock.now_us)
        moved = True
    return moved
