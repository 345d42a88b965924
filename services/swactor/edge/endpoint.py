"""The host's one QUIC endpoint (spec §24): one UDP socket for dialled and accepted connections.

* Datagrams are demultiplexed by destination connection id (as aioquic's QuicServer does), read
  in batches of up to READ_BATCH per wakeup, and each touched connection transmits once per
  batch, so ACKs and credit updates coalesce.
* Connections are cached per (peer node_id, ALPN): `connection_to(peer)` reuses an established
  connection in either direction, or dials one; concurrent callers share the dial.
* Keepalive: every connection PINGs every `keepalive_interval`, so a quiet persistent edge is
  not closed by the idle timeout, and a dead peer is noticed within `idle_timeout`.
* Every connection authenticates the peer by certificate fingerprint (quic_conn); which
  datagrams may start a connection at all is `admission.ConnectionAdmission`'s call (Retry,
  half-open caps, handshake rates). An admitted Initial that does not decrypt is junk: its
  connection is dropped before any timer is armed. An accepted connection that has not finished
  its handshake within `handshake_timeout` is closed.
* Cleanup is O(1) per connection: each connection knows its own CIDs, each peer its connections.
* Refusals are counted, never logged one by one, and a flood of strangers' Initials is filtered in
  the kernel: guard.py, the timers around admission.
The per-connection machinery (timers, keepalive, events) is in connection.py.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from aioquic import tls
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.packet import encode_quic_retry, encode_quic_version_negotiation
from cryptography import x509

from swactor.common.events import get_logger
from swactor.edge.admission import (
    AdmissionLimits,
    Admit,
    ConnectionAdmission,
    Drop,
    Refusal,
    SendRetry,
    SendVersionNegotiation,
)
from swactor.edge.config import ALPN, EdgeConfig
from swactor.edge.connection import ConnectionListener, EdgeConnection, PeerUnreachable
from swactor.edge.guard import AdmissionGuard
from swactor.edge.identity import EdgeIdentity, fingerprint
from swactor.edge.mtu import datagram_size_for
from swactor.edge.peers import PeerDirectory, parse_endpoint
from swactor.edge.quic_conn import EdgeQuicConnection
from swactor.edge.traffic import Traffic, TrafficLedger

READ_BATCH = 128
CID_LEN = 8
log = get_logger(component="COMPONENT_EDGE_DRIVER")


@dataclass(eq=False, kw_only=True)
class Endpoint:
    node_id: int
    identity: EdgeIdentity
    config: EdgeConfig
    directory: PeerDirectory
    listener: ConnectionListener
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop, init=False)
    sock: socket.socket | None = field(default=None, init=False)
    address: tuple[str, int] | None = field(default=None, init=False)
    _cids: dict[bytes, EdgeConnection] = field(default_factory=dict, init=False)
    _cache: dict[tuple[int, str], EdgeConnection] = field(default_factory=dict, init=False)
    _by_peer: dict[int, set[EdgeConnection]] = field(default_factory=dict, init=False)  # handshaken, per peer node
    _dials: dict[int, asyncio.Task[EdgeConnection]] = field(default_factory=dict, init=False)
    connections: set[EdgeConnection] = field(default_factory=set, init=False)
    send_errors: int = field(default=0, init=False)
    traffic: TrafficLedger = field(default_factory=TrafficLedger, init=False)  # of the connections gone
    admission: ConnectionAdmission = field(init=False)
    guard: AdmissionGuard = field(init=False)

    def __post_init__(self) -> None:
        self.admission = ConnectionAdmission(
            AdmissionLimits.of(self.config), QuicConfiguration(is_client=False).supported_versions,
            now=self.loop.time(), is_member=self.directory.is_member_host)
        self.guard = AdmissionGuard(self.admission, self.loop, self.config.refusal_log_interval, self._filter_target)

    # ---- socket ----

    def bind(self, bind: str) -> tuple[str, int]:
        host, port = parse_endpoint(bind)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # SO_*BUFFORCE
                try:
                    sock.setsockopt(socket.SOL_SOCKET, force, 8 << 20)
                except OSError:
                    sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
            sock.bind((host, port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.address = sock.getsockname()[:2]
        self.loop.add_reader(sock.fileno(), self._on_readable)
        return self.address

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.sock is not None
        try:
            self.sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            self.send_errors += 1  # QUIC loss recovery resends it
        except OSError as e:
            self.send_errors += 1
            log.debug("edge.sendto_failed", peer=str(addr), error=str(e))

    def _on_readable(self) -> None:
        assert self.sock is not None
        touched: dict[int, EdgeConnection] = {}
        now = self.loop.time()
        cids = self._cids
        recvfrom = self.sock.recvfrom
        for _ in range(READ_BATCH):
            try:
                data, addr = recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue
            # The destination CID straight from the bytes (aioquic parses the header again anyway):
            # long header: length at byte 5, CID after it; short header: our CID_LEN bytes at 1.
            if not data:
                continue
            dcid = data[6:6 + data[5]] if data[0] & 0x80 and len(data) > 5 else data[1:1 + CID_LEN]
            conn = cids.get(dcid)
            fresh = conn is None
            if conn is None:
                conn = self._accept(data, addr[:2], now)
                if conn is None:
                    continue
            addr = addr[:2]
            try:
                conn.quic.receive_datagram(data, addr, now=now)
            except Exception:  # aioquic rejects bad input itself; this is the last line
                self.admission.refused(Refusal.BAD_DATAGRAM, addr[0])
                if fresh:
                    self._discard(conn)
                continue
            if fresh:
                if not conn.quic.heard_from_peer:  # nothing decrypted: junk shaped like an Initial
                    self.admission.refused(Refusal.UNDECRYPTABLE_INITIAL, addr[0])
                    self._discard(conn)
                    continue
                conn.expect_handshake(self.config.handshake_timeout, self._handshake_expired)
            conn.last_rx = now
            conn.traffic.received_bytes += len(data)
            conn.traffic.received_datagrams += 1
            touched[conn.uid] = conn
        for conn in touched.values():
            conn.process_events()
            conn.transmit()
        self.guard.after_batch()

    def _accept(self, data: bytes, addr: tuple[str, int], now: float) -> EdgeConnection | None:
        """A datagram for an unknown CID: admission decides (admission.py)."""
        if self.sock is None:
            return None
        verdict, initial = self.admission.admit_new(data, addr, now)
        if verdict.__class__ is Drop:
            return None
        if isinstance(verdict, SendVersionNegotiation):  # a newer QUIC, or the orchestrator's reachability probe
            self.sendto(encode_quic_version_negotiation(source_cid=verdict.dcid, destination_cid=verdict.scid,
                                                        supported_versions=sorted(self.admission.supported_versions)),
                        addr)
            return None
        assert initial is not None
        if isinstance(verdict, SendRetry):
            self.sendto(encode_quic_retry(version=initial.version, source_cid=verdict.retry_scid,
                                          destination_cid=initial.scid, original_destination_cid=initial.dcid,
                                          retry_token=verdict.token), addr)
            return None
        assert isinstance(verdict, Admit)
        cfg = self._configuration(is_client=False, peer_addr=addr)
        quic = EdgeQuicConnection(
            configuration=cfg,
            pin=self._pin_any_member,
            connection_window=self.config.connection_window,
            max_streams_uni=self.config.max_streams,
            original_destination_connection_id=verdict.original_dcid,
            retry_source_connection_id=verdict.retry_scid,
        )
        conn = self._adopt(quic, initiated_here=False)
        conn.peer_addr = addr
        conn.half_open = verdict.source
        self.add_cid(conn, initial.dcid)
        return conn

    def _handshake_expired(self, conn: EdgeConnection) -> None:
        if conn.closed or conn.handshake.done():
            return
        self.admission.refused(Refusal.HANDSHAKE_TIMEOUT, conn.half_open or "?")
        conn.close(reason="handshake timeout")
        self._discard(conn)
        self.guard.noted()

    def _filter_target(self) -> tuple[socket.socket | None, frozenset[str]]:
        """The socket the kernel flood filter goes on, and who it lets through (members and us)."""
        own = {self.address[0]} if self.address else set()
        return self.sock, self.directory.member_hosts() | own

    def _discard(self, conn: EdgeConnection) -> None:
        """Drop a connection that never completed a handshake, at once (no draining period)."""
        conn.closed = True
        conn.cancel_timers()
        self.connection_gone(conn)

    # ---- connections ----

    def _configuration(self, *, is_client: bool, peer_addr: tuple[str, int], server_name: str | None = None) -> QuicConfiguration:
        cfg = QuicConfiguration(
            is_client=is_client,
            alpn_protocols=[ALPN],
            idle_timeout=self.config.idle_timeout,
            max_data=self.config.connection_window,
            max_stream_data=self.config.initial_stream_window,
            max_datagram_size=datagram_size_for(
                peer_addr, self.config.max_datagram_size, self.config.max_datagram_size_auto_cap
            ),
            congestion_control_algorithm=self.config.congestion_control,
            connection_id_length=CID_LEN,
            verify_mode=ssl.CERT_NONE,  # no CA: peers are pinned by fingerprint (quic_conn)
            server_name=server_name,
            initial_rtt=0.01,
        )
        cfg.certificate = self.identity.certificate
        cfg.private_key = self.identity.private_key
        return cfg

    def _adopt(self, quic: EdgeQuicConnection, *, initiated_here: bool) -> EdgeConnection:
        conn = EdgeConnection(self, quic, initiated_here=initiated_here)
        self.add_cid(conn, quic.host_cid)
        self.connections.add(conn)
        return conn

    def add_cid(self, conn: EdgeConnection, cid: bytes) -> None:
        self._cids[cid] = conn
        conn.cids.add(cid)

    def drop_cid(self, conn: EdgeConnection, cid: bytes) -> None:
        if self._cids.get(cid) is conn:
            del self._cids[cid]
        conn.cids.discard(cid)

    def _pin_any_member(self, cert: x509.Certificate) -> int:
        peer = self.directory.by_fingerprint(fingerprint(cert))
        if peer is None:
            raise tls.AlertBadCertificate("certificate is not a cluster member's edge certificate")
        return peer.node_id

    def _pin_node(self, node_id: int) -> Callable[[x509.Certificate], int]:
        def pin(cert: x509.Certificate) -> int:
            peer = self.directory.lookup(node_id)
            if peer is None or fingerprint(cert) != peer.fingerprint:
                raise tls.AlertBadCertificate(f"certificate does not match node {node_id}'s fingerprint")
            return node_id

        return pin

    def connection_established(self, conn: EdgeConnection) -> None:
        """The connection's handshake completed (the peer's certificate was pinned during it)."""
        peer = conn.peer_node_id
        assert peer is not None  # the pin ran during the handshake
        if not conn.handshake.done():
            conn.handshake.set_result(None)
        self._release_half_open(conn)
        self._by_peer.setdefault(peer, set()).add(conn)
        conn.start_keepalive()
        key = (peer, ALPN)
        old = self._cache.get(key)
        # A cached connection that has heard nothing for two keepalive intervals is most likely to a
        # previous instance of the peer (it restarted and now reached us): new edges use the new one.
        if old is None or old.closed or self._quiet(old):
            self._cache[key] = conn
        log.info(
            "edge.connection_established",
            peer_node_id=peer,
            peer=str(conn.peer_addr),
            initiated_here=conn.initiated_here,
            max_datagram_size=conn.max_datagram_size,
        )

    def _release_half_open(self, conn: EdgeConnection) -> None:
        if conn.half_open is not None:
            self.admission.release(conn.half_open)
            conn.half_open = None
        conn.handshake_settled()

    def connection_gone(self, conn: EdgeConnection) -> None:
        """The connection is gone: O(its own CIDs), never a scan of all connections."""
        if conn in self.connections:  # its traffic counts once, under its peer
            self.traffic.retire(conn.peer_node_id, conn.counts())
        self.connections.discard(conn)
        for cid in conn.cids:
            if self._cids.get(cid) is conn:
                del self._cids[cid]
        conn.cids.clear()
        self._release_half_open(conn)
        peer = conn.peer_node_id
        peers = self._by_peer.get(peer) if peer is not None else None
        if peers is not None:
            peers.discard(conn)
            if not peers:
                del self._by_peer[peer]  # type: ignore[arg-type]
        if peer is not None and self._cache.get((peer, ALPN)) is conn:
            del self._cache[(peer, ALPN)]
            # Another live connection to the same peer (a crossed dial) takes over the cache slot.
            for other in peers or ():
                if not other.closed:
                    self._cache[(peer, ALPN)] = other
                    break
        if conn.refused_here():
            self.admission.refused(Refusal.PEER_NOT_AUTHORIZED, conn.peer_addr[0] if conn.peer_addr else "?")
            self.guard.noted()

    def traffic_totals(self) -> dict[int, Traffic]:
        """Per peer node id, the QUIC traffic of every connection since the driver started."""
        return self.traffic.totals((c.peer_node_id, c.counts()) for c in self.connections)

    def _quiet(self, conn: EdgeConnection) -> bool:
        """Nothing heard from the peer for two keepalive intervals (its PINGs go unanswered)."""
        return self.loop.time() - conn.last_rx > 2 * self.config.keepalive_interval

    def cached(self, peer_node_id: int) -> EdgeConnection | None:
        conn = self._cache.get((peer_node_id, ALPN))
        return conn if conn is not None and not conn.closed else None

    async def connection_to(self, peer_node_id: int) -> EdgeConnection:
        """The cached connection to the peer, or a new authenticated one (raises PeerUnreachable,
        PeerNotAuthorized)."""
        conn = self.cached(peer_node_id)
        if conn is not None and not self._quiet(conn):
            return conn
        # None, or quiet for two keepalive intervals: the peer most likely restarted and its old
        # connection only waits for the idle timeout; a new edge dials instead of dying with it.
        task = self._dials.get(peer_node_id)
        if task is None:
            task = asyncio.ensure_future(self._dial(peer_node_id))
            self._dials[peer_node_id] = task
            task.add_done_callback(lambda _t: self._dials.pop(peer_node_id, None))
        return await asyncio.shield(task)

    async def _dial(self, peer_node_id: int) -> EdgeConnection:
        peer = self.directory.lookup(peer_node_id)
        if peer is None:
            raise PeerUnreachable(f"node {peer_node_id} is not in the peer directory")
        host, port = parse_endpoint(peer.endpoint)
        infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM, family=self._family())
        addr: tuple[str, int] = infos[0][4][:2]
        cfg = self._configuration(is_client=True, peer_addr=addr, server_name=f"node-{peer_node_id}")
        quic = EdgeQuicConnection(
            configuration=cfg,
            pin=self._pin_node(peer_node_id),
            connection_window=self.config.connection_window,
            max_streams_uni=self.config.max_streams,
        )
        conn = self._adopt(quic, initiated_here=True)
        conn.peer_addr = addr
        quic.connect(addr, now=self.loop.time())
        conn.transmit()
        try:
            await asyncio.wait_for(asyncio.shield(conn.handshake), self.config.connect_timeout)
        except TimeoutError:
            conn.close(reason="connect timeout")
            self._discard(conn)
            raise PeerUnreachable(
                f"no QUIC handshake with node {peer_node_id} at {peer.endpoint} within {self.config.connect_timeout} s"
            ) from None
        return self.cached(peer_node_id) or conn

    def _family(self) -> int:
        assert self.sock is not None
        return self.sock.family

    async def close(self) -> None:
        for conn in list(self.connections):
            conn.close(reason="edge driver stopping")
        await asyncio.sleep(0)
        for task in list(self._dials.values()):
            task.cancel()
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        for conn in list(self.connections):
            conn.closed = True
            conn.cancel_timers()
        self.connections.clear()
        self.guard.close()
