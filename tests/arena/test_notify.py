"""sd_notify without systemd: READY=1 only after the arena is mapped, STATUS= in words."""

from __future__ import annotations

import socket
from pathlib import Path

from swactor.arena.client import Leased, connect_holder
from swactor.v1 import common_pb2

from .conftest import MIB, start_arena
from .sync_client import ArenaClient


def test_ready_and_human_status_reach_the_notify_socket(short_dir: Path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(short_dir / "notify"))
    notify.settimeout(30)
    arena = start_arena(short_dir, env={"NOTIFY_SOCKET": str(short_dir / "notify")})
    try:
        first = notify.recv(4096).decode()
        assert first.startswith("READY=1\nSTATUS=ready: 0 leases, 0 B leased, 64.0 MiB free"), first
        assert arena.socket.is_socket() and arena.fd_socket.is_socket()  # both listen before READY
        with connect_holder(arena.fd_socket) as hold, ArenaClient(hold, arena.socket) as client:
            out = client.lease(
                request_id=1,
                requester="t",
                edge_id=1,
                direction=common_pb2.RING_DIRECTION_INGRESS,
                ring_spec=common_pb2.RingSpec(data_capacity=MIB, alignment=64),
            )
            assert isinstance(out, Leased)
            status = notify.recv(4096).decode()
            assert status.startswith("STATUS=ready: 1 lease, 1.0 MiB leased, 63.0 MiB free"), status
            assert "0 queued, 1 holder" in status
    finally:
        arena.stop()
        notify.close()


def test_failed_boot_sends_no_ready(short_dir: Path) -> None:
    import subprocess
    import sys

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(short_dir / "notify"))
    notify.settimeout(5)
    (short_dir / "c.toml").write_text("")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swactor.arena.main",
            "--config",
            str(short_dir / "c.toml"),
            "--state-dir",
            str(short_dir / "s"),
            "--ceiling-bytes",
            "12345",
        ],
        capture_output=True,
        timeout=60,
        check=False,
        env={"NOTIFY_SOCKET": str(short_dir / "notify"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1
    message = notify.recv(4096).decode()
    assert message.startswith("STATUS=failed:") and "READY=1" not in message
    notify.close()
