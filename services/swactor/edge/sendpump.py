"""The send pump (spec §25): committed egress-ring bytes -> one QUIC uni-stream. I/O-free.

Inputs are method calls with the wall-clock time (`now_us`, for the object tap) passed in; each
returns True when it handed QUIC something to send, so the caller transmits the connection. The
pump talks to its ring through a `ringport.ConsumerEnd` and to QUIC through a `StreamPort`; it
never parses objects, never sleeps and never touches a socket.

    attach(conn)      the connection is up: WaitingForConnection -> WaitingForBytes, then step
    step()            the ring has bytes (RingReadable) or QUIC acknowledged some (progress)
    fault(reason)     the peer stopped the stream, the connection died, ...
    stop()            StopEdge: FIN after what QUIC already holds; the ring is never read again

Bounded sending: at most `queue_limit` bytes sit in QUIC (unsent + unacknowledged); beyond that
the pump is Backpressured until ACKs arrive. The ring's consume cursor advances once QUIC holds
its copy (aioquic appends the ring span to its stream buffer: one copy). The stream opens (with
the edge_id preamble) on the first committed bytes; a producer that closes its ring gets FIN after
the last byte.
"""

from __future__ import annotations

from swactor.common.ringerrors import RingBroken, RingClosed
from swactor.common.ringport import ConsumerEnd
from swactor.edge import preamble
from swactor.edge.objtap import ObjectTap
from swactor.edge.pumpstate import SEND_FSM, Pump, SendState
from swactor.edge.streamport import AppError, StreamPort
from swactor.v1 import common_pb2

S = SendState


class SendPump(Pump):
    def __init__(self, *, edge_id: int, ring: ConsumerEnd, queue_limit: int, tap: ObjectTap | None = None) -> None:
        super().__init__(SEND_FSM, edge_id, ring.ring_id, tap)
        self.ring = ring
        self.queue_limit = queue_limit
        self.stream_id: int | None = None

    def attach(self, conn: StreamPort, now_us: int) -> bool:
        self.conn = conn
        self._set_state(S.WAITING_FOR_BYTES)
        return self.step(now_us)

    def step(self, now_us: int) -> bool:
        """Hand committed bytes to QUIC while the send queue has room."""
        conn = self.conn
        if conn is None or self.done:
            return False
        ring, sid = self.ring, self.stream_id
        sent = False
        try:
            while True:
                room = self.queue_limit - (conn.queued(sid) if sid is not None else 0)
                if room <= 0:
                    self._set_state(S.BACKPRESSURED)
                    return sent
                if self.state is S.BACKPRESSURED:
                    self._set_state(S.STREAMING)
                try:
                    view = ring.readable(room)
                except RingClosed:
                    return self._end_of_ring() or sent
                if not view:
                    if ring.arm_wait() is None:
                        continue  # bytes were committed between the read and the arm
                    return sent
                if sid is None:
                    self._set_state(S.OPEN_STREAM)
                    sid = self.stream_id = conn.open_stream(preamble.encode(self.edge_id))
                    self._set_state(S.STREAMING)
                n = len(view)
                conn.send(sid, view)  # QUIC keeps a copy: the ring span can be released
                if self.tap is not None:
                    self.tap.feed(view, now_us)
                view.release()
                ring.advance_consume(n)
                self.bytes += n
                sent = True
        except RingBroken as e:
            self.fault(common_pb2.STREAM_FAULT_RING_FAULT, str(e), AppError.RING_FAULT)
            return True

    on_ring_wake = step  # RingReadable and QUIC progress both mean: try to move bytes

    def _end_of_ring(self) -> bool:
        """The producer closed the ring and every byte is in QUIC: FIN (no stream: nothing to end)."""
        assert self.conn is not None
        if self.stream_id is not None:
            self.conn.send(self.stream_id, b"", end=True)
        self._set_state(S.CLOSED)
        return self.stream_id is not None

    def fault(self, reason: int, detail: str, code: AppError | None = None) -> bool:
        """End with a fault; with `code`, reset the stream so the peer faults too."""
        if self.done:
            return False
        conn, sid, reset = self.conn, self.stream_id, False
        if code is not None and conn is not None and sid is not None and not conn.closed:
            conn.reset_stream(sid, code)
            reset = True
        self._set_state(S.FAULTED, reason, detail)
        return reset

    def stop(self) -> bool:
        """StopEdge: FIN after what QUIC already holds; the caller releases the ring."""
        conn, sid, fin = self.conn, self.stream_id, False
        if not self.done and conn is not None and sid is not None and not conn.closed:
            conn.send(sid, b"", end=True)
            fin = True
        self._set_state(S.STOPPED)
        return fin
