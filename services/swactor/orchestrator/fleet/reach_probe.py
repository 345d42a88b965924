"""The probes of reach.py: does the orchestrator's host reach a node's advertised endpoints?

Edge (UDP, QUIC): a 1200-byte long-header datagram of a reserved version (VERSION_PROBE, of the
0x?a?a?a?a pattern RFC 9000 §15 keeps for forcing version negotiation). Any QUIC server, the edge
driver included (edge/admission.py), answers a version it does not speak with a Version Negotiation
packet that echoes our connection IDs, and keeps no state for it. It is sent `tries` times over the
timeout against loss; an ICMP port unreachable ends it at once.

Control (TCP, mutual TLS): a TCP connect, then the gRPC channel's mutual-TLS handshake against the
node's identity (the node's certificate must name that node id), without calling any method.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable

import grpc

from swactor.orchestrator.fleet.reach import Endpoint, Failure, Probe, Unreachable

VERSION_PROBE = 0x1A2A3A4A
DATAGRAM_BYTES = 1200  # the smallest datagram a QUIC server may answer (RFC 9000 §14.1)


def split_address(address: str) -> tuple[str, int]:
    """host:port, [v6]:port -> (host, port); ValueError otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not host:port: {address!r}")
    return host.strip("[]"), int(port)


def version_probe(dcid: bytes, scid: bytes) -> bytes:
    """A long-header datagram of VERSION_PROBE, padded to DATAGRAM_BYTES. Its type bits are not those of
    a v1 Initial, so the edge driver's flood filter (edge/sockfilter.py) never drops it."""
    head = bytes([0xF0]) + VERSION_PROBE.to_bytes(4, "big") + bytes([len(dcid)]) + dcid + bytes([len(scid)]) + scid
    return head + bytes(DATAGRAM_BYTES - len(head))


def is_version_negotiation(data: bytes, dcid: bytes, scid: bytes) -> bool:
    """Whether `data` is a Version Negotiation packet answering our probe (RFC 9000 §17.2.1: version 0, our
    source CID as its destination, our destination CID as its source)."""
    if len(data) < 7 or not data[0] & 0x80 or data[1:5] != b"\0\0\0\0":
        return False
    i = 6 + data[5]
    return data[6:i] == scid and data[i + 1:i + 1 + data[i]] == dcid if i < len(data) else False


class _Answers(asyncio.DatagramProtocol):
    def __init__(self, dcid: bytes, scid: bytes) -> None:
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.dcid, self.scid = dcid, scid

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if is_version_negotiation(data, self.dcid, self.scid) and not self.done.done():
            self.done.set_result("")

    def error_received(self, exc: Exception) -> None:
        if isinstance(exc, ConnectionRefusedError) and not self.done.done():
            self.done.set_result("ICMP port unreachable")


async def probe_edge(address: str, timeout_s: float, tries: int = 3) -> Unreachable | None:
    """None when the QUIC endpoint at `address` answers the version probe within `timeout_s`."""
    try:
        host, port = split_address(address)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (ValueError, OSError) as e:
        return Unreachable(Endpoint.EDGE, address, Failure.BAD_ADDRESS, timeout_s, str(e))
    family, _, _, _, sockaddr = infos[0]
    dcid, scid = os.urandom(8), os.urandom(8)
    loop = asyncio.get_running_loop()
    transport, answers = await loop.create_datagram_endpoint(lambda: _Answers(dcid, scid), family=family,
                                                             remote_addr=sockaddr[:2])
    try:
        datagram = version_probe(dcid, scid)
        for _ in range(max(1, tries)):
            transport.sendto(datagram)
            try:
                said = await asyncio.wait_for(asyncio.shield(answers.done), timeout_s / max(1, tries))
            except TimeoutError:
                continue
            if said:
                return Unreachable(Endpoint.EDGE, address, Failure.EDGE_PORT_CLOSED, timeout_s)
            return None
        return Unreachable(Endpoint.EDGE, address, Failure.EDGE_NO_ANSWER, timeout_s)
    finally:
        transport.close()


async def probe_control(address: str, channel: Callable[[], grpc.aio.Channel] | None,
                        timeout_s: float) -> Unreachable | None:
    """None when `address` accepts a TCP connection and (with a channel factory) completes the mutual-TLS
    handshake within `timeout_s`."""
    start = time.monotonic()
    try:
        host, port = split_address(address)
    except ValueError as e:
        return Unreachable(Endpoint.CONTROL, address, Failure.BAD_ADDRESS, timeout_s, str(e))
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except TimeoutError:
        return Unreachable(Endpoint.CONTROL, address, Failure.CONTROL_NO_ANSWER, timeout_s)
    except ConnectionRefusedError:
        return Unreachable(Endpoint.CONTROL, address, Failure.CONTROL_REFUSED, timeout_s)
    except OSError as e:
        return Unreachable(Endpoint.CONTROL, address, Failure.CONTROL_NO_ANSWER, timeout_s, e.strerror or str(e))
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    if channel is None:
        return None
    left = max(0.1, timeout_s - (time.monotonic() - start))
    async with channel() as ch:
        try:
            await asyncio.wait_for(ch.channel_ready(), left)
        except TimeoutError:
            return Unreachable(Endpoint.CONTROL, address, Failure.CONTROL_TLS, timeout_s)
    return None


async def probe(p: Probe, channel: Callable[[Probe], grpc.aio.Channel] | None, tries: int = 3,
                ) -> tuple[Unreachable, ...]:
    """Both endpoints of the node, at once: what is unreachable (edge first)."""
    control_channel = (lambda: channel(p)) if channel is not None else None
    got = await asyncio.gather(probe_edge(p.edge, p.timeout_s, tries),
                               probe_control(p.control, control_channel, p.timeout_s))
    return tuple(u for u in got if u is not None)
