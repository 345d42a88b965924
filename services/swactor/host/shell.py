"""The host supervisor's asyncio shell: performs `SupervisorCore`'s actions and feeds back what happened.

It owns every fd and process: the units' processes (`spawn`), their NOTIFY_SOCKETs (`notify`), the
pipe each unit's stdout and stderr share, the control socket (`control`), SIGCHLD and the stop signals.
As a container's PID 1 it also reaps the orphans re-parented to it (any pid that is no unit's).

The log stream: every unit's lines go to the supervisor's stderr as they come, one JSON object per
line. A service's own structured events pass as they are (they name their service); any other line (a
traceback, a library's print) is wrapped in a `unit_output` event naming its unit. The last lines of each
unit are kept for `swactor-host status`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from swactor.common.events import get_logger
from swactor.host import control
from swactor.host.core import SupervisorCore
from swactor.host.notify import NotifySocket
from swactor.host.spawn import HostPaths, Identity, SpawnError, identity, raise_own_limits, spawn
from swactor.host.unit_fsm import Action, Emit, Kill, Spawn
from swactor.host.units import Unit

TAIL_LINES = 10
_MAX_LINE = 1 << 16


class _Output:
    """One unit's output pipe, split into lines."""

    def __init__(self, unit: Unit, fd: int) -> None:
        self.unit = unit
        self.fd = fd
        self.pending = b""

    def lines(self) -> tuple[list[bytes], bool]:
        """Complete lines read now; True once the pipe's last writer closed it."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return [], False
        if not chunk:
            rest, self.pending = self.pending, b""
            return ([rest] if rest else []), True
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        if len(self.pending) > _MAX_LINE:
            lines.append(self.pending)
            self.pending = b""
        return lines, False


class HostSupervisor:
    def __init__(self, units: list[Unit], paths: HostPaths, *, write_line: Any = None) -> None:
        self.core = SupervisorCore(units)
        self.paths = paths
        self.log = get_logger(component="host")
        self._write_line = write_line or _stderr_line
        self._who: dict[str, Identity | None] = {}
        self._notify: dict[str, NotifySocket] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._outputs: dict[int, _Output] = {}  # read fd -> output
        self.tails: dict[str, collections.deque[str]] = {u.name: collections.deque(maxlen=TAIL_LINES) for u in units}
        self._timer: asyncio.TimerHandle | None = None
        self._done = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._server: asyncio.base_events.Server | None = None
        self.not_applied: list[str] = []
        self.answering: set[asyncio.Task[None]] = set()  # control connections being answered

    # ---- run ----

    async def run(self) -> int:
        """Start every unit, serve until stopped (SIGTERM, SIGINT, `swactor-host stop`); 0 once all are down."""
        self.paths.own.mkdir(parents=True, exist_ok=True)
        os.chmod(self.paths.own, 0o755)  # the notify sockets inside are each their own user's
        for f in self.core.units:
            try:
                self._who[f.name] = identity(f.unit)
            except SpawnError as e:
                self._who[f.name] = None
                self.log.error("unit_identity_failed", unit=f.name, detail=str(e))
            sock = NotifySocket(self.paths.notify(f.unit), self._who[f.name])
            self._notify[f.name] = sock
            self._loop.add_reader(sock.fileno(), self._notified, f.name)
        self.not_applied = self._not_applied_host_wide()
        if self.not_applied:
            self.log.warning("host_not_applied", what=self.not_applied)
        self._loop.add_signal_handler(signal.SIGCHLD, self._reap)
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self.stop)
        self._server = await control.serve(self.paths.control, self)
        (self.paths.own / "pid").write_text(f"{os.getpid()}\n")
        self._feed(self.core.start_all(time.monotonic()))
        await self._done.wait()
        self._close()
        if self.answering:  # `swactor-host stop` waits for its answer: write it before the loop ends
            await asyncio.wait(self.answering, timeout=5)
        self.log.info("host_stopped")
        return 0

    def _not_applied_host_wide(self) -> list[str]:
        units = [f.unit for f in self.core.units]
        out = [f"{name} (could not raise the supervisor's own hard limit)" for name in raise_own_limits(units)]
        if os.geteuid() != 0:
            out.append("User=/Group= and a negative Nice= (the supervisor is not root: units run as its user)")
        return out

    def stop(self) -> None:
        self._feed(self.core.stop_all(time.monotonic()))

    @property
    def done(self) -> asyncio.Event:
        return self._done

    # ---- inputs from the world ----

    def _notified(self, name: str) -> None:
        f = self.core.unit(name)
        for pid, message in self._notify[name].receive():
            if pid and pid == f.pid:  # NotifyAccess=main
                self._feed(self.core.notified(name, message, time.monotonic()))

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            proc = self._procs.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            if proc is not None:
                proc.returncode = code  # reaped here: the Popen must not wait for it again
            sig = -code if code < 0 else None
            self._feed(self.core.exited(pid, None if sig else code, sig, time.monotonic()))

    def _output(self, fd: int) -> None:
        out = self._outputs[fd]
        lines, closed = out.lines()
        for raw in lines:
            self._log_line(out.unit, raw)
        if closed:
            self._loop.remove_reader(fd)
            os.close(fd)
            del self._outputs[fd]

    def _log_line(self, unit: Unit, raw: bytes) -> None:
        text = raw.decode(errors="replace").rstrip("\r")
        if not text.strip():
            return
        self.tails[unit.name].append(text)
        if not _json_object(text):  # a traceback, a library's print, or an event cut by another writer
            text = json.dumps({"service": unit.short_name, "event": "unit_output", "line": text})
        self._write_line(text)

    # ---- actions ----

    def _feed(self, actions: list[Action]) -> None:
        pending = collections.deque(actions)
        while pending:
            action = pending.popleft()
            match action:
                case Spawn(name):
                    pending.extend(self._spawn(name))
                case Kill(_, pid, sig, group):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, sig) if group else os.kill(pid, sig)
                case Emit(event, fields):
                    self.log.info(event, **fields)
        self._arm_timer()
        if self.core.done:
            self._done.set()

    def _spawn(self, name: str) -> list[Action]:
        f = self.core.unit(name)
        now = time.monotonic()
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            who = identity(f.unit)
            proc = spawn(f.unit, self.paths, who, write_fd)
        except (SpawnError, OSError) as e:
            os.close(read_fd)
            return self.core.spawn_failed(name, str(e), now)
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._procs[proc.pid] = proc
        self._outputs[read_fd] = _Output(f.unit, read_fd)
        self._loop.add_reader(read_fd, self._output, read_fd)
        return self.core.spawned(name, proc.pid, now)

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.core.deadline
        if deadline is not None:
            delay = max(0.0, deadline - time.monotonic())
            self._timer = self._loop.call_later(delay, lambda: self._feed(self.core.tick(time.monotonic())))

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            self._server.close()
        for fd in list(self._outputs):  # the units are down: drain what they wrote last
            self._output(fd)
        for name, sock in self._notify.items():
            self._loop.remove_reader(sock.fileno())
            sock.close()
            del name
        for path in (self.paths.control, self.paths.own / "pid"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._loop.remove_signal_handler(signal.SIGCHLD)


def _json_object(text: str) -> bool:
    if not (text.startswith("{") and text.endswith("}")):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _stderr_line(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
