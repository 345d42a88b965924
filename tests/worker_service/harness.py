"""Drive a real compute process over stdin/stdout with a real memfd arena and real ring-rs rings."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import swactor_ring as sr
from swactor.common.ringport import native_layout
from swactor.worker.process import fdpass, framing, wire

ARENA_BYTES = 16 << 20
REPO = str(Path(__file__).resolve().parents[2])  # test roles (tests.worker_service.roles) import from here


class Arena:
    """A memfd arena with a bump allocator for ring ranges (the arena-manager's job in production)."""

    def __init__(self, size: int = ARENA_BYTES) -> None:
        self.size = size
        self.fd = sr.Arena.create_memfd("swactor-test", size)
        self.arena = sr.Arena.from_fd(self.fd, size)
        self._next = 0
        self._ring_id = 100
        self.wake_fds: dict[int, tuple[int, int]] = {}

    def ring(self, capacity: int, alignment: int = 64) -> wire.Layout:
        self._ring_id += 1
        align = sr.RingLayout.range_alignment(alignment)
        off = -(-self._next // align) * align
        lay = sr.RingLayout.for_range(self._ring_id, off, capacity, alignment)
        self._next = off + lay.total_len
        assert self._next <= self.size
        sr.init_ring(self.arena, lay)
        return wire.Layout(lay.ring_id, lay.arena_offset, lay.total_len, lay.header_offset, lay.data_offset,
                           lay.data_capacity, lay.alignment)

    def eventfds(self, ring_id: int) -> tuple[int, int]:
        """The (readable, writable) eventfds shared by both ends of a ring."""
        if ring_id not in self.wake_fds:
            self.wake_fds[ring_id] = (sr.eventfd(), sr.eventfd())
        return self.wake_fds[ring_id]

    def producer(self, layout: wire.Layout, *, shared: bool = True) -> Any:
        """The ring's producer on its shared eventfds (`shared=False`: on fresh ones of its own, so the consumer
        is never signalled: every wake-up is lost)."""
        if not shared:
            return sr.Producer(self.arena, native_layout(layout))
        r, w = self.eventfds(layout.ring_id)
        return sr.Producer(self.arena, native_layout(layout), readable_fd=r, writable_fd=w)

    def consumer(self, layout: wire.Layout) -> Any:
        r, w = self.eventfds(layout.ring_id)
        return sr.Consumer(self.arena, native_layout(layout), readable_fd=r, writable_fd=w)

    def close(self) -> None:
        os.close(self.fd)
        for r, w in self.wake_fds.values():
            os.close(r)
            os.close(w)


def spec(max_extent: int, *, kind: str = "Activations", family: str = "Float", width: int = 4,
         row: int = 4, alignment: int = 4) -> wire.ObjSpec:
    return wire.ObjSpec(kind, max_extent, family, width, row, alignment)


class WorkerProc:
    def __init__(self, arena: Arena, *, env: dict[str, str] | None = None, log: Path | None = None) -> None:
        """`log`: where the process's stderr (its JSON events) goes; none kept without it."""
        self.arena = arena
        self.fd_sock, theirs = fdpass.socketpair()
        self._log = log.open("wb") if log is not None else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "swactor.worker.process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log or subprocess.DEVNULL,
            pass_fds=(arena.fd, theirs.fileno()),
            env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
                 "SWACTOR_ARENA_FD": str(arena.fd), "SWACTOR_ARENA_BYTES": str(arena.size),
                 "SWACTOR_FD_SOCKET": str(theirs.fileno()), **(env or {})})
        theirs.close()
        self.events: list[Any] = []
        self._frames = framing.FrameReader()
        self._read: list[bytes] = []  # frames read, not decoded yet

    def send(self, cmd: Any) -> None:
        self.send_bytes(framing.frame(cmd))

    def send_bytes(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    @property
    def holds_frames(self) -> bool:
        """Events already read off stdout wait to be decoded (`_read_one` returns one without reading)."""
        return bool(self._read)

    def _read_one(self, deadline: float) -> Any | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while not self._read:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._read += self._frames.feed(chunk)
        ev = framing.decode_event(self._read.pop(0))  # stdout carries only well-formed events
        self.events.append(ev)
        return ev

    def expect(self, kind: type, timeout: float = 30.0, **match: Any) -> Any:
        """The next event of `kind` matching `match` (other events are kept in self.events)."""
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if isinstance(ev, kind) and all(getattr(ev, k) == v for k, v in match.items()) and \
                    not getattr(ev, "_seen", False):
                object.__setattr__(ev, "_seen", True)
                return ev
        while True:
            ev = self._read_one(deadline)
            if ev is None:
                raise AssertionError(f"no {kind.__name__} {match} within {timeout}s; got {self.events}")
            if isinstance(ev, kind) and all(getattr(ev, k) == v for k, v in match.items()):
                object.__setattr__(ev, "_seen", True)
                return ev

    def initialize(self, generation: int = 1) -> wire.WorkerReady:
        self.send(wire.InitializeWorker(generation, self.arena.size, sr.RING_VERSION, {"device": "CPU"}))
        return self.expect(wire.WorkerReady)  # type: ignore[no-any-return]

    def install(self, layout: wire.Layout, direction: str, object_spec: wire.ObjSpec, edge_id: int = 7,
                port_id: int = 0) -> None:
        fdpass.send_ring_fds(self.fd_sock, layout.ring_id, *self.arena.eventfds(layout.ring_id))
        self.send(wire.InstallRing(layout.ring_id, edge_id, port_id, direction, layout, object_spec, True))
        self.expect(wire.RingInstalled, ring_id=layout.ring_id)

    def wait_exit(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.fd_sock.close()
        for f in (self.proc.stdin, self.proc.stdout, self._log):
            if f is not None:
                f.close()


def start_arena(base: Path, ceiling: int = 64 << 20) -> subprocess.Popen[bytes]:
    """A real arena-manager process with its sockets under `base` (keep paths short: AF_UNIX)."""
    (base / "swactor.toml").write_text("")
    proc = subprocess.Popen([sys.executable, "-m", "swactor.arena.main", "--config", str(base / "swactor.toml"),
                             "--socket", str(base / "arena.sock"), "--fd-socket", str(base / "arena-fd.sock"),
                             "--state-dir", str(base / "state"), "--ceiling-bytes", str(ceiling)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (base / "arena-fd.sock").exists() or not (base / "arena.sock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "arena-manager did not come up"
        time.sleep(0.05)
    return proc
