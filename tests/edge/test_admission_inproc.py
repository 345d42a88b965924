"""Admission of new connections on a real endpoint (issue 13): drivers in one loop on 127.0.0.1,
raw UDP sockets and aioquic clients as the hostile side. Waits are deadline-bounded conditions."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from pathlib import Path

from aioquic.asyncio import connect
from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicPacketType, pull_quic_header
from structlog.testing import capture_logs

from swactor.edge.admission import Refusal
from swactor.edge.config import ALPN
from swactor.edge.identity import create_identity
from tests.edge.fakering import FakeRing
from tests.edge.inproc import Node, next_event, start_nodes, stop_nodes, until
from tests.harness.udp_flood import junk_initial


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s


def addr(node: Node) -> tuple[str, int]:
    host, port = node.endpoint.rsplit(":", 1)
    return host, int(port)


def counts(node: Node) -> dict[Refusal, int]:
    return node.driver.endpoint.admission.totals


async def edge_works(a: Node, b: Node, edge_id: int) -> None:
    tx = a.rings.add(FakeRing(100 + edge_id, 64 << 10))
    rx = b.rings.add(FakeRing(200 + edge_id, 64 << 10))
    await b.driver.establish_recv(edge_id, 200 + edge_id, a.node_id, None)
    await a.driver.establish_send(edge_id, b.node_id, 100 + edge_id, None)
    await next_event(a, "ready", edge_id)
    tx.write(b"still here")
    await until(lambda: rx.avail() == 10, "the bytes on the edge")


def test_junk_initials_from_a_member_address_leave_no_state(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path, member_handshake_burst=20, member_handshake_rate=1.0)
        s = udp()
        try:
            base_cids = len(b.driver.endpoint._cids)
            for _ in range(100):
                s.sendto(junk_initial(), addr(b))
            adm = b.driver.endpoint.admission
            await until(lambda: counts(b)[Refusal.UNDECRYPTABLE_INITIAL] + adm.retries_sent >= 100, "100 junk datagrams handled")
            # Members skip Retry while their budget lasts; over it they are validated like strangers.
            assert 20 <= counts(b)[Refusal.UNDECRYPTABLE_INITIAL] <= 25 and adm.retries_sent >= 75
            ep = b.driver.endpoint
            assert not ep.connections and len(ep._cids) == base_cids and adm.half_open_total == 0
            await edge_works(a, b, 1)  # the real member still gets in (through a Retry now)
            st = b.driver.status().admission
            assert st.refused["undecryptable_initial"] == counts(b)[Refusal.UNDECRYPTABLE_INITIAL] and st.half_open == 0
        finally:
            s.close()
            await stop_nodes([a, b])

    asyncio.run(main())


def test_retry_token_comes_back_and_a_replay_from_elsewhere_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        (b,) = await start_nodes(tmp_path, n=1, address_validation="all")
        loop = asyncio.get_running_loop()
        s1, s2 = udp(), udp()
        try:
            odcid = os.urandom(8)
            s1.sendto(junk_initial(odcid), addr(b))
            data = await asyncio.wait_for(loop.sock_recv(s1, 2048), 5)
            hdr = pull_quic_header(Buffer(data=data), host_cid_length=8)
            assert hdr.packet_type == QuicPacketType.RETRY and hdr.token
            scid = hdr.source_cid  # the CID the token is bound to
            s2.sendto(junk_initial(scid, hdr.token), addr(b))  # same token, another port
            await until(lambda: counts(b)[Refusal.TOKEN_INVALID] == 1, "the replay refused")
            s1.sendto(junk_initial(scid, hdr.token), addr(b))  # the right address: admitted, then junk
            await until(lambda: counts(b)[Refusal.UNDECRYPTABLE_INITIAL] == 1, "the validated junk dropped")
            assert not b.driver.endpoint.connections and b.driver.endpoint.admission.half_open_total == 0
        finally:
            s1.close()
            s2.close()
            await stop_nodes([b])

    asyncio.run(main())


def test_members_handshake_through_retry_when_validation_is_on_for_all(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path, address_validation="all")
        try:
            await edge_works(a, b, 3)
            assert b.driver.endpoint.admission.retries_sent >= 1
            assert b.driver.endpoint.admission.half_open_total == 0
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_half_open_handshake_is_dropped_after_its_timeout(tmp_path: Path) -> None:
    async def main() -> None:
        (b,) = await start_nodes(tmp_path, n=1, handshake_timeout=0.3)
        loop = asyncio.get_running_loop()
        s = udp()
        try:
            cfg = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE)
            client = QuicConnection(configuration=cfg)
            client.connect(addr(b), now=loop.time())
            for data, _ in client.datagrams_to_send(now=loop.time()):
                s.sendto(data, addr(b))  # a real ClientHello, and then silence
            adm = b.driver.endpoint.admission
            await until(lambda: adm.half_open_total == 1, "the handshake admitted")
            await until(lambda: counts(b)[Refusal.HANDSHAKE_TIMEOUT] == 1, "the handshake timed out", timeout=5)
            assert adm.half_open_total == 0 and not b.driver.endpoint.connections
        finally:
            s.close()
            await stop_nodes([b])

    asyncio.run(main())


async def foreign_handshake(target: tuple[str, int], tmp: Path) -> str:
    ident = create_identity(tmp / "c.pem", tmp / "k.pem", 999)
    cfg = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE)
    cfg.certificate, cfg.private_key = ident.certificate, ident.private_key
    try:
        async with connect(target[0], target[1], configuration=cfg, wait_connected=True) as c:
            await asyncio.wait_for(c.wait_closed(), 3)
            ev = c._quic._close_event
            return f"refused {ev.error_code:#x}" if ev else "closed"
    except ConnectionError as e:
        return f"refused {e}"
    except TimeoutError:
        return "accepted"


def test_wrong_certificates_are_refused_and_summarised_not_logged_each(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            with capture_logs() as logs:
                outs = [await foreign_handshake(addr(b), tmp_path) for _ in range(6)]
                await until(lambda: counts(b)[Refusal.PEER_NOT_AUTHORIZED] == 6, "6 refused certificates")
            assert all(o.startswith("refused") for o in outs), outs
            summaries = [e for e in logs if e["event"] == "edge.admission_refused"]
            assert len(summaries) == 1  # the first at once; the rest wait for the interval
            assert summaries[0]["refused"] == {"peer_not_authorized": 1} and summaries[0]["log_level"] == "warning"
            per_peer = [e for e in logs if e["event"] == "edge.connection_closed" and e["log_level"] != "debug"]
            assert per_peer == []
            assert b.driver.status().admission.refused["peer_not_authorized"] == 6
            await edge_works(a, b, 2)  # members are not held up by it
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_refusal_summary_interval(tmp_path: Path) -> None:
    async def main() -> None:
        (b,) = await start_nodes(tmp_path, n=1, refusal_log_interval=0.2)
        s = udp()
        try:
            with capture_logs() as logs:
                for _ in range(50):
                    s.sendto(b"\x00 not quic at all", addr(b))
                await until(lambda: counts(b)[Refusal.NOT_INITIAL] == 50, "50 datagrams refused")
                await until(lambda: sum(e["refused"].get("not_initial", 0) for e in logs
                                        if e["event"] == "edge.admission_refused") == 50, "the summaries")
            summaries = [e for e in logs if e["event"] == "edge.admission_refused"]
            assert 1 <= len(summaries) <= 3, summaries  # 50 refusals, a handful of lines
            assert all(e["top_source"] == "127.0.0.1" for e in summaries)
        finally:
            s.close()
            await stop_nodes([b])

    asyncio.run(main())



def test_a_flood_of_strangers_is_filtered_in_the_kernel_while_it_lasts(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path, retry_rate=50.0, retry_burst=50, flood_hold=0.5)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.2", 0))  # a loopback address no member has: a stranger
        member = udp()  # 127.0.0.1: the members' address
        loop = asyncio.get_running_loop()
        adm, guard = b.driver.endpoint.admission, b.driver.endpoint.guard

        def seen() -> int:
            return adm.retries_sent + sum(adm.totals.values())

        try:
            with capture_logs() as logs:
                deadline = loop.time() + 10
                while not adm.filtering:  # about 1000/s until admission judges it a flood
                    assert loop.time() < deadline, "admission never judged 1000 Initials/s a flood"
                    for _ in range(20):
                        s.sendto(junk_initial(), addr(b))
                    await asyncio.sleep(0.02)  # pacing the sender, not waiting for an outcome
                await until(lambda: guard.filter_members is not None, "the kernel filter on")
                before, markers = seen(), counts(b)[Refusal.NOT_INITIAL]
                for _ in range(1600):
                    s.sendto(junk_initial(), addr(b))
                # a member's short-header datagram after them: once it is counted, so is every
                # junk Initial the filter let through (one socket queue, in order)
                member.sendto(b"\x40" + os.urandom(40), addr(b))
                await until(lambda: counts(b)[Refusal.NOT_INITIAL] > markers, "the marker after the junk")
                got = seen() - before - 1
                assert 40 < got < 400, got  # about 1 in 16 reached the driver
                await edge_works(a, b, 4)  # members pass the filter
                await until(lambda: guard.filter_members is None, "the filter off once the flood stopped", timeout=10)
            states = [e["on"] for e in logs if e["event"] == "edge.flood_filter"]
            assert states == [True, False]
            s.sendto(junk_initial(), addr(b))
            await until(lambda: seen() > before + got, "strangers reach admission again")
        finally:
            s.close()
            member.close()
            await stop_nodes([a, b])

    asyncio.run(main())
