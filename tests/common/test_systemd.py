from __future__ import annotations

import socket
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
