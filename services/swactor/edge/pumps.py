"""Recv- and send-pumps (spec §25): byte-blind movers between a ring and one QUIC uni-stream.

Both are callbacks on the event loop, woken by ring eventfds (loop.add_reader) or by QUIC
events; neither parses objects nor sends per-object messages.

RecvPump: Streaming -> Backpressured (ring full) -> Streaming ... -> Closed | Faulted.
    Stream credit follows ring space (credit.py): the peer may only send what the ring can take.
SendPump: WaitingForConnection -> WaitingForBytes -> (OpenStream) Streaming <-> Backpressured
    -> Closed | Faulted. At most `send_queue_limit` bytes sit in aioquic (unsent + unacked);
    consume advances once aioquic holds its copy.

An optional ObjectTap (objtap.py) sees each moved span after the move; it reads record headers
only, and the pump's movement does not depend on it.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from swactor.common.events import get_logger
from swactor.common.ringerrors import RingBroken, RingClosed
from swactor.common.ringport import ConsumerEnd, ProducerEnd
from swactor.edge import credit, preamble
from swactor.edge.objtap import ObjectTap
from swactor.v1 import common_pb2

if TYPE_CHECKING:
    from swactor.edge.connection import EdgeConnection

log = get_logger(component="COMPONENT_EDGE_DRIVER")


class AppError(enum.IntEnum):
    """QUIC application error codes on RESET_STREAM / STOP_SENDING between edge drivers."""

    EDGE_STOPPED = 0x1
    RENDEZVOUS_TIMEOUT = 0x2
    MALFORMED_PREAMBLE = 0x3
    RING_FAULT = 0x4
    DUPLICATE_STREAM = 0x5
    DRIVER_STOPPING = 0x6


def reason_for_remote_code(code: int) -> int:
    """StreamFaultReason for a reset/stop the peer sent with application error `code`."""
    return {
        AppError.RENDEZVOUS_TIMEOUT: common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT,
        AppError.MALFORMED_PREAMBLE: common_pb2.STREAM_FAULT_MALFORMED_PREAMBLE,
        AppError.DUPLICATE_STREAM: common_pb2.STREAM_FAULT_UNKNOWN_EDGE,
    }.get(code, common_pb2.STREAM_FAULT_STREAM_RESET)


class PumpState(enum.Enum):
    WAITING_FOR_CONNECTION = "WaitingForConnection"
    WAITING_FOR_BYTES = "WaitingForBytes"
    STREAMING = "Streaming"
    BACKPRESSURED = "Backpressured"
    CLOSED = "Closed"
    FAULTED = "Faulted"
    STOPPED = "Stopped"


TERMINAL = {PumpState.CLOSED, PumpState.FAULTED, PumpState.STOPPED}

# (pump, closed_cleanly, fault reason, detail) -> driver
EndFn = Callable[["RecvPump | SendPump", bool, int, str], None]


class RecvPump:
    def __init__(
        self,
        *,
        edge_id: int,
        ring: ProducerEnd,
        conn: EdgeConnection,
        stream_id: int,
        window: int,
        on_end: EndFn,
        tap: ObjectTap | None = None,
    ) -> None:
        self.edge_id = edge_id
        self.tap = tap
        self.ring = ring
        self.conn = conn
        self.stream_id = stream_id
        self.window = max(1, min(window, ring.capacity))
        self.on_end = on_end
        self.state = PumpState.STREAMING
        self.delivered = preamble.PREAMBLE_LEN  # stream offset written into the ring
        self.bytes = 0
        self._pending: deque[memoryview] = deque()
        self._eof = False
        self._loop = asyncio.get_running_loop()
        self._wake_fd = ring.fileno()
        self._loop.add_reader(self._wake_fd, self._on_writable)

    # ---- inputs ----

    def on_data(self, data: bytes, end: bool) -> None:
        if self.state in TERMINAL:
            return
        if data:
            self._pending.append(memoryview(data))
            if self.tap is not None:
                self.tap.feed(data, time.time_ns() // 1000)
        self._eof = self._eof or end
        self._step()

    def _on_writable(self) -> None:
        self.ring.ack()
        if self.state not in TERMINAL:
            self._step()
            self.conn.transmit()

    # ---- the pump ----

    def _step(self) -> None:
        try:
            while True:
                self._drain()
                self._announce()
                if self._pending or (not self._eof and self.ring.free() == 0):
                    if self.ring.arm_wait() is None:
                        continue  # space appeared between the check and the arm
                    self.state = PumpState.BACKPRESSURED
                    return
                break
        except RingBroken as e:
            self._fail(common_pb2.STREAM_FAULT_RING_FAULT, str(e), AppError.RING_FAULT)
            return
        self.state = PumpState.STREAMING
        if self._eof:
            try:
                self.ring.close_stream()
            except RingBroken as e:  # the ring faulted under us: its consumer sees that instead
                log.warning("edge.ring_close_failed", ring_id=self.ring.ring_id, detail=str(e))
            self._finish(True, 0, "")

    def _drain(self) -> None:
        pending = self._pending
        before = self.delivered
        # Stamped before the write: ring-rs wakes the consumer inside it, and on a busy host the
        # woken consumer may run (and report its load) before this process reads the clock again.
        now_us = time.time_ns() // 1000 if self.tap is not None and pending else 0
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
            if self.tap is not None and self.delivered != before:
                self.tap.commit(self.delivered - preamble.PREAMBLE_LEN, now_us)

    def _announce(self) -> None:
        quic = self.conn.quic
        announced, received = quic.stream_credit(self.stream_id)
        if announced == 0:
            return
        limit = credit.next_announcement(
            delivered=self.delivered,
            ring_free=self.ring.free(),
            window=self.window,
            announced=announced,
            received=received,
        )
        if limit is not None and quic.grant_stream_credit(self.stream_id, limit):
            self.conn.transmit_soon()

    # ---- endings ----

    def _fail(self, reason: int, detail: str, code: AppError | None) -> None:
        if code is not None and not self.conn.closed:
            try:
                self.conn.quic.stop_stream(self.stream_id, code)
                self.conn.transmit_soon()
            except ValueError:
                pass
        self._finish(False, reason, detail)

    def fault(self, reason: int, detail: str, code: AppError | None = None) -> None:
        if self.state not in TERMINAL:
            self._fail(reason, detail, code)

    def _finish(self, clean: bool, reason: int, detail: str) -> None:
        self.state = PumpState.CLOSED if clean else PumpState.FAULTED
        self._pending.clear()
        self._loop.remove_reader(self._wake_fd)
        self.on_end(self, clean, reason, detail)

    def stop(self) -> None:
        """StopEdge: stop reading (STOP_SENDING to the peer), never touch the ring again."""
        if self.state not in TERMINAL:
            self._loop.remove_reader(self._wake_fd)
            self._pending.clear()
            if not self.conn.closed:
                try:
                    self.conn.quic.stop_stream(self.stream_id, AppError.EDGE_STOPPED)
                    self.conn.transmit_soon()
                except ValueError:
                    pass
        self.state = PumpState.STOPPED
        self.ring.release()


class SendPump:
    def __init__(
        self,
        *,
        edge_id: int,
        ring: ConsumerEnd,
        queue_limit: int,
        on_end: EndFn,
        on_blocked: Callable[[SendPump], None],
        tap: ObjectTap | None = None,
    ) -> None:
        self.edge_id = edge_id
        self.tap = tap
        self.ring = ring
        self.queue_limit = queue_limit
        self.on_end = on_end
        self.on_blocked = on_blocked  # the driver wakes network-blocked pumps on QUIC progress
        self.state = PumpState.WAITING_FOR_CONNECTION
        self.conn: EdgeConnection | None = None
        self.stream_id: int | None = None
        self.bytes = 0
        self._loop = asyncio.get_running_loop()
        self._wake_fd = ring.fileno()
        self._reading = False

    def attach(self, conn: EdgeConnection) -> None:
        """The connection is up: wait for committed bytes."""
        self.conn = conn
        self.state = PumpState.WAITING_FOR_BYTES
        self._loop.add_reader(self._wake_fd, self._on_readable)
        self._reading = True
        self.step()

    def _on_readable(self) -> None:
        self.ring.ack()
        self.step()

    def step(self) -> None:
        if self.state in TERMINAL or self.conn is None:
            return
        conn = self.conn
        quic = conn.quic
        sent = False
        try:
            while True:
                room = self.queue_limit - (quic.queued_bytes(self.stream_id) if self.stream_id is not None else 0)
                if room <= 0:
                    self.state = PumpState.BACKPRESSURED
                    self.on_blocked(self)
                    break
                try:
                    view = self.ring.readable(room)
                except RingClosed:
                    self._close_stream()
                    return
                if not view:
                    if self.ring.arm_wait() is None:
                        continue
                    if self.stream_id is not None:
                        self.state = PumpState.STREAMING
                    break
                if self.stream_id is None:  # OpenStream on the first committed bytes
                    self.stream_id = quic.get_next_available_stream_id(is_unidirectional=True)
                    quic.send_stream_data(self.stream_id, preamble.encode(self.edge_id))
                    self.state = PumpState.STREAMING
                n = len(view)
                # aioquic copies into its stream buffer (bytearray += view), so one copy only.
                quic.send_stream_data(self.stream_id, view)  # type: ignore[arg-type]
                if self.tap is not None:
                    self.tap.feed(view, time.time_ns() // 1000)
                view.release()
                self.ring.advance_consume(n)
                self.bytes += n
                sent = True
        except RingBroken as e:
            self.fault(common_pb2.STREAM_FAULT_RING_FAULT, str(e), AppError.RING_FAULT)
            return
        if sent:
            conn.transmit()

    def _close_stream(self) -> None:
        """The producer closed the ring and everything is handed to QUIC: FIN."""
        assert self.conn is not None
        if self.stream_id is not None:
            self.conn.quic.send_stream_data(self.stream_id, b"", end_stream=True)
            self.conn.transmit()
        self._end(PumpState.CLOSED)
        self.on_end(self, True, 0, "")

    def fault(self, reason: int, detail: str, code: AppError | None = None) -> None:
        if self.state in TERMINAL:
            return
        if code is not None and self.stream_id is not None and self.conn is not None and not self.conn.closed:
            self.conn.quic.reset_stream(self.stream_id, code)
            self.conn.transmit_soon()
        self._end(PumpState.FAULTED)
        self.on_end(self, False, reason, detail)

    def _end(self, state: PumpState) -> None:
        self.state = state
        if self._reading:
            self._loop.remove_reader(self._wake_fd)
            self._reading = False

    def stop(self) -> None:
        """StopEdge: FIN after what QUIC already holds; the ring is never touched again."""
        if self.state not in TERMINAL:
            if self.stream_id is not None and self.conn is not None and not self.conn.closed:
                self.conn.quic.send_stream_data(self.stream_id, b"", end_stream=True)
                self.conn.transmit_soon()
            self._end(PumpState.STOPPED)
        self.state = PumpState.STOPPED
        self.ring.release()
