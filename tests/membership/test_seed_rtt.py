"""The seeds' round trips before the engine starts (membership/seed_rtt.py), on real loopback sockets: a seed that
accepts and one whose port is closed both answer; one whose kernel drops the handshake is left out once the timeout
passes. The round trip across a delayed link: tests/membership/test_membership_netns.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from swactor.membership.seed_rtt import seed_round_trip, seed_round_trips


@contextlib.contextmanager
def listener(backlog: int = 16) -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(backlog)
    try:
        yield s
    finally:
        s.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoint(s: socket.socket) -> str:
    return f"127.0.0.1:{s.getsockname()[1]}"


def test_an_accepting_seed_and_a_refusing_one_both_give_a_round_trip() -> None:
    refused = f"127.0.0.1:{closed_port()}"
    with listener() as up:
        got = asyncio.run(seed_round_trips([endpoint(up), refused]))
        assert set(got) == {endpoint(up), refused} and all(ms >= 0 for ms in got.values())


def test_a_seed_whose_handshake_is_dropped_is_left_out_after_the_timeout() -> None:
    """A listener whose accept queue is full: Linux drops further SYNs, as a firewall that drops would."""
    with listener(backlog=0) as full, contextlib.ExitStack() as held:
        for _ in range(4):  # a queue of backlog 0 holds one: the rest of these hang in SYN_SENT
            c = held.enter_context(socket.socket())
            c.setblocking(False)
            c.connect_ex(full.getsockname())
        time.sleep(0.2)
        t0 = time.monotonic()
        got = asyncio.run(seed_round_trips([endpoint(full), "no-such-seed.invalid:7946"], rounds=2, timeout_s=0.5))
        took = time.monotonic() - t0
    assert got == {}
    assert took < 10  # two rounds of 0.5 s, not the kernel's SYN retries (over a minute)


def test_a_seed_that_answers_only_a_later_round_is_measured() -> None:
    """The first rounds' handshakes are dropped (a full accept queue); then the listener goes and the port refuses:
    the next round is answered, and measured."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    seed = endpoint(full)
    with contextlib.ExitStack() as held:
        for _ in range(4):
            c = held.enter_context(socket.socket())
            c.setblocking(False)
            c.connect_ex(full.getsockname())
        threading.Timer(0.7, full.close).start()  # within the second round of 0.5 s: the third is refused
        got = asyncio.run(seed_round_trip(seed, rounds=3, timeout_s=0.5))
    assert got is not None and got >= 0
