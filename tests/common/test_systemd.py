from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest

from swactor.common import systemd


def test_notify_never_blocks_on_a_full_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setattr(systemd, "_notifier", None)
    systemd.notify_ready("up")
    for i in range(500):  # far beyond the kernel's datagram queue: would block if the socket did
        systemd.notify_status(f"status {i}")
    assert listener.recv(4096) == b"READY=1\nSTATUS=up"
    listener.close()


def test_notify_is_a_no_op_outside_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setattr(systemd, "_notifier", None)
    systemd.notify_ready("up")
    assert systemd._notifier is None


def _watchdog_env(monkeypatch: pytest.MonkeyPatch, path: Path, usec: int, pid: int) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", str(usec))
    monkeypatch.setenv("WATCHDOG_PID", str(pid))
    monkeypatch.setattr(systemd, "_notifier", None)
    monkeypatch.setattr(systemd, "_watchdog", None)


def test_watchdog_pings_from_the_loop_and_stops_while_it_hangs(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    listener.settimeout(5.0)
    _watchdog_env(monkeypatch, path, usec=100_000, pid=os.getpid())  # WatchdogSec=0.1s: a ping every 50 ms
    assert systemd.watchdog_interval() == pytest.approx(0.05)
    hang_s = 0.4

    async def main() -> tuple[list[float], float, float]:
        task = systemd.start_watchdog()
        assert task is not None and systemd.start_watchdog() is task  # one pinger per process
        loop = asyncio.get_running_loop()
        pings = []
        for _ in range(3):  # pings arrive while the loop turns
            assert await loop.run_in_executor(None, listener.recv, 64) == b"WATCHDOG=1"
            pings.append(time.monotonic())
        listener.setblocking(False)
        while True:  # drain: from here on, every ping is counted
            try:
                listener.recv(64)
            except BlockingIOError:
                break
        hung_at = time.monotonic()
        time.sleep(hang_s)  # the hang under test: the event loop itself is blocked
        resumed_at = time.monotonic()
        with pytest.raises(BlockingIOError):
            listener.recv(64)  # not one ping while the loop was blocked...
        listener.setblocking(True)
        assert await loop.run_in_executor(None, listener.recv, 64) == b"WATCHDOG=1"  # ...and they resume after
        task.cancel()
        return pings, hung_at, resumed_at

    pings, hung_at, resumed_at = asyncio.run(main())
    assert resumed_at - hung_at >= hang_s and len(pings) == 3
    listener.close()


def test_watchdog_is_off_outside_systemd_and_in_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _watchdog_env(monkeypatch, tmp_path / "notify", usec=100_000, pid=os.getpid() + 1)
    assert systemd.watchdog_interval() is None  # the environment was inherited from the watched parent
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    monkeypatch.setenv("WATCHDOG_USEC", "0")
    assert systemd.watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    assert systemd.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert systemd.watchdog_interval() is None

    async def main() -> None:
        assert systemd.start_watchdog() is None

    asyncio.run(main())
