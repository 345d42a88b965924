"""Connection admission: whether a datagram from an unknown address may start a QUIC connection.

The endpoint asks `admit_new` for every datagram whose destination connection id it does not
know, before it allocates any connection state. Today's policy is QUIC's own minimum: a
long-header INITIAL of at least 1200 bytes (RFC 9000 §14.1, anti-amplification) with a version
we speak. Who the peer is gets decided later, in the TLS handshake (certificate pinning,
quic_conn.py); what a peer may send, per stream, in `table.EdgeTable._stream_arrived`.
Address validation (Retry tokens) and caps on concurrent handshakes belong here.
"""

from __future__ import annotations

from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE
from aioquic.quic.packet import QuicHeader, QuicPacketType


class ConnectionAdmission:
    def __init__(self, supported_versions: list[int]) -> None:
        self.supported_versions = supported_versions
        self.refused = 0  # datagrams that could not start a connection

    def admit_new(self, header: QuicHeader, datagram_len: int, addr: tuple[str, int], now: float) -> bool:
        ok = (
            header.packet_type == QuicPacketType.INITIAL
            and datagram_len >= SMALLEST_MAX_DATAGRAM_SIZE
            and header.version is not None
            and header.version in self.supported_versions
        )
        if not ok:
            self.refused += 1
        return ok
