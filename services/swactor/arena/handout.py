"""The fd hand-out socket: SCM_RIGHTS delivery of the arena memfd and holder liveness (§19, §38).

A process connects (SOCK_SEQPACKET), SO_PEERCRED decides whether it may map the arena, and it
receives one `ArenaHandout` message with the memfd attached. It then keeps the connection open
for as long as it may touch the arena. The holder is gone only when *both* hold:
  - the connection reached EOF (every copy of the socket is closed, forked children included), and
  - the process exited (its pidfd became readable; its mappings are torn down by then).
Only then does `on_gone` let the lease table reclaim what the holder kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from swactor.arena.journal import log
from swactor.arena.peercred import PeerCred, peer_cred, peer_pidfd
from swactor.common.aio import cancel_and_wait
from swactor.common.ids import new_id
from swactor.v1 import arena_pb2


@dataclass(slots=True)
class _Conn:
    holder_id: int
    cred: PeerCred
    sock: socket.socket
    pidfd: int
    eof: bool = False
    exited: bool = False
    watching: set[int] = field(default_factory=set)


@dataclass(eq=False)
class HandoutServer:
    """The hand-out socket: authorizes a connecting holder, sends it the memfd, watches it until it is gone."""

    path: Path
    memfd: int
    arena_len: int
    page_size: int
    authorize: Callable[[PeerCred], str | None]  # a denial reason, or None to admit
    on_join: Callable[[int, PeerCred], None]
    on_disconnect: Callable[[int], None]
    on_gone: Callable[[int], None]
    _listener: socket.socket | None = field(default=None, init=False)
    _accept_task: asyncio.Task[None] | None = field(default=None, init=False)
    _conns: dict[int, _Conn] = field(default_factory=dict, init=False)

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_socket():
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        listener.bind(str(self.path))
        # Anyone may connect; SO_PEERCRED decides who gets the fd, and says why not to the rest.
        os.chmod(self.path, 0o666)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._accept_task = asyncio.create_task(self._accept_loop(), name="arena-handout-accept")

    async def close(self) -> None:
        await cancel_and_wait([self._accept_task])
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for conn in list(self._conns.values()):
            self._forget(conn)

    @property
    def holders(self) -> int:
        return len(self._conns)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            try:
                self._admit(sock)
            except OSError as e:  # the peer vanished mid-handshake: nothing was registered
                log().warning("arena_holder_handshake_failed", error=str(e))
                sock.close()

    def _admit(self, sock: socket.socket) -> None:
        cred = peer_cred(sock)
        denied = self.authorize(cred)
        if denied is not None:
            log().warning("arena_holder_denied", pid=cred.pid, uid=cred.uid, gid=cred.gid, reason=denied)
            with contextlib.suppress(OSError):
                sock.send(arena_pb2.ArenaHandout(denied=denied).SerializeToString())
            sock.close()
            return
        pidfd = peer_pidfd(sock, cred.pid)
        if pidfd is None:  # exited before we could watch it: never registered, nothing to reclaim
            sock.close()
            return
        holder_id = new_id()
        handout = arena_pb2.ArenaHandout(
            holder_id=holder_id, arena_len=self.arena_len, page_size=self.page_size, arena_pid=os.getpid()
        )
        try:
            socket.send_fds(sock, [handout.SerializeToString()], [self.memfd])
        except OSError:
            os.close(pidfd)
            sock.close()
            raise
        conn = _Conn(holder_id, cred, sock, pidfd)
        self._conns[holder_id] = conn
        self.on_join(holder_id, cred)  # before any callback below can name this holder
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._on_sock_readable, conn)
        loop.add_reader(pidfd, self._on_pid_exit, conn)
        conn.watching = {sock.fileno(), pidfd}

    def _on_sock_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:  # holders send nothing; ignore chatter rather than guess at its meaning
            return
        asyncio.get_running_loop().remove_reader(conn.sock.fileno())
        conn.watching.discard(conn.sock.fileno())
        conn.eof = True
        if not conn.exited:
            self.on_disconnect(conn.holder_id)
        self._maybe_gone(conn)

    def _on_pid_exit(self, conn: _Conn) -> None:
        asyncio.get_running_loop().remove_reader(conn.pidfd)
        conn.watching.discard(conn.pidfd)
        conn.exited = True
        if not conn.eof:  # e.g. a forked child still holds the connection (and the mapping)
            log().info("arena_holder_exited_connection_open", holder_id=conn.holder_id, pid=conn.cred.pid)
        self._maybe_gone(conn)

    def _maybe_gone(self, conn: _Conn) -> None:
        if conn.eof and conn.exited and conn.holder_id in self._conns:
            self._forget(conn)
            self.on_gone(conn.holder_id)

    def _forget(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        for fd in conn.watching:
            loop.remove_reader(fd)
        conn.watching.clear()
        self._conns.pop(conn.holder_id, None)
        conn.sock.close()
        os.close(conn.pidfd)
