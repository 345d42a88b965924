"""aioquic QuicConnection with ring-driven receive credit, bounded send queues and pinned TLS.

This touches aioquic 1.7.2 private API (pinned by tests/edge/test_quic_conn.py):

* Stock aioquic grants credit on *arrival*: `_write_stream_limits` doubles a stream's
  MAX_STREAM_DATA once half of it has been received, and `_write_connection_limits` doubles
  MAX_DATA the same way, whether or not the application consumed anything. Here a stream's
  credit only moves when the driver calls `grant_stream_credit` (as ring space frees, see
  credit.py); a stream nobody claimed keeps its initial window. MAX_DATA is kept at
  `used + connection_window`; the sum of live stream credits is what really bounds memory,
  and the number of concurrent peer streams is capped by MAX_STREAMS_UNI.
* `send_stream_data` buffers without limit; `queued_bytes` exposes the unsent + unacknowledged
  bytes of a stream so a send-pump keeps it under `send_queue_limit`.
* aioquic writes one STREAM frame per stream per packet with a 2-byte length (<= 16383 bytes),
  so a datagram above ~16 KiB carries a corrupt frame. `_write_stream_frame` here caps each
  frame at MAX_FRAME_DATA and writes as many frames as the packet holds, so large datagrams
  (loopback, jumbo frames) work and per-packet costs are paid once per datagram.
* `heard_from_peer`: whether any packet of the peer decrypted yet (aioquic leaves a server
  connection in FIRSTFLIGHT until one does), so the endpoint drops junk Initials at once.
* `lost_packets`: the packets QUIC loss detection declared lost (RFC 9002 §6.1, aioquic's
  `_on_packets_lost` with a congestion event), counted by swapping the connection's
  QuicPacketRecovery for a subclass; the probes a PTO retransmits early are not losses.
* Both sides present a certificate (the server asks for one via the TLS context's
  `_request_client_certificate`) and each pins the peer's certificate with `pin(cert)`, which
  raises a TLS alert for a non-member: the handshake then fails with a CRYPTO_ERROR on both ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aioquic import tls
from aioquic.buffer import Buffer, size_uint_var
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import (
    CONNECTION_LIMIT_FRAME_CAPACITY,
    MAX_STREAM_DATA_FRAME_CAPACITY,
    QuicConnection,
    QuicConnectionState,
)
from aioquic.quic.packet import QuicFrameType
from aioquic.quic.packet_builder import QuicPacketBuilder, QuicSentPacket
from aioquic.quic.recovery import QuicPacketRecovery, QuicPacketSpace
from aioquic.quic.stream import QuicStream
from cryptography import x509

# aioquic encodes a STREAM frame's length as a 2-byte varint.
MAX_FRAME_DATA = 16383

# Returns the peer's node id or raises tls.AlertBadCertificate.
PinFn = Callable[[x509.Certificate], int]


class _PinnedTls(tls.Context):
    """tls.Context that checks the peer certificate against a pin as soon as it arrives."""

    pin: PinFn
    pinned_node_id: int | None
    refused: str | None

    def _set_peer_certificate(self, certificate: tls.Certificate) -> None:
        super()._set_peer_certificate(certificate)
        assert self._peer_certificate is not None
        try:
            self.pinned_node_id = self.pin(self._peer_certificate)
        except tls.AlertBadCertificate as e:
            self.refused = str(e) or "certificate not pinned"
            raise

    def _server_handle_certificate(self, input_buf: Buffer) -> None:
        super()._server_handle_certificate(input_buf)
        if self._peer_certificate is None:  # an empty Certificate: the client has no identity
            self.refused = "client sent no certificate"
            raise tls.AlertBadCertificate("a client certificate is required")


def _credit_frame(builder: QuicPacketBuilder, frame_type: int, capacity: int, on_delivery: Callable[..., None],
                  limit: Any, *values: int) -> None:
    """Write one credit frame (MAX_STREAM_DATA, MAX_DATA, MAX_STREAMS_*) as aioquic does: its values as
    varints, and `on_delivery(delivery, limit)` when the packet carrying it is acknowledged or lost."""
    buf = builder.start_frame(frame_type, capacity=capacity, handler=on_delivery, handler_args=(limit,))
    for value in values:
        buf.push_uint_var(value)


class _CountingRecovery(QuicPacketRecovery):
    """aioquic's loss recovery, counting the packets it declares lost."""

    lost_packets: int

    def _on_packets_lost(self, *, congestion_event: bool = True, now: float, packets: Iterable[QuicSentPacket],
                         persistent_congestion: bool = False, space: QuicPacketSpace) -> None:
        if congestion_event:
            packets = tuple(packets)
            self.lost_packets += len(packets)
        super()._on_packets_lost(congestion_event=congestion_event, now=now, packets=packets,
                                 persistent_congestion=persistent_congestion, space=space)


