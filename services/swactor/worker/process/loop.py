"""The compute process (spec §28-33): `python -m swactor.worker.process` runs `main()`, spawned by GpuWorkerCtl.

Environment: SWACTOR_ARENA_FD (inherited memfd of the node arena), SWACTOR_ARENA_BYTES (its
ceiling), optionally SWACTOR_FD_SOCKET (inherited Unix socket carrying ring eventfds, `fdpass`).
Commands arrive on stdin, events leave on stdout (nothing else is ever written there), as framing.py frames them:
JSON lines, binary frames for a step's hot path; logs go to stderr.

The loop sleeps until one of three kinds of fd is readable: stdin, the role loaders' wakeup pipe,
and the eventfds of the ring ends the core waits on (`WorkerCore.waits`), each armed first (ring-rs
sets its waiting bit, so the other end signals the eventfd once it commits or consumes). An end
that can progress right away is not slept on: the loop only polls the other fds, then wakes the
core. A ring's eventfds are private until the ring's other end shares its own (`InstallRing.wake_fds`,
`ShareWakeFds`); until then those commands, or RingReadable / RingWritable hints, make the core look at
the ring again. While any ring end is armed the loop also wakes every WAKE_CHECK_S and re-arms, so an end
nobody signalled costs that interval instead of the run. One armed at the last look on shared eventfds
that can progress now while its eventfd was never signalled lost its wake-up (`ringport.wake_lost`): it is
logged as `ring_wake_missed` with its ring ids, whether the timed look or another fd's wake-up found it.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import traceback
from typing import Any, BinaryIO

from swactor.common import ringport
from swactor.common.events import configure_logging
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import framing, role_loader, testhooks, wire
from swactor.worker.process import messages as m
from swactor.worker.process.core import WorkerCore
from swactor.worker.process.shell import Shell

_STDIN, _LOADER = "stdin", "loader"
WAKE_CHECK_S = ringport.WAKE_CHECK_S


class EventWriter:
    """stdout's events, written together: every event one input produced (a step's ObjectProduced,
    DeviceObjectReleased and StepCompleted) leaves in one write, so the node wakes once for them.
    The loop flushes once per wake-up, the shell before a step runs (the node stamps a step's start
    when its ObjectLoaded arrives)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.frames: list[bytes] = []

    def __call__(self, event: Any) -> None:
        self.frames.append(framing.frame(event))

    def flush(self) -> None:
        if self.frames:
            self.out.write(b"".join(self.frames))
            self.frames.clear()
            self.out.flush()


class _Rings:
    """The selector registrations of armed ring ends, kept in step with what the core waits on."""

    def __init__(self, sel: selectors.BaseSelector) -> None:
        self.sel = sel
        self.registered: dict[int, Any] = {}  # fd -> ring end
        self.reopened = 0

    def arm(self, ends: list[Any], reopened: int) -> list[Any]:
        """Arm every end; register the fds to sleep on. Returns the ends that can progress now."""
        if reopened != self.reopened:  # a reopened end's fd number may now name another eventfd
            self.reopened = reopened
            for fd in list(self.registered):
                self.sel.unregister(fd)
            self.registered = {}
        wanted: dict[int, Any] = {}
        ready = []
        for end in ends:
            fd = end.arm_wait()
            if fd is None:
                ready.append(end)
            else:
                wanted[fd] = end
        for fd, end in list(self.registered.items()):
            if wanted.get(fd) is not end:
                self.sel.unregister(fd)
                del self.registered[fd]
        for fd, end in wanted.items():
            if fd not in self.registered:
                self.sel.register(fd, selectors.EVENT_READ, end)
                self.registered[fd] = end
        return ready

    def lost(self, woken: set[int]) -> list[Any]:
        """The ends armed before the last select that can progress now though their eventfd was not among
        `woken` (what that select returned), where that is a lost wake-up (`ringport.wake_lost`). Looked at
        before any input is handled, as a command's handling would make progress on them unseen."""
        return [end for fd, end in self.registered.items()
                if fd not in woken and end.arm_wait() is None and ringport.wake_lost(end, fd)]


