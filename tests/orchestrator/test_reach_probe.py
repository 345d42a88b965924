"""The reachability probes (fleet/reach_probe.py) against real endpoints on 127.0.0.1: the edge driver and a
plain aioquic server answer the QUIC version probe, a closed or silent UDP port is named unreachable; a node's
mutual-TLS control listener completes the handshake, a closed port, a port that is not TLS and a listener of
another node are named. Outcomes are asserted, never how long they took."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from aioquic.asyncio import serve as quic_serve
from aioquic.quic.configuration import QuicConfiguration

from swactor.common import control_tls
from swactor.edge.identity import create_identity
from swactor.orchestrator.fleet.reach import Endpoint, Failure, Probe
from swactor.orchestrator.fleet.reach_probe import probe, probe_control, probe_edge, split_address
from tests.edge.inproc import start_nodes, stop_nodes

SECRET = b"s" * 32
ORCHESTRATOR, NODE = 7, 9


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())  # type: ignore[arg-type]


def closed_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_split_address() -> None:
    assert split_address("10.0.0.5:17400") == ("10.0.0.5", 17400)
    assert split_address("[::1]:17400") == ("::1", 17400)
    for bad in ("10.0.0.5", "10.0.0.5:", ":1", "h:0", "h:70000", "h:x"):
        try:
            split_address(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_the_edge_driver_answers_the_version_probe_without_counting_a_refusal(tmp_path: Path) -> None:
    async def main() -> None:
        (a,) = await start_nodes(tmp_path, n=1)
        try:
            assert await probe_edge(a.endpoint, 5.0) is None
            adm = a.driver.endpoint.admission
            assert adm.version_negotiations_sent >= 1
            assert not any(adm.totals.values()) and adm.half_open_total == 0
        finally:
            await stop_nodes([a])

    run(main)


def test_a_plain_aioquic_server_answers_the_version_probe(tmp_path: Path) -> None:
    async def main() -> None:
        create_identity(tmp_path / "cert.pem", tmp_path / "key.pem", 1)
        cfg = QuicConfiguration(is_client=False, alpn_protocols=["probe"])
        cfg.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
        port = closed_port(socket.SOCK_DGRAM)
        server = await quic_serve("127.0.0.1", port, configuration=cfg)
        try:
            assert await probe_edge(f"127.0.0.1:{port}", 5.0) is None
        finally:
            server.close()

    run(main)


def test_a_closed_or_silent_udp_port_is_named_unreachable() -> None:
    async def main() -> None:
        port = closed_port(socket.SOCK_DGRAM)
        got = await probe_edge(f"127.0.0.1:{port}", 5.0)
        assert got is not None and (got.endpoint, got.failure) == (Endpoint.EDGE, Failure.EDGE_PORT_CLOSED)
        assert got.text().startswith(f"edge endpoint 127.0.0.1:{port} (UDP, QUIC) got ICMP port unreachable for "
                                     "a version probe")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never answers (a firewall's drop)
            silent.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{silent.getsockname()[1]}"
            got = await probe_edge(address, 0.3, tries=3)
            assert got is not None and got.failure is Failure.EDGE_NO_ANSWER and got.address == address
            assert len(silent.recv(2048)) == 1200  # it was sent, padded as QUIC requires
        got = await probe_edge("no-such-host.invalid:1", 1.0)
        assert got is not None and got.failure is Failure.BAD_ADDRESS

    run(main)


def mtls_channel(node_id: int, address: str) -> Callable[[], grpc.aio.Channel]:
    return lambda: control_tls.channel(SECRET, ORCHESTRATOR, address, node_id)


def test_the_control_probe_completes_the_mutual_tls_handshake_and_names_what_fails() -> None:
    async def main() -> None:
        server = grpc.aio.server()
        port = server.add_secure_port("127.0.0.1:0", control_tls.server_credentials(SECRET, NODE))
        await server.start()
        address = f"127.0.0.1:{port}"
        try:
            assert await probe_control(address, mtls_channel(NODE, address), 5.0) is None
            # the port map points at another node's control listener: its certificate does not name this node
            got = await probe_control(address, mtls_channel(NODE + 1, address), 1.0)
            assert got is not None and got.failure is Failure.CONTROL_TLS
        finally:
            await server.stop(None)
        closed = closed_port(socket.SOCK_STREAM)
        got = await probe_control(f"127.0.0.1:{closed}", mtls_channel(NODE, f"127.0.0.1:{closed}"), 5.0)
        assert got is not None and (got.endpoint, got.failure) == (Endpoint.CONTROL, Failure.CONTROL_REFUSED)
        # something that accepts TCP but does not speak TLS there (another service behind the mapped port)
        listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        plain = f"127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        try:
            got = await probe_control(plain, mtls_channel(NODE, plain), 1.0)
            assert got is not None and got.failure is Failure.CONTROL_TLS
        finally:
            listener.close()

    run(main)


def test_probe_names_each_unreachable_endpoint_of_a_node(tmp_path: Path) -> None:
    async def main() -> None:
        (a,) = await start_nodes(tmp_path, n=1)
        try:
            control = f"127.0.0.1:{closed_port(socket.SOCK_STREAM)}"
            edge_closed = f"127.0.0.1:{closed_port(socket.SOCK_DGRAM)}"
            got = await probe(Probe(NODE, a.endpoint, control, 1, 5.0), None)
            assert [(u.endpoint, u.address) for u in got] == [(Endpoint.CONTROL, control)]
            got = await probe(Probe(NODE, edge_closed, control, 1, 5.0), None)
            assert [(u.endpoint, u.address) for u in got] == [(Endpoint.EDGE, edge_closed), (Endpoint.CONTROL, control)]
        finally:
            await stop_nodes([a])

    run(main)
