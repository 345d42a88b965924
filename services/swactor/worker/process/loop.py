"""The compute process (spec §28-33): `python -m swactor.worker.process` runs `main()`, spawned by GpuWorkerCtl.

Environment: SWACTOR_ARENA_FD (inherited memfd of the node arena), SWACTOR_ARENA_BYTES (its
ceiling), optionally SWACTOR_FD_SOCKET (inherited Unix socket carrying ring eventfds, `fdpass`). Commands arrive as JSON lines on stdin, events leave as JSON lines on stdout (nothing
else is ever written there), logs go to stderr. A line that is not a known command is fatal
(WorkerFatal MalformedControlMessage, exit 1).

Worker FSM (§31): Booting -> Running -> Draining -> (exit) | Fatal. The loop waits on stdin, on
the rings' wake eventfds and on the role loader's wakeup pipe; after every command or wake it makes
all the progress it can (§31: drain readable ingress prefixes, advance egress output), one step at
a time. A cold ConfigureRole loads on a thread (`role_loader`), so commands are served while the
weights load; CancelRole and ShutdownWorker abandon a load at its next layer.
"""

from __future__ import annotations

import enum
import os
import selectors
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from swactor.common.events import configure_logging, get_logger
from swactor.common.reasons import ReasonError, name
from swactor.common.ringerrors import RingBroken
from swactor.edgeend.objects import (
    Broken,
    Closed,
    EgressProducer,
    Failed,
    HeaderFacts,
    IngressParser,
    IngressState,
    Loaded,
    ObjectRules,
    OutputRejected,
    Produced,
    SinkFailed,
)
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import fdpass, role_loader, wire

_ACTIVE_INGRESS = (IngressState.NEED_HEADER, IngressState.NEED_PAYLOAD)


class WorkerState(enum.Enum):
    BOOTING = "Booting"
    RUNNING = "Running"
    DRAINING = "Draining"
    STOPPED = "Stopped"
    FATAL = "Fatal"


RECHECK_MIN_S = 0.001
RECHECK_MAX_S = 0.032


class Fatal(ReasonError):
    """WorkerFatal: `reason` is a WorkerFatalReason."""


@dataclass
class IngressSlot:
    cmd: wire.InstallRing
    ring: Any  # ringport.ConsumerEnd
    parser: IngressParser


@dataclass
class EgressSlot:
    cmd: wire.InstallRing
    ring: Any  # ringport.ProducerEnd
    producer: EgressProducer


@dataclass
class Step:
    cmd: wire.ExecuteStep
    outputs: dict[int, tuple[wire.OutputBinding, Any]]  # ring_id -> (binding, DeviceAllocation)
    done: set[int] = field(default_factory=set)


