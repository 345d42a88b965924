"""The kernel flood filter (sockfilter.py) on a real UDP socket over loopback: what it drops and what
it lets through. 127.0.0.1 plays the member, 127.0.0.2 the stranger (both are loopback addresses)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from swactor.edge import sockfilter
from tests.harness.udp_flood import junk_initial

MEMBER, STRANGER = "127.0.0.1", "127.0.0.2"


@pytest.fixture
def rx() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((MEMBER, 0))
    yield s
    s.close()


def sender(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    return s


def arrived(rx: socket.socket, packets: list[bytes], src: str) -> int:
    """Send `packets` from `src`, then a marker from the member; count what arrived before it."""
    tx, mark = sender(src), sender(MEMBER)
    for p in packets:
        tx.sendto(p, rx.getsockname())
    mark.sendto(b"\x40end-marker", rx.getsockname())  # a short header: always let through
    n, deadline = 0, time.monotonic() + 5
    rx.settimeout(5)
    while time.monotonic() < deadline:
        data, _ = rx.recvfrom(65536)
        if data == b"\x40end-marker":
            break
        n += 1
    tx.close()
    mark.close()
    return n


def test_strangers_tokenless_initials_are_dropped_everything_else_passes(rx: socket.socket) -> None:
    sockfilter.attach(rx, sockfilter.initial_filter([MEMBER, "10.9.9.9", "::1"], sample_shift=30))
    junk = [junk_initial() for _ in range(50)]
    assert arrived(rx, junk, STRANGER) == 0  # 1 in 2**30 sampled: none
    assert arrived(rx, junk, MEMBER) == 50  # a member's Initials
    with_token = [junk_initial(token=b"t" * 40) for _ in range(10)]
    assert arrived(rx, with_token, STRANGER) == 10  # a token: admission checks it
    others = [bytes([0x40]) + bytes(100), bytes([0xE3]) + bytes(1300), b"\x00" * 30]  # short, Handshake, junk
    assert arrived(rx, others, STRANGER) == 3
    sockfilter.detach(rx)
    assert arrived(rx, junk[:10], STRANGER) == 10


def test_filter_samples_one_in_two_to_the_shift(rx: socket.socket) -> None:
    sockfilter.attach(rx, sockfilter.initial_filter([MEMBER], sample_shift=1))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    n = arrived(rx, [junk_initial() for _ in range(300)], STRANGER)
    assert 90 < n < 210  # about half


def test_filter_refuses_too_many_members() -> None:
    members = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(sockfilter.MAX_MEMBERS + 1)]
    with pytest.raises(ValueError, match="at most"):
        sockfilter.initial_filter(members, 4)
    assert len(sockfilter.initial_filter(members[:-1], 4)) == sockfilter.MAX_MEMBERS + 16
