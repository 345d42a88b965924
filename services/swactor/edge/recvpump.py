"""The recv pump (spec §25, §35): one QUIC uni-stream -> the ingress ring. I/O-free.

Inputs are method calls with the wall-clock time (`now_us`, for the object tap) passed in; each
returns True when it granted the peer new credit, so the caller transmits the connection. The
pump writes its ring through a `ringport.ProducerEnd` and reads credit through a `StreamPort`;
it is byte-blind (EOF alignment is the worker parser's business) and never touches a socket.

    start(conn, stream_id, initial, eof)   the rendezvous matched: -> Streaming
    on_data(data, end)                     stream bytes (and FIN) arrived
    on_ring_wake()                         the worker consumed: ring space (RingWritable)
    fault(reason) / stop()                 the peer reset, the connection died / StopEdge

Credit follows ring space (credit.py): the peer may send `delivered + min(ring_free, window)`,
so arriving bytes fit the ring and `pending` stays ~empty. With no free space the pump is
Backpressured, armed on the ring's writable wake; FIN closes the ring once every byte is in it.
"""

from __future__ import annotations

from collections import deque

from swactor.common.ringerrors import RingBroken
from swactor.common.ringport import ProducerEnd
from swactor.edge import credit, preamble
from swactor.edge.objtap import ObjectTap
from swactor.edge.pumpstate import RECV_FSM, Pump, RecvState
from swactor.edge.streamport import AppError, StreamPort
from swactor.v1 import common_pb2

R = RecvState


class RecvPump(Pump):
    def __init__(self, *, edge_id: int, ring: ProducerEnd, window: int, tap: ObjectTap | None = None) -> None:
        super().__init__(RECV_FSM, edge_id, ring.ring_id, tap)
        self.ring = ring
        self.window = max(1, min(window, ring.capacity))
        self.stream_id = 0
        self.delivered = preamble.PREAMBLE_LEN  # stream offset written into the ring
        self._pending: deque[memoryview] = deque()  # arrived, not yet in the ring
        self._eof = False

    @property
    def pending_bytes(self) -> int:
        return sum(len(c) for c in self._pending)

    def start(self, conn: StreamPort, stream_id: int, initial: bytes, eof: bool, now_us: int) -> bool:
        self.conn, self.stream_id = conn, stream_id
        self._set_state(R.STREAMING)
        return self.on_data(initial, eof, now_us)

    def on_data(self, data: bytes, end: bool, now_us: int) -> bool:
        if self.done:
            return False
        if data:
            self._pending.append(memoryview(data))
            if self.tap is not None:
                self.tap.feed(data, now_us)
        self._eof = self._eof or end
        return self._step(now_us)

    def on_ring_wake(self, now_us: int) -> bool:
        if self.conn is None or self.done:
            return False
        return self._step(now_us)

    def _step(self, now_us: int) -> bool:
        granted = False
        ring = self.ring
        try:
            while True:
                self._drain(now_us)
                granted = self._announce() or granted
                if self._pending or (not self._eof and ring.free() == 0):
                    if ring.arm_wait() is None:
                        continue  # space appeared between the check and the arm
                    self._set_state(R.BACKPRESSURED)
                    return granted
                break
            self._set_state(R.STREAMING)
            if self._eof:
                self._close_ring()
        except RingBroken as e:
            return self.fault(common_pb2.STREAM_FAULT_RING_FAULT, str(e), AppError.RING_FAULT) or granted
        return granted

    def _drain(self, now_us: int) -> None:
        pending = self._pending
        if not pending:
            return
        before = self.delivered
        try:
            while pending:
                chunk = pending[0]
                n = self.ring.write(chunk)
                self.delivered += n
                self.bytes += n
                if n < len(chunk):
                    pending[0] = chunk[n:]
                    return
                pending.popleft()
        finally:
            # `now_us` was read before this write: ring-rs wakes the consumer inside it, and on a
            # busy host the woken consumer may run (and report its load) before we'd read a clock.
            if self.tap is not None and self.delivered != before:
                self.tap.commit(self.delivered - preamble.PREAMBLE_LEN, now_us)

    def _announce(self) -> bool:
        conn = self.conn
        assert conn is not None
        announced, received = conn.credit(self.stream_id)
        if announced == 0:
            return False
        limit = credit.next_announcement(
            delivered=self.delivered, ring_free=self.ring.free(), window=self.window,
            announced=announced, received=received,
        )
        return limit is not None and conn.grant(self.stream_id, limit)

    def _close_ring(self) -> None:
        """FIN and every byte is in the ring: Open -> Closed, the worker reads to the end."""
        try:
            self.ring.close_stream()
        except RingBroken as e:  # the ring faulted under us: its consumer sees that instead
            self._log.warning("edge.ring_close_failed", detail=str(e))
        self._set_state(R.CLOSED)

    def fault(self, reason: int, detail: str, code: AppError | None = None) -> bool:
        """End with a fault; with `code`, STOP_SENDING so the peer faults too."""
        if self.done:
            return False
        self._pending.clear()
        conn, stop = self.conn, False
        if code is not None and conn is not None and not conn.closed:
            conn.stop_stream(self.stream_id, code)
            stop = True
        self._set_state(R.FAULTED, reason, detail)
        return stop

    def stop(self) -> bool:
        """StopEdge: stop reading (STOP_SENDING to the peer); the caller releases the ring."""
        conn, stop = self.conn, False
        self._pending.clear()
        if not self.done and conn is not None and not conn.closed:
            conn.stop_stream(self.stream_id, AppError.EDGE_STOPPED)
            stop = True
        self._set_state(R.STOPPED)
        return stop