class WorkerProcess:
    """Everything but the loop: command handlers, ring progress, the handle table."""

    def __init__(self, emit: Callable[[Any], None], arena_fd: int, arena_bytes: int,
                 fd_socket: socket.socket | None = None) -> None:
        self.emit = emit
        self.fd_socket = fd_socket
        self.arena_fd = arena_fd
        self.arena_bytes = arena_bytes
        self.state = WorkerState.BOOTING
        self.generation = 0
        self.arena: Any = None
        self.bridge: Any = None
        self.codec: Any = None
        self.role: Any = None
        self.role_id: int | None = None
        self.threads: int | None = None  # backend.threads: CPU cores of the compute kernels (None: auto)
        self.loading: role_loader.RoleLoader | None = None  # the cold load in flight
        self.pending: wire.ConfigureRole | None = None  # the next load, once the cancelled one has ended
        self.wakeup = role_loader.Wakeup()
        self._last_progress: tuple[int, int] | None = None
        self.ingress: dict[int, IngressSlot] = {}
        self.egress: dict[int, EgressSlot] = {}
        self.handles: dict[int, Any] = {}  # handle id -> DeviceAllocation
        self._next_handle = 1
        self.step: Step | None = None
        self.shutdown_mode: str | None = None
        self.log = get_logger(component="worker")
        self._table: dict[type, Callable[[Any], None]] = {
            wire.InitializeWorker: self.on_initialize,
            wire.ConfigureRole: self.on_configure_role,
            wire.CancelRole: self.on_cancel_role,
            wire.InstallRing: self.on_install_ring,
            wire.UninstallRing: self.on_uninstall_ring,
            wire.ShareWakeFds: self.on_share_wake_fds,
            wire.RingReadable: lambda _c: None,  # hints: progress() reloads the cursors
            wire.RingWritable: lambda _c: None,
            wire.ExecuteStep: self.on_execute_step,
            wire.ReleaseDeviceObject: self.on_release,
            wire.ShutdownWorker: self.on_shutdown,
        }

    def _transition(self, new: WorkerState, **facts: Any) -> None:
        old, self.state = self.state, new
        self.log.info("worker_state", old=old.value, new=new.value, worker_generation=self.generation, **facts)

    # ---- dispatch ----

    def handle_line(self, line: bytes) -> None:
        try:
            cmd = wire.decode_command(line)
        except wire.MalformedMessage as e:
            raise Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, str(e)) from None
        if self.state is WorkerState.BOOTING and not isinstance(cmd, wire.InitializeWorker | wire.ShutdownWorker):
            raise Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, f"{type(cmd).__name__} before InitializeWorker")
        self._table[type(cmd)](cmd)
        self.progress()

    # ---- lifecycle ----

    def on_initialize(self, cmd: wire.InitializeWorker) -> None:
        if self.state is not WorkerState.BOOTING:
            raise Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, "InitializeWorker sent twice")
        from swactor.common import ringport  # native helper: imported here so an ABI problem is an event
        from swactor.edgeend.header import HEADER_CODEC

        if cmd.required_ring_helper_abi != ringport.ABI_VERSION:
            raise Fatal(pb.WORKER_FATAL_RING_HELPER_ABI_MISMATCH,
                        f"required ring helper ABI {cmd.required_ring_helper_abi}, have {ringport.ABI_VERSION}")
        if cmd.arena_ceiling != self.arena_bytes:
            raise Fatal(pb.WORKER_FATAL_ARENA_MAP_FAILED,
                        f"arena_ceiling {cmd.arena_ceiling} != SWACTOR_ARENA_BYTES {self.arena_bytes}")
        try:
            self.arena = ringport.map_arena(self.arena_fd, self.arena_bytes)
        except (OSError, ValueError) as e:
            raise Fatal(pb.WORKER_FATAL_ARENA_MAP_FAILED, f"fd {self.arena_fd}, {self.arena_bytes} bytes: {e}") from None
        self.codec = HEADER_CODEC
        threads = cmd.backend.get("threads", 0)
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
            raise Fatal(pb.WORKER_FATAL_BACKEND_INIT_FAILED, f"backend.threads must be a non-negative integer (0 = auto), got {threads!r}")
        self.threads = threads or None
        try:
            from swactor.worker.process.device import DeviceBridge

            self.bridge = DeviceBridge(cmd.backend.get("device"))
        except Exception as e:
            raise Fatal(pb.WORKER_FATAL_BACKEND_INIT_FAILED, f"{type(e).__name__}: {e}") from None
        self.generation = cmd.worker_generation
        self._transition(WorkerState.RUNNING)
        self.emit(wire.WorkerReady(os.getpid(), self.generation, ringport.ABI_VERSION,
                                   {"device": self.bridge.device, "threads": self.threads or 0}))

    def on_configure_role(self, cmd: wire.ConfigureRole) -> None:
        if self.state is not WorkerState.RUNNING:
            self.emit(wire.RoleFailed(cmd.role_id, pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN, "worker is draining"))
            return
        if self.loading is not None:  # a newer config wins: the load in flight is abandoned first
            self.loading.cancel(pb.ROLE_FAILURE_LOAD_CANCELLED, f"superseded by ConfigureRole {cmd.role_id}")
            if self.pending is not None:
                self.emit(wire.RoleFailed(self.pending.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED,
                                          f"superseded by ConfigureRole {cmd.role_id}"))
            self.pending = cmd
            return
        self._configure(cmd)

    def _configure(self, cmd: wire.ConfigureRole) -> None:
        from swactor.worker.process import roles

        warm = roles.reuse(self.role, cmd.config)
        if warm is not None:
            self.role, self.role_id = warm, cmd.role_id
            self.emit(wire.RoleConfigured(cmd.role_id, True))
            return
        # Cold: drop the resident role first (its device memory), then load on the loader thread.
        self.role, self.role_id = None, None
        bridge, config, threads = self.bridge, cmd.config, self.threads
        self.loading = role_loader.RoleLoader(
            cmd.role_id, config, lambda progress: roles.load(config, bridge, progress, threads=threads), self.wakeup)
        self._last_progress = None
        self.log.info("role_load_started", role_id=cmd.role_id, threads=threads or 0)
        self.loading.start()

    def on_cancel_role(self, cmd: wire.CancelRole) -> None:
        if self.pending is not None and self.pending.role_id == cmd.role_id:
            self.pending = None
            self.emit(wire.RoleFailed(cmd.role_id, pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole before its load started"))
        elif self.loading is not None and self.loading.role_id == cmd.role_id:
            self.loading.cancel(pb.ROLE_FAILURE_LOAD_CANCELLED, "CancelRole")
        else:
            self.log.info("cancel_role_ignored", role_id=cmd.role_id, loaded=cmd.role_id == self.role_id)

    def _poll_loader(self) -> None:
        """Report what the loader thread said; once it has ended, adopt or discard its role."""
        ld = self.loading
        if ld is None:
            return
        for ev in ld.events():
            match ev:
                case role_loader.LoadProgress(done, total):
                    if not ld.cancelled and self._last_progress != (done, total):  # one event per layer
                        self._last_progress = (done, total)
                        self.emit(wire.RoleProgress(ld.role_id, done, total))
                case role_loader.LoadDone(role) if ld.cancel_reason is None:
                    self.role, self.role_id = role, ld.role_id
                    self.log.info("role_loaded", role_id=ld.role_id)
                    self.emit(wire.RoleConfigured(ld.role_id, False))
                case role_loader.LoadDone() | role_loader.LoadFailed():
                    # cancelled: a role that finished anyway is dropped here (its weights with it)
                    reason, detail = ld.cancel_reason or (ev.reason, ev.detail)  # type: ignore[union-attr]
                    self.log.info("role_load_ended", role_id=ld.role_id, reason=name(pb.RoleFailure, reason), detail=detail)
                    self.emit(wire.RoleFailed(ld.role_id, reason, detail))
        if ld.ended:
            self.loading = None
            if self.pending is not None:
                cmd, self.pending = self.pending, None
                self._configure(cmd)

    def on_shutdown(self, cmd: wire.ShutdownWorker) -> None:
        if cmd.mode not in ("Graceful", "AbortInFlight"):
            raise Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, f"ShutdownWorker.mode {cmd.mode!r}")
        self.shutdown_mode = cmd.mode
        if self.pending is not None:
            self.emit(wire.RoleFailed(self.pending.role_id, pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN, "ShutdownWorker before its load"))
            self.pending = None
        if self.loading is not None:  # not worth waiting for: the process exit ends the thread (main)
            ld, self.loading = self.loading, None
            ld.cancel(pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN, f"ShutdownWorker {cmd.mode} during the load")
            self.emit(wire.RoleFailed(ld.role_id, pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN, f"ShutdownWorker {cmd.mode} during the load"))
        if self.state is WorkerState.BOOTING:
            self._transition(WorkerState.STOPPED)
            self.emit(wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL))
            return
        self._transition(WorkerState.DRAINING, mode=cmd.mode)
        if cmd.mode == "AbortInFlight" and self.step is not None:
            self._fail_step(pb.STEP_FAILURE_WORKER_SHUTTING_DOWN, "ShutdownWorker AbortInFlight")

    def _finish_draining(self) -> None:
        for ring_id in sorted(self.ingress) + sorted(self.egress):
            self._uninstall(ring_id)
        for hid in sorted(self.handles):
            self.bridge.free(self.handles.pop(hid))
        self._transition(WorkerState.STOPPED)
        self.emit(wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL if self.shutdown_mode == "Graceful"
                                     else pb.WORKER_STOPPED_ABORT_IN_FLIGHT))

    # ---- rings ----

    def on_install_ring(self, cmd: wire.InstallRing) -> None:
        from swactor.common import ringport

        def fault(reason: int, detail: str) -> None:
            self.emit(wire.RingFault(cmd.ring_id, cmd.edge_id, cmd.port_id, reason, detail))

        if self.state is not WorkerState.RUNNING:
            return fault(pb.RING_FAULT_WORKER_SHUTTING_DOWN, "worker is draining")
        if cmd.ring_id in self.ingress or cmd.ring_id in self.egress:
            return fault(pb.RING_FAULT_RING_STATE_INVALID, f"ring {cmd.ring_id} is already installed")
        if cmd.layout.ring_id != cmd.ring_id:
            return fault(pb.RING_FAULT_RING_LAYOUT_INVALID, f"layout.ring_id {cmd.layout.ring_id} != ring_id {cmd.ring_id}")
        s = cmd.object_spec
        try:
            rules = ObjectRules.from_spec(s.max_extent, s.dtype_width_bytes, s.row_elements, s.alignment,
                                          s.sequence_policy)
        except ValueError as e:
            return fault(pb.RING_FAULT_RING_LAYOUT_INVALID, f"object_spec: {e}")
        ids = {"ring_id": cmd.ring_id, "edge_id": cmd.edge_id, "port_id": cmd.port_id}
        wake: dict[str, int] = {}
        if cmd.wake_fds:
            try:
                wake = fdpass.receive_ring_fds(self.fd_socket, cmd.ring_id)
            except fdpass.FdPassError as e:
                raise Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, str(e)) from None
        try:
            if cmd.direction == "Ingress":
                end = ringport.open_consumer(self.arena, cmd.layout, **wake)
                from swactor.worker.process.device import DeviceSink

                parser = IngressParser(end, self.codec, rules, DeviceSink(self.bridge), **ids)
                self.ingress[cmd.ring_id] = IngressSlot(cmd, end, parser)
            elif cmd.direction == "Egress":
                end = ringport.open_producer(self.arena, cmd.layout, **wake)
                self.egress[cmd.ring_id] = EgressSlot(cmd, end, EgressProducer(end, self.codec, rules, **ids))
            else:
                return fault(pb.RING_FAULT_RING_LAYOUT_INVALID, f"direction {cmd.direction!r} is not Ingress or Egress")
        except RingBroken as e:
            return fault(e.reason, e.detail)
        finally:
            for fd in wake.values():
                os.close(fd)  # ring-rs keeps its own duplicates
        self.emit(wire.RingInstalled(cmd.ring_id, cmd.edge_id, cmd.port_id))

    def on_share_wake_fds(self, cmd: wire.ShareWakeFds) -> None:
        try:
            fds = fdpass.receive_ring_fds(self.fd_socket, cmd.ring_id)
        except fdpass.FdPassError as e:
            raise Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, str(e)) from None
        try:
            slot: IngressSlot | EgressSlot | None = self.ingress.get(cmd.ring_id) or self.egress.get(cmd.ring_id)
            if slot is not None:
                slot.ring.reopen(fds["readable_fd"], fds["writable_fd"])
                self.log.info("ring_wake_fds_shared", ring_id=cmd.ring_id)
        except Exception as e:  # a stale ring id or an fd that is not an eventfd: keep private fds
            self.log.warning("ring_wake_fds_rejected", ring_id=cmd.ring_id, detail=str(e))
        finally:
            for fd in fds.values():
                os.close(fd)

    def on_uninstall_ring(self, cmd: wire.UninstallRing) -> None:
        if self.step is not None and cmd.ring_id in self.step.outputs:
            self._fail_step(pb.STEP_FAILURE_INVALID_OUTPUT_RING, f"ring {cmd.ring_id} uninstalled ({name(pb.UninstallReason, cmd.reason)})")
        self._uninstall(cmd.ring_id)

    def _uninstall(self, ring_id: int) -> None:
        """Uninstalling (§32): stop consuming/producing; copies are synchronous, so none is in flight."""
        slot: IngressSlot | EgressSlot | None = self.ingress.pop(ring_id, None) or self.egress.pop(ring_id, None)
        if slot is not None:
            if isinstance(slot, IngressSlot):
                slot.parser.uninstall()
            else:
                slot.producer.uninstall()
            slot.ring.release()
        self.emit(wire.RingQuiesced(ring_id))

    def arm(self) -> tuple[dict[int, Any], bool]:
        """Arm the wake bit of every ring end worth waiting on: ({fd: end}, ready_now)."""
        fds: dict[int, Any] = {}
        ready = False
        ends = [s.ring for s in self.ingress.values() if s.parser.state in _ACTIVE_INGRESS]
        if self.step is not None:
            ends += [self.egress[r].ring for r in self.step.outputs
                     if r in self.egress and self.egress[r].producer.busy]
        for end in ends:
            fd = end.arm_wait()
            if fd is None:
                ready = True
            else:
                fds[fd] = end
        return fds, ready

    def progress(self) -> None:
        self._poll_loader()
        for slot in list(self.ingress.values()):
            for ev in slot.parser.pump():
                self._on_ingress(slot, ev)
        if self.step is not None:
            for rid in list(self.step.outputs):
                eslot = self.egress.get(rid)
                if eslot is None or self.step is None:
                    continue
                for ev in eslot.producer.pump():
                    self._on_egress(eslot, ev)
        if self.state is WorkerState.DRAINING and self.step is None and self.loading is None:
            self._finish_draining()

    def _on_ingress(self, slot: IngressSlot, ev: Any) -> None:
        c = slot.cmd
        match ev:
            case Loaded(facts, writer):
                hid = self._next_handle
                self._next_handle += 1
                self.handles[hid] = writer.alloc
                self.emit(wire.ObjectLoaded(c.ring_id, c.edge_id, c.port_id, facts.object_id, facts.sequence,
                                            facts.extent, wire.DeviceHandle(self.generation, hid)))
            case Failed(reason, detail, object_id, sequence):
                self.emit(wire.ObjectFailed(c.ring_id, c.edge_id, c.port_id, object_id, sequence, reason, detail))
            case Broken(reason, detail):
                self.emit(wire.RingFault(c.ring_id, c.edge_id, c.port_id, reason, detail))
            case Closed():
                self.log.info("ingress_closed", ring_id=c.ring_id, edge_id=c.edge_id)

    def _on_egress(self, slot: EgressSlot, ev: Any) -> None:
        c, step = slot.cmd, self.step
        assert step is not None
        match ev:
            case Produced(facts):
                self.emit(wire.ObjectProduced(c.ring_id, c.edge_id, c.port_id, facts.object_id, facts.sequence,
                                              facts.extent))
                step.done.add(c.ring_id)
                if step.done == set(step.outputs):
                    self._complete_step()
            case Broken(reason, detail):
                self.emit(wire.RingFault(c.ring_id, c.edge_id, c.port_id, reason, detail))
                self._fail_step(pb.STEP_FAILURE_OUTPUT_COPY_FAILED, detail)

    # ---- steps ----

    def on_execute_step(self, cmd: wire.ExecuteStep) -> None:
        def failed(reason: int, detail: str) -> None:
            self.emit(wire.StepFailed(cmd.role_id, cmd.step_id, reason, detail))

        if self.state is not WorkerState.RUNNING:
            return failed(pb.STEP_FAILURE_WORKER_SHUTTING_DOWN, "worker is draining")
        if self.step is not None:
            return failed(pb.STEP_FAILURE_ROLE_UNAVAILABLE, f"step {self.step.cmd.step_id} is still in flight")
        if self.role is None or cmd.role_id != self.role_id:
            return failed(pb.STEP_FAILURE_ROLE_UNAVAILABLE, f"role {cmd.role_id} is not configured")
        inputs = []
        for b in cmd.inputs:
            h = b.device_handle
            if h.worker_generation != self.generation or h.id not in self.handles:
                return failed(pb.STEP_FAILURE_INVALID_INPUT_HANDLE, f"handle {h.id} of generation {h.worker_generation}")
            inputs.append(self.handles[h.id])
        if len({o.ring_id for o in cmd.outputs}) != len(cmd.outputs):
            return failed(pb.STEP_FAILURE_INVALID_OUTPUT_RING, "two output bindings name the same ring")
        for o in cmd.outputs:
            eslot = self.egress.get(o.ring_id)
            if eslot is None or eslot.producer.busy:
                return failed(pb.STEP_FAILURE_INVALID_OUTPUT_RING, f"ring {o.ring_id} is not an idle installed egress ring")
        self.log.info("execute_step_started", step_id=cmd.step_id, role_id=cmd.role_id,
                      sequence=[b.sequence for b in cmd.inputs])
        try:
            results = self.role.step(inputs, cmd.runtime)
        except MemoryError as e:
            return failed(pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY, str(e))
        except SinkFailed as e:
            return failed(pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY if e.reason == pb.OBJECT_FAILURE_DEVICE_ALLOCATION_FAILED
                          else pb.STEP_FAILURE_OUTPUT_COPY_FAILED,
                          e.detail)
        except Exception as e:
            self.log.error("role_step_failed", step_id=cmd.step_id, error=repr(e), tb=traceback.format_exc())
            reason = (pb.STEP_FAILURE_DEVICE_OUT_OF_MEMORY if "out of memory" in str(e).lower()
                      else pb.STEP_FAILURE_TINYGRAD_ERROR)
            return failed(reason, f"{type(e).__name__}: {e}")
        if len(results) != len(cmd.outputs):
            for a in results:
                self.bridge.free(a)
            return failed(pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID, f"role produced {len(results)} outputs, {len(cmd.outputs)} bound")
        from swactor.worker.process.device import DeviceObjectSource

        self.step = Step(cmd, {o.ring_id: (o, a) for o, a in zip(cmd.outputs, results, strict=True)})
        for o, a in zip(cmd.outputs, results, strict=True):
            try:
                self.egress[o.ring_id].producer.start(HeaderFacts(o.object_id, o.sequence, o.extent, o.flags),
                                                      DeviceObjectSource(self.bridge, a))
            except OutputRejected as e:
                return self._fail_step(e.reason, e.detail)
        if not cmd.outputs:
            self._complete_step()

    def _end_step(self) -> Step:
        step = self.step
        assert step is not None
        self.step = None
        for _binding, alloc in step.outputs.values():
            self.bridge.free(alloc)
        return step

    def _complete_step(self) -> None:
        step = self._end_step()
        if step.cmd.release_inputs_after:
            for b in step.cmd.inputs:
                self._release(b.device_handle)
        self.emit(wire.StepCompleted(step.cmd.role_id, step.cmd.step_id))

    def _fail_step(self, reason: int, detail: str) -> None:
        step = self._end_step()
        for rid in step.outputs:
            eslot = self.egress.get(rid)
            if eslot is not None and eslot.producer.busy:
                # A half-written object cannot be completed: the ring is unusable for this edge.
                eslot.producer.uninstall()
                self.emit(wire.RingFault(rid, eslot.cmd.edge_id, eslot.cmd.port_id, pb.RING_FAULT_WORKER_INTERNAL,
                                         f"output abandoned mid-object: {reason}"))
        self.emit(wire.StepFailed(step.cmd.role_id, step.cmd.step_id, reason, detail))

    # ---- device objects ----

    def on_release(self, cmd: wire.ReleaseDeviceObject) -> None:
        self._release(cmd.device_handle)

    def _release(self, h: wire.DeviceHandle) -> None:
        if h.worker_generation != self.generation:
            self.emit(wire.ReleaseFailed(h, pb.RELEASE_FAILURE_STALE_GENERATION))
        elif self.step is not None and any(b.device_handle == h for b in self.step.cmd.inputs):
            self.emit(wire.ReleaseFailed(h, pb.RELEASE_FAILURE_IN_USE))
        elif h.id not in self.handles:
            self.emit(wire.ReleaseFailed(h, pb.RELEASE_FAILURE_UNKNOWN_HANDLE))
        else:
            self.bridge.free(self.handles.pop(h.id))
            self.emit(wire.DeviceObjectReleased(h))


