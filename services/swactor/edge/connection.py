"""One QUIC connection of the endpoint: timers, transmit, keepalive PINGs, events to the driver,
and the `streamport.StreamPort` the pumps and the edge table use (the only edge code that calls
aioquic's stream API)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from aioquic import tls
from aioquic.quic import events
from aioquic.quic.packet import QuicErrorCode

from swactor.common.events import get_logger
from swactor.edge.quic_conn import EdgeQuicConnection
from swactor.edge.streamport import new_uid
from swactor.edge.traffic import Traffic

if TYPE_CHECKING:
    from swactor.edge.endpoint import Endpoint

log = get_logger(component="COMPONENT_EDGE_DRIVER")


class PeerUnreachable(ConnectionError):
    pass


class PeerNotAuthorized(ConnectionError):
    pass


class ConnectionListener(Protocol):
    """What the driver hears from connections (called on the event loop, never blocking)."""

    def on_stream_data(self, conn: EdgeConnection, stream_id: int, data: bytes, end: bool) -> None: ...

    def on_stream_reset(self, conn: EdgeConnection, stream_id: int, error_code: int) -> None: ...

    def on_stop_sending(self, conn: EdgeConnection, stream_id: int, error_code: int) -> None: ...

    def on_progress(self, conn: EdgeConnection) -> None: ...

    def on_connection_lost(self, conn: EdgeConnection, reason: str, not_authorized: bool) -> None: ...


class EdgeConnection:
    """One QUIC connection: timers, transmit, keepalive, events out to the listener."""

    def __init__(self, endpoint: Endpoint, quic: EdgeQuicConnection, *, initiated_here: bool) -> None:
        self.endpoint = endpoint
        self.quic = quic
        self.initiated_here = initiated_here
        self.peer_addr: tuple[str, int] | None = None
        self.handshake: asyncio.Future[None] = endpoint.loop.create_future()
        self.closed = False
        self.last_rx = endpoint.loop.time()  # loop time of the last datagram from the peer
        self.uid = new_uid()
        self.cids: set[bytes] = set()  # our connection IDs the endpoint routes to this connection
        self.half_open: str | None = None  # admission slot (source address) until the handshake completes
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._transmit_handle: asyncio.Handle | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_ids = itertools.count(1)
        self.pings_acked = 0  # keepalive PINGs the peer acknowledged
        self.traffic = Traffic()  # datagrams and bytes: sent counted by transmit, received by the endpoint

    @property
    def peer_node_id(self) -> int | None:
        return self.quic.peer_node_id

    def counts(self) -> Traffic:
        """What this connection sent and received so far, with the packets its QUIC recovery declared lost."""
        self.traffic.lost_packets = self.quic.lost_packets
        return self.traffic

    @property
    def max_datagram_size(self) -> int:
        return self.quic.configuration.max_datagram_size

    # ---- StreamPort (streamport.py) ----

    def open_stream(self, first: bytes) -> int:
        stream_id = self.quic.get_next_available_stream_id(is_unidirectional=True)
        self.quic.send_stream_data(stream_id, first)
        return stream_id

    def send(self, stream_id: int, data: bytes | memoryview, end: bool = False) -> None:
        # aioquic copies into its stream buffer (bytearray += data): the caller may release `data`.
        self.quic.send_stream_data(stream_id, data, end_stream=end)  # type: ignore[arg-type]

    def queued(self, stream_id: int) -> int:
        return self.quic.queued_bytes(stream_id)

    def credit(self, stream_id: int) -> tuple[int, int]:
        return self.quic.stream_credit(stream_id)

    def grant(self, stream_id: int, limit: int) -> bool:
        return self.quic.grant_stream_credit(stream_id, limit)

    def stop_stream(self, stream_id: int, code: int) -> None:
        with contextlib.suppress(ValueError):  # the stream is gone already: nothing to stop
            self.quic.stop_stream(stream_id, code)
        self.transmit_soon()

    def reset_stream(self, stream_id: int, code: int) -> None:
        self.quic.reset_stream(stream_id, code)
        self.transmit_soon()

    # ---- sending ----

    def transmit(self) -> None:
        """Send what the connection has to send now and re-arm its timer."""
        self._transmit_handle = None
        if self.closed:
            return
        loop = self.endpoint.loop
        sendto = self.endpoint.sendto
        traffic = self.traffic
        for data, addr in self.quic.datagrams_to_send(now=loop.time()):
            sendto(data, addr)
            traffic.sent_bytes += len(data)
            traffic.sent_datagrams += 1
        timer_at = self.quic.get_timer()
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = loop.call_at(timer_at, self._on_timer)
        self._timer_at = timer_at

    def transmit_soon(self) -> None:
        if self._transmit_handle is None and not self.closed:
            self._transmit_handle = self.endpoint.loop.call_soon(self.transmit)

    def _on_timer(self) -> None:
        self._timer = None
        now = max(self._timer_at or 0.0, self.endpoint.loop.time())
        self._timer_at = None
        self.quic.handle_timer(now=now)
        self.process_events()
        self.transmit()

    def expect_handshake(self, timeout: float, expired: Callable[[EdgeConnection], None]) -> None:
        """Call `expired(self)` if the handshake has not settled (handshake_settled) within `timeout`."""
        self._handshake_timer = self.endpoint.loop.call_later(timeout, self._handshake_timer_fired, expired)

    def _handshake_timer_fired(self, expired: Callable[[EdgeConnection], None]) -> None:
        self._handshake_timer = None
        expired(self)

    def handshake_settled(self) -> None:
        """The handshake completed or the connection is gone: its timeout no longer applies."""
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def start_keepalive(self) -> None:
        if self._keepalive is None:
            self._keepalive = self.endpoint.loop.call_later(self.endpoint.config.keepalive_interval, self._on_keepalive)

    def _on_keepalive(self) -> None:
        self._keepalive = None
        if self.closed:
            return
        if self.handshake.done():
            self.quic.send_ping(next(self._ping_ids))
            self.transmit()
        self._keepalive = self.endpoint.loop.call_later(self.endpoint.config.keepalive_interval, self._on_keepalive)

    def cancel_timers(self) -> None:
        for handle in (self._timer, self._keepalive, self._transmit_handle, self._handshake_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._keepalive = self._transmit_handle = self._handshake_timer = None

    def refused_here(self) -> bool:
        """True when this side refused the peer's certificate on an accepted connection."""
        return self.quic.refused_reason is not None and not self.initiated_here

    def close(self, error_code: int = QuicErrorCode.NO_ERROR, reason: str = "") -> None:
        if not self.closed:
            self.quic.close(error_code=error_code, reason_phrase=reason)
            self.transmit()

    # ---- events ----

    def process_events(self) -> None:
        listener = self.endpoint.listener
        quic = self.quic
        while (event := quic.next_event()) is not None:
            if isinstance(event, events.StreamDataReceived):
                listener.on_stream_data(self, event.stream_id, event.data, event.end_stream)
            elif isinstance(event, events.HandshakeCompleted):
                self.endpoint.connection_established(self)
            elif isinstance(event, events.StreamReset):
                listener.on_stream_reset(self, event.stream_id, event.error_code)
            elif isinstance(event, events.StopSendingReceived):
                listener.on_stop_sending(self, event.stream_id, event.error_code)
            elif isinstance(event, events.ConnectionIdIssued):
                self.endpoint.add_cid(self, event.connection_id)
            elif isinstance(event, events.ConnectionIdRetired):
                self.endpoint.drop_cid(self, event.connection_id)
            elif isinstance(event, events.ConnectionTerminated):
                self._terminated(event)
                return
            elif isinstance(event, events.PingAcknowledged):
                self.pings_acked += 1
        listener.on_progress(self)  # ACKs may have made room in send queues

    def _terminated(self, event: events.ConnectionTerminated) -> None:
        self.closed = True
        self.cancel_timers()
        established = self.handshake.done()  # only a completed handshake has set it by now
        refused = self.quic.refused_reason
        reason = refused or f"{event.reason_phrase or 'closed'} (code {event.error_code:#x})"
        # TLS alert bad_certificate (42) surfaces as CRYPTO_ERROR 0x100 + 42 on the other side.
        not_authorized = refused is not None or event.error_code == 0x100 + tls.AlertDescription.bad_certificate
        if not self.handshake.done():
            exc: Exception = PeerNotAuthorized(reason) if not_authorized else PeerUnreachable(reason)
            self.handshake.set_exception(exc)
            self.handshake.exception()  # mark retrieved: the dialer may have given up already
        self.endpoint.connection_gone(self)
        if not established and not self.initiated_here:
            # A stranger's handshake that never completed: counted by admission (summary), no
            # line of its own, and no stream can exist on it.
            log.debug("edge.connection_closed", peer=str(self.peer_addr), reason=reason, not_authorized=not_authorized)
            return
        log.info(
            "edge.connection_closed",
            peer_node_id=self.peer_node_id or 0,
            peer=str(self.peer_addr),
            reason=reason,
            not_authorized=not_authorized,
        )
        self.endpoint.listener.on_connection_lost(self, reason, not_authorized)
