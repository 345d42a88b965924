"""Pins the aioquic 1.7.2 private behaviour quic_conn.py relies on, with two in-memory connections."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from aioquic import tls
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from swactor.edge.config import ALPN
from swactor.edge.identity import EdgeIdentity, create_identity, fingerprint
from swactor.edge.quic_conn import EdgeQuicConnection

CLIENT_ADDR = ("1.2.3.4", 1234)
SERVER_ADDR = ("2.3.4.5", 4433)
INITIAL = 64 << 10
_CLOCK = [0.0]  # virtual time, monotonic across exchanges


def _cfg(ident: EdgeIdentity | None, is_client: bool, mds: int = 1400) -> QuicConfiguration:
    cfg = QuicConfiguration(
        is_client=is_client, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE,
        max_stream_data=INITIAL, max_data=16 << 20, max_datagram_size=mds,
    )
    if ident is not None:
        cfg.certificate, cfg.private_key = ident.certificate, ident.private_key
    return cfg


def _pin_to(ident: EdgeIdentity, node_id: int):  # type: ignore[no-untyped-def]
    def pin(cert):  # type: ignore[no-untyped-def]
        if fingerprint(cert) != ident.fingerprint:
            raise tls.AlertBadCertificate("not pinned")
        return node_id
    return pin


def _pair(tmp: Path, *, client_ident: EdgeIdentity | None = None, stock_server: bool = False, mds: int = 1400):  # type: ignore[no-untyped-def]
    cid = create_identity(tmp / "c.pem", tmp / "c.key", 1)
    sid = create_identity(tmp / "s.pem", tmp / "s.key", 2)
    client = EdgeQuicConnection(
        configuration=_cfg(client_ident or cid, True, mds), pin=_pin_to(sid, 2), connection_window=16 << 20, max_streams_uni=8
    )
    if stock_server:
        server: QuicConnection = QuicConnection(configuration=_cfg(sid, False), original_destination_connection_id=client.original_destination_connection_id)
    else:
        server = EdgeQuicConnection(
            configuration=_cfg(sid, False), pin=_pin_to(cid, 1), connection_window=16 << 20, max_streams_uni=8,
            original_destination_connection_id=client.original_destination_connection_id,
        )
    client.connect(SERVER_ADDR, now=_CLOCK[0])
    return client, server


def _exchange(client: QuicConnection, server: QuicConnection, rounds: int = 50) -> None:
    """Shuttle datagrams until both sides are quiet, firing pacing/ACK timers on a virtual clock."""
    now = _CLOCK[0]
    for _ in range(rounds):
        _CLOCK[0] = now
        moved = 0
        for data, _addr in client.datagrams_to_send(now=now):
            server.receive_datagram(data, CLIENT_ADDR, now=now)
            moved += 1
        for data, _addr in server.datagrams_to_send(now=now):
            client.receive_datagram(data, SERVER_ADDR, now=now)
            moved += 1
        if moved:
            continue
        timers = [t for t in (client.get_timer(), server.get_timer()) if t is not None and t < now + 0.5]
        if not timers:
            return
        now = max(now, min(timers))
        for conn in (client, server):
            t = conn.get_timer()
            if t is not None and t <= now:
                conn.handle_timer(now=now)


def _drain(conn: QuicConnection) -> list[events.QuicEvent]:
    out = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def test_mutual_pinning_handshake_names_peer(tmp_path: Path) -> None:
    client, server = _pair(tmp_path)
    _exchange(client, server)
    assert any(isinstance(e, events.HandshakeCompleted) for e in _drain(client))
    assert any(isinstance(e, events.HandshakeCompleted) for e in _drain(server))
    assert client.peer_node_id == 2 and server.peer_node_id == 1  # type: ignore[attr-defined]


def test_client_with_foreign_certificate_is_refused(tmp_path: Path) -> None:
    stranger = create_identity(tmp_path / "x.pem", tmp_path / "x.key", 9)
    client, server = _pair(tmp_path, client_ident=stranger)
    _exchange(client, server)
    assert server.refused_reason is not None  # type: ignore[attr-defined]
    term = [e for e in _drain(client) if isinstance(e, events.ConnectionTerminated)]
    assert term and term[0].error_code == 0x100 + tls.AlertDescription.bad_certificate


def test_client_without_certificate_is_refused(tmp_path: Path) -> None:
    client, server = _pair(tmp_path)
    client.tls.certificate = None  # type: ignore[attr-defined]
    client.tls.certificate_private_key = None  # type: ignore[attr-defined]
    _exchange(client, server)
    assert server.refused_reason == "client sent no certificate"  # type: ignore[attr-defined]
    assert not any(isinstance(e, events.HandshakeCompleted) for e in _drain(server))


def test_stock_aioquic_grants_credit_on_arrival(tmp_path: Path) -> None:
    """The premise: unmodified aioquic raises the window as data arrives, consumed or not."""
    client, server = _pair(tmp_path, stock_server=True)
    client._pin = lambda cert: 2  # type: ignore[attr-defined]
    _exchange(client, server)
    sid = client.get_next_available_stream_id(is_unidirectional=True)
    client.send_stream_data(sid, b"x" * (4 << 20))
    _exchange(client, server, rounds=5000)
    assert server._streams[sid].receiver.highest_offset > 4 * INITIAL


def test_credit_only_moves_when_granted(tmp_path: Path) -> None:
    client, server = _pair(tmp_path)
    _exchange(client, server)
    sid = client.get_next_available_stream_id(is_unidirectional=True)
    client.send_stream_data(sid, b"x" * (4 << 20))
    _exchange(client, server, rounds=5000)
    assert server.stream_credit(sid) == (INITIAL, INITIAL)  # stalled at the initial window
    assert client.queued_bytes(sid) == (4 << 20) - INITIAL  # only the acknowledged window left the queue
    assert client.send_credit(sid) == 0
    assert server.grant_stream_credit(sid, INITIAL + 100_000)
    assert not server.grant_stream_credit(sid, INITIAL)  # never lowers
    _exchange(client, server, rounds=5000)
    assert server.stream_credit(sid) == (INITIAL + 100_000, INITIAL + 100_000)
    assert client.queued_bytes(sid) == (4 << 20) - INITIAL - 100_000  # acked bytes left the queue


def test_no_bidirectional_streams_and_stream_cap(tmp_path: Path) -> None:
    client, server = _pair(tmp_path)
    _exchange(client, server)
    assert client._remote_max_streams_bidi == 0
    assert client._remote_max_streams_uni == 8


@pytest.mark.parametrize("n", [1, 3])
def test_queued_bytes_counts_unacked(tmp_path: Path, n: int) -> None:
    client, server = _pair(tmp_path)
    _exchange(client, server)
    sid = client.get_next_available_stream_id(is_unidirectional=True)
    for _ in range(n):
        client.send_stream_data(sid, b"y" * 1000)
    assert client.queued_bytes(sid) == n * 1000
    _exchange(client, server)
    assert client.queued_bytes(sid) == 0


def test_large_datagrams_carry_several_capped_frames(tmp_path: Path) -> None:
    """aioquic's STREAM frame length is 2 bytes (<= 16383): 60 KB datagrams need several frames."""
    client, server = _pair(tmp_path, mds=60000)
    _exchange(client, server)
    _drain(server)
    sizes: list[int] = []
    build = client.datagrams_to_send

    def recording(now: float):  # type: ignore[no-untyped-def]
        out = build(now=now)
        sizes.extend(len(d) for d, _ in out)
        return out

    client.datagrams_to_send = recording  # type: ignore[method-assign]
    sid = client.get_next_available_stream_id(is_unidirectional=True)
    payload = bytes(range(256)) * 256  # 64 KiB, within the initial credit
    client.send_stream_data(sid, payload, end_stream=True)
    _exchange(client, server, rounds=500)
    got = b"".join(e.data for e in _drain(server) if isinstance(e, events.StreamDataReceived))
    assert got == payload
    assert max(sizes) > 3 * 16383 and max(sizes) <= 60000  # several frames per datagram