# ---- the loop ----


def _writer(out: TextIO) -> Callable[[Any], None]:
    def emit(event: Any) -> None:
        out.write(wire.encode(event) + "\n")
        out.flush()

    return emit


def serve(stdin_fd: int, out: TextIO, arena_fd: int, arena_bytes: int, fd_socket: socket.socket | None = None) -> int:
    """The §31 loop: block on stdin and armed ring eventfds; progress after every wake.

    While some ring end is armed, the wait also times out after a short, doubling re-check interval
    (1 ms .. 32 ms): the peer signals its own eventfd, which this process only shares when the
    node hands ring eventfds over; until then the re-check bounds the latency of a lost hint.
    """
    worker = WorkerProcess(_writer(out), arena_fd, arena_bytes, fd_socket)
    sel = selectors.DefaultSelector()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_READ, None)
    sel.register(worker.wakeup.fileno(), selectors.EVENT_READ, worker.wakeup)  # has ack(), like a ring end
    pending = b""
    registered: dict[int, Any] = {}
    recheck = RECHECK_MIN_S
    spins = 0
    try:
        while worker.state is not WorkerState.STOPPED:
            wanted, ready_now = worker.arm()
            if ready_now and spins < 3:
                spins += 1
                worker.progress()
                continue
            spins = 0
            for fd in set(registered) - set(wanted):
                sel.unregister(fd)
            for fd in set(wanted) - set(registered):
                sel.register(fd, selectors.EVENT_READ, wanted[fd])
            registered = dict(wanted)
            timeout = recheck if (wanted or ready_now) else None
            events = sel.select(timeout)
            if not events:
                recheck = min(recheck * 2, RECHECK_MAX_S)
                worker.progress()
                continue
            recheck = RECHECK_MIN_S
            for key, _ in events:
                if key.data is not None:
                    key.data.ack()
                    continue
                chunk = os.read(stdin_fd, 1 << 16)
                if not chunk:  # the ctl is gone: nobody can command or read us any more
                    worker.log.warning("worker_stdin_closed")
                    return 1
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        worker.handle_line(line)
                    if worker.state is WorkerState.STOPPED:
                        return 0
            worker.progress()
    except Fatal as e:
        worker.state = WorkerState.FATAL
        worker.log.error("worker_fatal", reason=name(pb.WorkerFatalReason, e.reason), detail=e.detail)
        worker.emit(wire.WorkerFatal(e.reason, e.detail))
        return 1
    except Exception as e:
        worker.log.error("worker_fatal", reason="WORKER_FATAL_UNHANDLED_EXCEPTION", detail=repr(e), tb=traceback.format_exc())
        worker.emit(wire.WorkerFatal(pb.WORKER_FATAL_UNHANDLED_EXCEPTION, f"{type(e).__name__}: {e}"))
        return 1
    return 0


def main() -> None:
    configure_logging("swactor-worker-process", pid=os.getpid())
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but events may reach the real stdout (a stray print goes to logs)
    emit = _writer(out)
    try:
        arena_fd = int(os.environ["SWACTOR_ARENA_FD"])
        arena_bytes = int(os.environ["SWACTOR_ARENA_BYTES"])
    except (KeyError, ValueError) as e:
        emit(wire.WorkerFatal(pb.WORKER_FATAL_ARENA_MAP_FAILED, f"SWACTOR_ARENA_FD / SWACTOR_ARENA_BYTES missing or not integers: {e}"))
        sys.exit(1)
    fd_socket = None
    if os.environ.get("SWACTOR_FD_SOCKET"):
        fd_socket = socket.socket(fileno=int(os.environ["SWACTOR_FD_SOCKET"]))
    rc = serve(sys.stdin.fileno(), out, arena_fd, arena_bytes, fd_socket)
    if role_loader.loads_running():  # a load ShutdownWorker abandoned: exit now, without joining it
        out.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)

