"""Fault injectors for a FaultPool: signals to a named service's process on a named host, a whole
host killed, nft partitions and port blocks inside a host's network namespace, a delayed link
(NFQUEUE, tests/harness/nfqueue_delay.py). Each returns the wall-clock time of the injection
(time.time(), the clock of the services' event stamps) or is a context manager that undoes itself."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.faults.pool import FaultPool, pid_alive, wait_until

REPO = Path(__file__).resolve().parents[2]
TABLE = "swfault"


def _sigkill_and_reap(pids: list[int]) -> float:
    t = time.time()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until("killed processes gone", lambda: _gone(pids), 10)
    return t


def _gone(pids: list[int]) -> None:
    from tests.faults.pool import NotYet

    alive = [p for p in pids if pid_alive(p)]
    if alive:
        raise NotYet(f"still alive: {alive}")


def kill_service(pool: FaultPool, name: str) -> float:
    """SIGKILL one service's main process ("h1/edge"); its children are left as a crash leaves them."""
    return _sigkill_and_reap([pool.cluster.service(name).pid])


def kill_compute(pool: FaultPool, host: int) -> float:
    return _sigkill_and_reap([pool.compute_pid(host)])


def kill_host(pool: FaultPool, host: int) -> float:
    """SIGKILL every process of every service of the host at once (power lost): the services' main
    processes in reverse start order, dependents first, then their children, so that none outlives
    what it watches long enough to report it (signalled arena-first, the worker heard its arena die
    and faulted the run ARENA before its own SIGKILL)."""
    mains = {s.pid for s in pool.cluster.services}
    pids = pool.host_pids(host)
    return _sigkill_and_reap([p for p in reversed(pids) if p in mains] + [p for p in pids if p not in mains])


# ---- nft inside a host's namespace ----


def _nft(pool: FaultPool, host: int, script: str) -> None:
    subprocess.run(["ip", "netns", "exec", pool.netns(host), "nft", "-f", "-"], input=script, text=True,
                   check=True, capture_output=True, timeout=10)


def _ensure_table(pool: FaultPool, host: int) -> None:
    _nft(pool, host, f"table inet {TABLE} {{\n"
                     "  chain input { type filter hook input priority 0; policy accept; }\n"
                     "  chain output { type filter hook output priority 0; policy accept; }\n"
                     "}\n")


def clear_rules(pool: FaultPool, host: int) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        _nft(pool, host, f"delete table inet {TABLE}\n")


@contextlib.contextmanager
def _nft_rules(pool: FaultPool, host: int, rules: list[str]) -> Iterator[float]:
    """These rules in `host`'s namespace for the with block; the time they took effect."""
    _ensure_table(pool, host)
    t = time.time()
    _nft(pool, host, "".join(f"add rule inet {TABLE} {rule}\n" for rule in rules))
    try:
        yield t
    finally:
        clear_rules(pool, host)


def partition(pool: FaultPool, host: int, direction: str) -> contextlib.AbstractContextManager[float]:
    """Cut `host` off the bridge: "in" drops what it receives (one-way), "both" also what it sends."""
    rules = ['input iifname "eth0" drop']
    if direction == "both":
        rules.append('output oifname "eth0" drop')
    return _nft_rules(pool, host, rules)


def block_udp_to(pool: FaultPool, host: int, *, dport: int, to_host: int) -> contextlib.AbstractContextManager[float]:
    """Drop UDP `host` sends to port `dport` of `to_host` (that service there never answers)."""
    return _nft_rules(pool, host, [f"output ip daddr {pool.hosts[to_host].addr} udp dport {dport} drop"])


def hold_udp_from(pool: FaultPool, host: int, *, sport: int, to_host: int) -> contextlib.AbstractContextManager[float]:
    """Drop UDP `host` sends from its port `sport` to `to_host` (that service of it is not heard there meanwhile)."""
    return _nft_rules(pool, host, [f"output ip daddr {pool.hosts[to_host].addr} udp sport {sport} drop"])


@contextlib.contextmanager
def delayed_link(pool: FaultPool, host: int, delay_ms: float, *, sport: int) -> Iterator[float]:
    """Every UDP packet `host` sends from `sport` is held `delay_ms` (NFQUEUE userspace delayer)."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", pool.netns(host), sys.executable, "-m", "tests.harness.nfqueue_delay",
         "--queue", "7", "--delay-ms", str(delay_ms), "--udp-sport", str(sport)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "ready" once the queue is bound and the rule is in
        if line.strip() != "ready":
            raise RuntimeError(f"nfqueue delayer did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
        yield time.time()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
