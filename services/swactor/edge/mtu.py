"""Default datagram size: what the route to the peer allows (spec issue: aioquic's cost is per packet).

The kernel knows the route MTU (loopback 65536, a veth 1500); a connected UDP socket reports it
via IP_MTU. QUIC payload = MTU - IP header - UDP header. aioquic never sends above
max_datagram_size, and neither side needs to agree: each sets its own sending size.
"""

from __future__ import annotations

import socket

from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE

IP_MTU = getattr(socket, "IP_MTU", 14)
IPV6_MTU = getattr(socket, "IPV6_MTU", 24)
UDP_MAX_PAYLOAD = 65507


def route_mtu(addr: tuple[str, int]) -> int | None:
    """The MTU of the route to `addr`, or None when the kernel cannot say."""
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            if family == socket.AF_INET6:
                return int(s.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU))
            return int(s.getsockopt(socket.IPPROTO_IP, IP_MTU))
    except OSError:
        return None


def datagram_size_for(addr: tuple[str, int], configured: int, auto_cap: int) -> int:
    """`configured` if set (> 0), else the route's payload size capped at `auto_cap`."""
    if configured > 0:
        return max(SMALLEST_MAX_DATAGRAM_SIZE, min(configured, UDP_MAX_PAYLOAD))
    mtu = route_mtu(addr)
    if mtu is None:
        return SMALLEST_MAX_DATAGRAM_SIZE
    overhead = 48 if ":" in addr[0] else 28
    return max(SMALLEST_MAX_DATAGRAM_SIZE, min(mtu - overhead, auto_cap, UDP_MAX_PAYLOAD))
