"""Wake-fd hand-out: the ring's other process fetches the eventfds the driver's pump waits on.

SOCK_SEQPACKET Unix socket (default /run/swactor/edge-wake.sock). Request: 8 bytes, the ring_id
(little-endian u64). Reply: b"\\x01" with two fds attached (readable, writable) or b"\\x00" and
an error text. Use them as `swactor_ring.Producer/Consumer(..., readable_fd=, writable_fd=)`
so that commits and consumes wake the driver's pump and vice versa (spec §21).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from pathlib import Path

from swactor.common.events import get_logger
from swactor.edge.ring_source import WakeFds

log = get_logger(component="COMPONENT_EDGE_DRIVER")
_REQ = struct.Struct("<Q")


class WakeFdError(RuntimeError):
    pass


class WakeFdServer:
    def __init__(self, path: Path, fds: WakeFds) -> None:
        self.path = path
        self.fds = fds
        self._sock: socket.socket | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_socket():
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o660)
        sock.listen(64)
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        assert self._sock is not None
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        with conn:
            conn.settimeout(1.0)
            try:
                data = conn.recv(64)
                if len(data) != _REQ.size:
                    conn.send(b"\x00request must be an 8-byte ring_id")
                    return
                (ring_id,) = _REQ.unpack(data)
                fds = self.fds.by_ring.get(ring_id)
                if fds is None:
                    conn.send(b"\x00ring %d is not pumped by this edge driver" % ring_id)
                    return
                socket.send_fds(conn, [b"\x01"], list(fds))
            except OSError as e:
                log.warning("edge.wakefd_request_failed", detail=str(e))

    def close(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def fetch_wake_fds(path: Path, ring_id: int, timeout_s: float = 5.0) -> tuple[int, int]:
    """(readable_fd, writable_fd) for `ring_id`; the caller owns (and closes) both."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            sock.send(_REQ.pack(ring_id))
            data, fds, _, _ = socket.recv_fds(sock, 256, 2)
        except OSError as e:
            raise WakeFdError(f"wake-fd socket {path}: {e}") from None
    if data[:1] != b"\x01" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        raise WakeFdError(f"wake-fd socket {path}: {data[1:].decode(errors='replace') or 'no fds'}")
    return fds[0], fds[1]
