"""GpuWorkerCtl shell (spec §28, §31): runs `python -m swactor.worker.process` under asyncio.

The arena fd is inherited (pass_fds) and named by SWACTOR_ARENA_FD / SWACTOR_ARENA_BYTES. stdin and stdout carry
framing.py's frames; stdout only events (decoded strictly; anything else is a process fault), stderr is passed through
to this service's stderr (structured logs of the worker). All decisions live in `ctl_fsm.CtlCore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swactor.common.events import get_logger
from swactor.worker.ctl_fsm import (
    Action,
    CtlCore,
    CtlState,
    Deliver,
    FromWorker,
    Input,
    KillProcess,
    ProcessExited,
    Send,
    Spawned,
    SpawnFailed,
    SpawnProcess,
    Start,
    StdoutMalformed,
    Tick,
    WriteCommand,
)
from swactor.worker.process import fdpass, framing, wire

Subscriber = Callable[[Any], None]


@dataclass
class _Spawned:
    """One generation's process and the socket its ring fds go through, until it is reaped."""

    proc: asyncio.subprocess.Process
    fd_sock: socket.socket


class GpuWorkerCtl:
    def __init__(self, core: CtlCore, arena_fd: int, *, python: str = sys.executable,
                 extra_env: dict[str, str] | None = None, extra_fds: tuple[int, ...] = ()) -> None:
        self.core = core
        self.arena_fd = arena_fd
        self.python = python
        self.extra_env = extra_env or {}
        self.extra_fds = extra_fds
        # By generation: a process given up for can still be spawning or dying beside the current one.
        self._procs: dict[int, _Spawned] = {}
        self._subscribers: list[Subscriber] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._log = get_logger(component="worker_ctl")
        self._closing = False

    @property
    def proc(self) -> asyncio.subprocess.Process | None:
        """The current generation's process (None before its spawn returns and once it is reaped)."""
        current = self._procs.get(self.core.worker_generation)
        return None if current is None else current.proc

    @property
    def state(self) -> CtlState:
        return self.core.state

    @property
    def worker_generation(self) -> int:
        return self.core.worker_generation

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    # ---- inputs ----

    def start(self) -> None:
        self._feed(Start())

    def send(self, command: wire.Command) -> None:
        self._feed(Send(command))

    def share_wake_fds(self, ring_id: int, readable_fd: int, writable_fd: int) -> bool:
        """Hand the ring's eventfds to the running worker (fds stay owned by the caller)."""
        current = self._procs.get(self.core.worker_generation)
        if self.core.state is not CtlState.RUNNING or ring_id not in self.core.rings or current is None:
            return False
        try:
            fdpass.send_ring_fds(current.fd_sock, ring_id, readable_fd, writable_fd)
        except OSError:
            return False
        self.send(wire.ShareWakeFds(ring_id))
        return True

    def _feed(self, inp: Input) -> None:
        for action in self.core.handle(inp, time.monotonic()):
            self._do(action)
        self._arm_timer()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.core.deadline is not None:
            delay = max(0.0, self.core.deadline - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, lambda: self._feed(Tick()))

    # ---- actions ----

    def _do(self, action: Action) -> None:
        match action:
            case SpawnProcess(gen):
                self._spawn_task(self._spawn(gen))
            case WriteCommand(cmd):
                self._write(cmd)
            case KillProcess(gen):
                if (spawned := self._procs.get(gen)) is not None and spawned.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        spawned.proc.kill()
            case Deliver(event):
                for fn in list(self._subscribers):
                    fn(event)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self, generation: int) -> None:
        ours, theirs = fdpass.socketpair()
        env = {**os.environ, **self.extra_env,
               "SWACTOR_ARENA_FD": str(self.arena_fd),
               "SWACTOR_ARENA_BYTES": str(self.core.arena_ceiling),
               "SWACTOR_FD_SOCKET": str(theirs.fileno())}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "swactor.worker.process",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None,
                pass_fds=(self.arena_fd, theirs.fileno(), *self.extra_fds), env=env)
        except OSError as e:
            ours.close()
            self._feed(SpawnFailed(generation, f"{self.python} -m swactor.worker.process: {e}"))
            return
        finally:
            theirs.close()
        self._procs[generation] = _Spawned(proc, ours)
        if self._closing:  # the service stopped while this spawn ran: nobody will stop the process later
            proc.kill()
        self._log.info("worker_spawned", pid=proc.pid, worker_generation=generation)
        self._spawn_task(self._read_stdout(generation, proc))
        self._feed(Spawned(generation, proc.pid))

    def _write(self, cmd: wire.Command) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            return  # the exit notification follows and synthesizes the fault
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(framing.frame(cmd))

    async def _read_stdout(self, generation: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        frames = framing.FrameReader()
        try:
            while chunk := await proc.stdout.read(1 << 16):
                for frame in frames.feed(chunk):
                    self._feed(FromWorker(generation, framing.decode_event(frame)))
            if frames.partial:
                raise wire.MalformedMessage("stdout ended inside a frame")
        except wire.MalformedMessage as e:
            self._feed(StdoutMalformed(generation, str(e)))
        rc = await proc.wait()
        self._procs.pop(generation).fd_sock.close()
        self._feed(ProcessExited(generation, rc))

    async def wait_exited(self) -> None:
        if (proc := self.proc) is not None:
            await proc.wait()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Kill every process still alive and reap it (service shutdown)."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        for spawned in list(self._procs.values()):
            if spawned.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    spawned.proc.kill()
        await self.wait_exited()
