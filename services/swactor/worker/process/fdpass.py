"""Ring eventfds from GpuWorkerCtl to the compute process: SCM_RIGHTS on an inherited socketpair.

One SOCK_SEQPACKET message per ring, sent just before its InstallRing line: payload is the ring id
(u64 little-endian), two fds attached (readable eventfd, writable eventfd). Sharing the eventfds
with the ring's other end (pump, token endpoint, test) makes ring-rs wake hints cross processes.
"""

from __future__ import annotations

import array
import socket
import struct

RECEIVE_TIMEOUT_S = 10.0


class FdPassError(Exception):
    """No, or the wrong, fd message arrived for an InstallRing that announced one."""


def socketpair() -> tuple[socket.socket, socket.socket]:
    """(ctl end, worker end); the worker end is made inheritable for pass_fds."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.set_inheritable(True)
    return a, b


def send_ring_fds(sock: socket.socket, ring_id: int, readable_fd: int, writable_fd: int) -> None:
    sock.sendmsg([struct.pack("<Q", ring_id)],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [readable_fd, writable_fd]))])


def receive_ring_fds(sock: socket.socket | None, ring_id: int) -> dict[str, int]:
    """{"readable_fd": fd, "writable_fd": fd} for `ring_id`; the caller closes them."""
    if sock is None:
        raise FdPassError(f"InstallRing {ring_id} announced wake_fds but SWACTOR_FD_SOCKET is not set")
    sock.settimeout(RECEIVE_TIMEOUT_S)
    fds = array.array("i")
    try:
        msg, ancdata, _flags, _addr = sock.recvmsg(8, socket.CMSG_SPACE(2 * fds.itemsize))
    except (TimeoutError, OSError) as e:
        raise FdPassError(f"no eventfds for ring {ring_id} on the fd socket: {e}") from None
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(msg) != 8 or struct.unpack("<Q", msg)[0] != ring_id or len(fds) != 2:
        for fd in fds:
            socket.close(fd)
        raise FdPassError(f"fd message for ring {ring_id} malformed: payload {msg!r}, {len(fds)} fds")
    return {"readable_fd": fds[0], "writable_fd": fds[1]}