class EdgeQuicConnection(QuicConnection):
    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        pin: PinFn,
        connection_window: int,
        max_streams_uni: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(configuration=configuration, **kwargs)
        self._loss.__class__ = _CountingRecovery
        self._loss.lost_packets = 0  # type: ignore[attr-defined]
        self._pin = pin
        self._connection_window = connection_window
        self._local_max_data.value = self._local_max_data.sent = connection_window
        self._local_max_streams_uni.value = self._local_max_streams_uni.sent = max_streams_uni
        self._local_max_streams_bidi.value = self._local_max_streams_bidi.sent = 0
        self._local_max_stream_data_bidi_local = 0
        self._local_max_stream_data_bidi_remote = 0

    # ---- identity ----

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        self.tls.__class__ = _PinnedTls
        ctx: _PinnedTls = self.tls  # type: ignore[assignment]
        ctx.pin = self._pin
        ctx.pinned_node_id = None
        ctx.refused = None
        if not self._is_client:
            ctx._request_client_certificate = True

    @property
    def lost_packets(self) -> int:
        """Packets declared lost since the connection started (RFC 9002 §6.1)."""
        return self._loss.lost_packets  # type: ignore[attr-defined, no-any-return]

    @property
    def peer_node_id(self) -> int | None:
        return getattr(self.tls, "pinned_node_id", None) if hasattr(self, "tls") else None

    @property
    def heard_from_peer(self) -> bool:
        """True once a packet from the peer decrypted (a junk Initial never gets here)."""
        return self._state is not QuicConnectionState.FIRSTFLIGHT

    @property
    def refused_reason(self) -> str | None:
        return getattr(self.tls, "refused", None) if hasattr(self, "tls") else None

    def _stream(self, stream_id: int) -> QuicStream | None:
        # aioquic has no public per-stream accessor (credit, queue): this subclass is the one
        # place in swactor that reads its stream table; everyone else asks the methods below.
        return self._streams.get(stream_id)

    # ---- receive credit ----

    def grant_stream_credit(self, stream_id: int, limit: int) -> bool:
        """Raise the stream's MAX_STREAM_DATA to `limit` (never lowers); True if it moved."""
        stream = self._stream(stream_id)
        if stream is None or limit <= stream.max_stream_data_local:
            return False
        stream.max_stream_data_local = limit
        return True

    def stream_credit(self, stream_id: int) -> tuple[int, int]:
        """(announced limit, highest offset received) of a receiving stream; (0, 0) if gone."""
        stream = self._stream(stream_id)
        if stream is None:
            return 0, 0
        return stream.max_stream_data_local, stream.receiver.highest_offset

    def _write_stream_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream) -> None:
        # Unlike aioquic, never raise the limit here: only grant_stream_credit moves it.
        if stream.max_stream_data_local and stream.max_stream_data_local_sent != stream.max_stream_data_local:
            _credit_frame(builder, QuicFrameType.MAX_STREAM_DATA, MAX_STREAM_DATA_FRAME_CAPACITY,
                          self._on_max_stream_data_delivery, stream, stream.stream_id, stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local

    def _write_connection_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace) -> None:
        max_data = self._local_max_data
        if max_data.value - max_data.used < self._connection_window // 2:
            max_data.value = max_data.used + self._connection_window
        for limit in (max_data, self._local_max_streams_bidi, self._local_max_streams_uni):
            if limit is not max_data and limit.sent - limit.used >= limit.value - limit.sent:
                continue  # batch MAX_STREAMS as aioquic does
            if limit.value != limit.sent:
                _credit_frame(builder, limit.frame_type, CONNECTION_LIMIT_FRAME_CAPACITY,
                              self._on_connection_limit_delivery, limit, limit.value)
                limit.sent = limit.value

    # ---- sending ----

    def _write_stream_frame(
        self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream, max_offset: int
    ) -> int:
        """aioquic's frame writer, with frames capped at MAX_FRAME_DATA and repeated while the
        packet has room. `max_offset` is absolute (stream and connection credit), so it holds
        for every frame of the loop. Returns the new highest offset minus the old (credit used)."""
        sender = stream.sender
        start_highest = sender.highest_offset
        while True:
            overhead = 3 + size_uint_var(stream.stream_id) + (size_uint_var(sender.next_offset) if sender.next_offset else 0)
            room = builder.remaining_flight_space - overhead
            if room <= 0:
                break
            frame = sender.get_frame(min(room, MAX_FRAME_DATA), max_offset)
            if frame is None:
                break
            frame_type = QuicFrameType.STREAM_BASE | 2  # with length
            if frame.offset:
                frame_type |= 4
            if frame.fin:
                frame_type |= 1
            buf = builder.start_frame(
                frame_type,
                capacity=overhead,
                handler=sender.on_data_delivery,
                handler_args=(frame.offset, frame.offset + len(frame.data), frame.fin),
            )
            buf.push_uint_var(stream.stream_id)
            if frame.offset:
                buf.push_uint_var(frame.offset)
            buf.push_uint16(len(frame.data) | 0x4000)
            buf.push_bytes(frame.data)
            if frame.fin or not frame.data:
                break
        return sender.highest_offset - start_highest

    # ---- bounded sending ----

    def queued_bytes(self, stream_id: int) -> int:
        """Bytes handed to the stream and not yet acknowledged (0 when the stream is gone)."""
        stream = self._stream(stream_id)
        if stream is None:
            return 0
        sender = stream.sender
        return sender._buffer_stop - sender._buffer_start

    def send_credit(self, stream_id: int) -> int:
        """Bytes the peer's flow control lets this stream send beyond what is already queued."""
        stream = self._stream(stream_id)
        if stream is None:
            return 0
        return max(0, stream.max_stream_data_remote - stream.sender._buffer_stop)
