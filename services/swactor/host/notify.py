"""The NOTIFY_SOCKET the supervisor owns, one per unit (sd_notify(3)'s datagrams: READY=1, STATUS=,
WATCHDOG=1, STOPPING=1).

The socket's file belongs to the unit's user, so only that user's processes can send to it, and the
kernel stamps every datagram with its sender (SO_PASSCRED): as systemd's NotifyAccess=main, only the
unit's main process is heard; its children (the worker's compute process inherits the variable) are not.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from pathlib import Path

from swactor.host.spawn import Identity

_UCRED = struct.Struct("iII")  # pid, uid, gid
_MAX = 4096


def parse(datagram: bytes) -> dict[str, str]:
    """`KEY=VALUE` lines; a line without `=` is skipped, as systemd does."""
    out = {}
    for line in datagram.decode(errors="replace").split("\n"):
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


class NotifySocket:
    def __init__(self, path: Path, who: Identity | None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o755)  # whatever the supervisor's umask: each unit's user must reach its socket
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(path))
        if who is not None:
            os.chown(path, who.uid, who.gid)
        os.chmod(path, 0o600)

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> list[tuple[int, dict[str, str]]]:
        """Every datagram waiting, as (sender pid, message)."""
        out = []
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(_MAX, socket.CMSG_SPACE(_UCRED.size))
            except (BlockingIOError, InterruptedError):
                return out
            pid = 0
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
                    pid = _UCRED.unpack(payload[:_UCRED.size])[0]
            out.append((pid, parse(data)))

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
