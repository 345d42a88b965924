"""Round trips to the seeds, measured before the SWIM engine starts, so that a joining node's probe timings follow
the network it joins from its first start (probe_timing.py) instead of only from its next one.

The engine takes its timings once (kinship freezes its config), and the members' RTT rows (rtt.py) exist only once
the node is a member, so the only round trip this node can measure before it starts is one the kernel answers: a
TCP handshake to the seed's gossip port (kinship listens on TCP at the gossip address for push-pull and its fallback
ping). A connection accepted and one refused (RST: the host is up, its membership is not yet) both took one round
trip. Each seed gets ATTEMPTS handshakes at once and the quickest counts, so one lost SYN does not stand for the
link; one that takes longer than TIMEOUT_S counts as lost (Linux resends a lost SYN after 1 s: its round trip would
be a second too long). A seed none of whose handshakes came back gets another such round, up to ROUNDS: a seed
host busy starting its services (or a starved link delayer in the local pool) answers late, not never. A seed
that answers in no round (down, or a firewall that drops) is left out, and the join that follows names it as it
names any seed that does not answer; it held the start up for ROUNDS x TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence

ATTEMPTS = 3
ROUNDS = 3
TIMEOUT_S = 1.0  # a handshake's: under Linux's first SYN retransmission, so a lost SYN is lost, not a 1 s round trip


async def _handshake_ms(family: int, sockaddr: tuple[str, int] | tuple[str, int, int, int],
                        timeout_s: float) -> float | None:
    """One TCP handshake to `sockaddr`: its round trip in ms, None when it neither completed nor was refused within
    `timeout_s`."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(loop.sock_connect(sock, sockaddr), timeout_s)
        except ConnectionRefusedError:
            pass  # the RST came back: one round trip all the same
        except (OSError, TimeoutError):
            return None  # unreachable, or nothing back in time: nothing was measured
        return (time.perf_counter() - t0) * 1000
    finally:
        sock.close()


async def seed_round_trip(seed: str, *, attempts: int = ATTEMPTS, rounds: int = ROUNDS,
                          timeout_s: float = TIMEOUT_S) -> float | None:
    """The round trip in ms to `seed` ("host:port"), None when it answered in no round (or its name did not
    resolve within `timeout_s`)."""
    host, _, port = seed.rpartition(":")
    loop = asyncio.get_running_loop()
    try:
        found = await asyncio.wait_for(loop.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM), timeout_s)
    except (OSError, ValueError, TimeoutError):
        return None  # not resolvable now: the join retries the name later, by itself
    family, _, _, _, sockaddr = found[0]
    for _ in range(rounds):
        got = [ms for ms in await asyncio.gather(*(_handshake_ms(family, sockaddr, timeout_s) for _ in range(attempts)))
               if ms is not None]
        if got:
            return min(got)
    return None


async def seed_round_trips(seeds: Sequence[str], *, attempts: int = ATTEMPTS, rounds: int = ROUNDS,
                           timeout_s: float = TIMEOUT_S) -> dict[str, float]:
    """The round trip in ms to each seed that answered (seed_round_trip's, all seeds at once)."""
    measured = await asyncio.gather(*(seed_round_trip(s, attempts=attempts, rounds=rounds, timeout_s=timeout_s)
                                      for s in seeds))
    return {s: ms for s, ms in zip(seeds, measured, strict=True) if ms is not None}
