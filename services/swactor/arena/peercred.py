"""Who is on the other end of a Unix socket (SO_PEERCRED) and may they map the arena.

`authorize` is a pure decision: root, the service's own uid, or a member of the swactor group
(primary or supplementary) get the memfd; anyone else is refused with a reason.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5; pidfd of the connecting process


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket) -> PeerCred:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCred(pid, uid, gid)


def peer_pidfd(sock: socket.socket, pid: int) -> int | None:
    """A pidfd for the peer process, or None when it has already exited.

    SO_PEERPIDFD names the very process that connected (no pid-reuse race); older kernels fall
    back to pidfd_open(pid), racy only if the peer died and its pid was reused in between.
    """
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4)
        fd: int = struct.unpack("i", raw)[0]
        os.set_inheritable(fd, False)
        return fd
    except OSError as e:
        if e.errno == errno.ESRCH:
            return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def supplementary_groups(pid: int) -> frozenset[int]:
    """The peer's supplementary group ids, from /proc; empty if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except OSError:
        pass
    return frozenset()


def authorize(cred: PeerCred, *, own_uid: int, group_gid: int | None, groups: frozenset[int]) -> str | None:
    """None when the peer may receive the arena memfd, else why not (for the refusal and the event)."""
    if cred.uid == 0 or cred.uid == own_uid:
        return None
    if group_gid is not None and (cred.gid == group_gid or group_gid in groups):
        return None
    group = "no such group on this host" if group_gid is None else f"gid {group_gid}"
    return (
        f"uid {cred.uid} (pid {cred.pid}) is neither root, uid {own_uid}, nor in the swactor group ({group})"
    )
