"""The compute process's I/O shell: performs the core's actions and feeds their outcomes back.

Everything with an fd, a native handle, a thread or the device is here: the arena mapping, the fd
side channel (`fdpass`), ring ends (`common.ringport`), the device bridge, role code and the load
threads (`role_loader`). Nothing here decides: an outcome goes back into `WorkerCore.handle` as an
input, a failure as the input that names it (a role's exception through `failures`).
"""

from __future__ import annotations

import collections
import os
import socket
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

from swactor.common.events import get_logger
from swactor.common.reasons import name
from swactor.common.ringerrors import RingBroken
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import failures, fdpass, framing, roles, testhooks, wire
from swactor.worker.process import messages as m
from swactor.worker.process.core import WorkerCore
from swactor.worker.process.role_loader import Loaders


class Shell:
    def __init__(self, core: WorkerCore, emit: Callable[[wire.Event], None], arena_fd: int, arena_bytes: int,
                 fd_socket: socket.socket | None = None, loaders: Loaders | None = None,
                 fail_step: int | None = None, flush: Callable[[], None] = lambda: None) -> None:
        self.core = core
        self.emit = emit
        self.flush = flush  # writes what `emit` holds (loop.EventWriter): before a step, so its start is seen
        self.arena_fd = arena_fd
        self.arena_bytes = arena_bytes
        self.fd_socket = fd_socket
        self.loaders = loaders or Loaders()
        self.arena: Any = None
        self.bridge: Any = None
        self.exit_code: int | None = None  # set by the core's Exit
        self.reopened = 0  # ring ends reopened on new eventfds so far (the loop re-registers them)
        self.fail_step = fail_step  # test-only (testhooks.py): None unless its environment variable is set
        self.log = get_logger(component="worker")

    def feed(self, inp: m.Input) -> None:
        """Hand `inp` to the core and perform what it asks, in order; an action's outcome is the core's next
        input only once every action of the input before it is performed. Feeding an outcome at once would
        let the progress it triggers emit events ahead of ones the core decided earlier: an ObjectLoaded
        the core queued behind a RunStep would reach stdout after the one loaded while that step ran, and
        the stage would see sequence N+1 before N."""
        pending = collections.deque([inp])
        while pending:
            for action in self.core.handle(pending.popleft()):
                outcome = self._perform(action)
                if outcome is not None:
                    pending.append(outcome)

    def command_frame(self, frame: bytes) -> None:
        """One command as framing.FrameReader split it off stdin."""
        try:
            cmd: m.Input = framing.decode_command(frame)
        except wire.MalformedMessage as e:
            cmd = m.Malformed(str(e))
        self.feed(cmd)

    def loader_woke(self) -> None:
        for ev in self.loaders.events():
            self.feed(ev)

    def _perform(self, action: m.Action) -> m.Input | None:
        match action:
            case m.Emit(event):
                self.emit(event)
            case m.OpenRingHelper():
                return self._open_ring_helper()
            case m.OpenBackend(device, memory_limit):
                return self._open_backend(device, memory_limit)
            case m.OpenRing(cmd):
                return self._open_ring(cmd)
            case m.ShareFds(ring_id, end):
                return self._share_fds(ring_id, end)
            case m.CloseRing(end):
                end.release()
            case m.StartLoad(role_id, config, threads, graph_cache):
                self.loaders.start(role_id, partial(roles.load, config, self.bridge, threads=threads, graph_cache=graph_cache))
            case m.CancelLoad(role_id):
                self.loaders.cancel(role_id)
            case m.ResetRole(role_id, role, config):
                return self._reset_role(role_id, role, config)
            case m.RunStep(step_id, role, inputs, runtime):
                return self._run_step(step_id, role, inputs, runtime)
            case m.FreeDeviceObject(obj):
                self.bridge.free(obj)
            case m.Exit(code):
                self.exit_code = code
        return None

    # ---- backend ----

    def _open_ring_helper(self) -> m.Input:
        # The native helper is imported only now, so a process that cannot load it still reads its
        # InitializeWorker and answers it with an event.
        from swactor.common import ringport
        from swactor.edgeend.header import HEADER_CODEC

        return m.RingHelperOpened(ringport.ABI_VERSION, HEADER_CODEC)

    def _open_backend(self, device: str | None, memory_limit: int = 0) -> m.Input:
        from swactor.common import ringport

        try:
            self.arena = ringport.map_arena(self.arena_fd, self.arena_bytes)
        except (OSError, ValueError) as e:
            return m.HostFailed(pb.WORKER_FATAL_ARENA_MAP_FAILED, f"fd {self.arena_fd}, {self.arena_bytes} bytes: {e}")
        try:
            from swactor.worker.process.device import DeviceBridge, DeviceSink

            self.bridge = DeviceBridge(device, memory_limit)
        except Exception as e:  # whatever tinygrad raises for a device it cannot open
            return m.HostFailed(pb.WORKER_FATAL_BACKEND_INIT_FAILED, f"{type(e).__name__}: {e}")
        return m.BackendReady(os.getpid(), self.bridge.device, DeviceSink(self.bridge))

    # ---- rings ----

    def _ring_fds(self, ring_id: int) -> dict[str, int] | m.HostFailed:
        try:
            return fdpass.receive_ring_fds(self.fd_socket, ring_id)
        except fdpass.FdPassError as e:  # the side channel is out of step with stdin: nothing after is trustworthy
            return m.HostFailed(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, str(e))

    def _open_ring(self, cmd: wire.InstallRing) -> m.Input:
        from swactor.common import ringport

        wake = self._ring_fds(cmd.ring_id) if cmd.wake_fds else {}
        if isinstance(wake, m.HostFailed):
            return wake
        try:
            open_end = ringport.open_consumer if cmd.direction == "Ingress" else ringport.open_producer
            return m.RingOpened(cmd.ring_id, open_end(self.arena, cmd.layout, **wake))
        except RingBroken as e:
            return m.RingOpenFailed(cmd.ring_id, e.reason, e.detail)
        finally:
            for fd in wake.values():
                os.close(fd)  # ring-rs keeps its own duplicates

    def _share_fds(self, ring_id: int, end: Any) -> m.Input | None:
        import swactor_ring as sr

        fds = self._ring_fds(ring_id)
        if isinstance(fds, m.HostFailed):
            return fds
        try:
            if end is not None:
                end.reopen(fds["readable_fd"], fds["writable_fd"])
                self.reopened += 1
                self.log.info("ring_wake_fds_shared", ring_id=ring_id)
        except (RingBroken, sr.RingError, OSError, ValueError) as e:  # released, or not eventfds: keep private fds
            self.log.warning("ring_wake_fds_rejected", ring_id=ring_id, detail=str(e))
        finally:
            for fd in fds.values():
                os.close(fd)
        return None

    # ---- role code ----

    def _reset_role(self, role_id: int, role: Any, config: dict[str, Any]) -> m.Input:
        try:
            role.reset(config)
        except Exception as e:  # role code: classified by type, never fatal
            c = self._classified(failures.LOAD_FAILURES, e, "role_reset_failed", role_id=role_id)
            return m.RoleReset(role_id, c.reason, c.detail)
        return m.RoleReset(role_id)

    def _run_step(self, step_id: int, role: Any, inputs: list[Any], runtime: dict[str, Any]) -> m.Input:
        self.flush()
        try:
            testhooks.check_step(self.fail_step, step_id)
            outputs = role.step(inputs, runtime)
        except Exception as e:  # role code: classified by type, never fatal
            c = self._classified(failures.STEP_FAILURES, e, "role_step_failed", step_id=step_id)
            return m.StepRaised(step_id, c.reason, c.detail)
        layers_s = roles.layers_seconds(role)
        return m.StepRan(step_id, list(outputs), layers_us=max(1, round(layers_s * 1e6)) if layers_s else 0)

    def _classified(self, table: failures.Table, e: Exception, what: str, **ids: int) -> failures.Classified:
        c = failures.classify(table, e)
        tb = None if c.known else traceback.format_exc()  # an exception no row names is worth its traceback
        self.log.error(what, reason=name(table.enum, c.reason), detail=c.detail, known=c.known, tb=tb, **ids)
        return c