def serve(stdin_fd: int, out: BinaryIO, arena_fd: int, arena_bytes: int, fd_socket: socket.socket | None = None,
          fail_step: int | None = None) -> int:
    """Run the process until the core exits; the exit code. fail_step: a test hook (testhooks.py)."""
    emit = EventWriter(out)
    core = WorkerCore(arena_bytes)
    shell = Shell(core, emit, arena_fd, arena_bytes, fd_socket, fail_step=fail_step, flush=emit.flush)
    sel = selectors.DefaultSelector()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_READ, _STDIN)
    sel.register(shell.loaders.wakeup.fileno(), selectors.EVENT_READ, _LOADER)
    rings = _Rings(sel)
    commands = framing.FrameReader()
    try:
        while shell.exit_code is None:
            ready = rings.arm(core.waits(), shell.reopened)
            timeout = 0 if ready else (WAKE_CHECK_S if rings.registered else None)
            keys = sel.select(timeout)
            lost = rings.lost({key.fd for key, _ in keys if key.data is not _STDIN and key.data is not _LOADER})
            if lost:
                shell.log.warning("ring_wake_missed", ring_ids=sorted(getattr(e, "ring_id", 0) for e in lost),
                                  waited_s=WAKE_CHECK_S)
            woke = bool(ready or lost)
            for key, _ in keys:
                if key.data is _STDIN:
                    chunk = os.read(stdin_fd, 1 << 16)
                    if not chunk:
                        shell.feed(m.Signal.CONTROL_CLOSED)
                        break
                    try:
                        frames = commands.feed(chunk)
                    except wire.MalformedMessage as e:
                        shell.feed(m.Malformed(str(e)))
                        break
                    for frame in frames:
                        if shell.exit_code is None:
                            shell.command_frame(frame)
                elif key.data is _LOADER:
                    shell.loader_woke()
                else:
                    key.data.ack()
                    woke = True
            if woke and shell.exit_code is None:
                shell.feed(m.Signal.WAKE)
            emit.flush()
    except Exception as e:  # a bug in this process: say so on stdout (the ctl reports WorkerFatal), then exit
        shell.log.error("worker_fatal", reason="WORKER_FATAL_UNHANDLED_EXCEPTION", detail=repr(e),
                        tb=traceback.format_exc())
        emit(wire.WorkerFatal(pb.WORKER_FATAL_UNHANDLED_EXCEPTION, f"{type(e).__name__}: {e}"))
        emit.flush()
        return 1
    assert shell.exit_code is not None
    return shell.exit_code


def main() -> None:
    configure_logging("swactor-worker-process", pid=os.getpid())
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but events may reach the real stdout (a stray print goes to logs)
    emit = EventWriter(out)
    try:
        arena_fd = int(os.environ["SWACTOR_ARENA_FD"])
        arena_bytes = int(os.environ["SWACTOR_ARENA_BYTES"])
    except (KeyError, ValueError) as e:
        emit(wire.WorkerFatal(pb.WORKER_FATAL_ARENA_MAP_FAILED, f"SWACTOR_ARENA_FD / SWACTOR_ARENA_BYTES missing or not integers: {e}"))
        emit.flush()
        sys.exit(1)
    try:
        fail_step = testhooks.fail_step()
    except ValueError as e:
        emit(wire.WorkerFatal(pb.WORKER_FATAL_BACKEND_INIT_FAILED, str(e)))
        emit.flush()
        sys.exit(1)
    fd_socket = None
    if os.environ.get("SWACTOR_FD_SOCKET"):
        fd_socket = socket.socket(fileno=int(os.environ["SWACTOR_FD_SOCKET"]))
    rc = serve(sys.stdin.fileno(), out, arena_fd, arena_bytes, fd_socket, fail_step)
    if role_loader.loads_running():  # a load ShutdownWorker abandoned: exit now, without joining it
        out.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
