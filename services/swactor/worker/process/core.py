"""The compute process as a pure core (spec §28-33): `WorkerCore.handle(input) -> actions`.

It owns the worker FSM state (§31, `fsm.py`), the installed rings with their §32 FSMs (`rings.py`),
the role and its loads (`roleslot.py`), the device-handle table and the step in flight. Inputs are
the wire commands, ring wakes, the role loader's events and the outcomes of earlier actions
(`messages.py`); actions are events to write on stdout and the work only the shell can do (open the
backend or a ring, run role code, free device objects, load on a thread). After every input the core makes all the progress the rings
allow (§31: drain readable ingress prefixes, advance egress output), so a wake needs no argument.

Failures that end the process raise `_Fatal` anywhere below and are turned into WorkerFatal in one
place, `handle`; every other failure is an event naming a §37 reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.common.reasons import ReasonError, name
from swactor.edgeend.objects import Broken, Closed, Failed, Loaded, OutputRejected, Produced
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import messages as m
from swactor.worker.process import wire
from swactor.worker.process.fsm import TERMINAL, Admission, WorkerInput, WorkerState, admission, transition
from swactor.worker.process.rings import RingTable, install_problem
from swactor.worker.process.roleslot import RoleSlot

SHUTDOWN_MODES = ("Graceful", "AbortInFlight")


class _Fatal(ReasonError):
    """WorkerFatal: `reason` is a WorkerFatalReason."""


@dataclass
class Step:
    cmd: wire.ExecuteStep
    ran: bool = False  # the role's outputs have come back (StepRan)
    outputs: dict[int, tuple[wire.OutputBinding, Any]] = field(default_factory=dict)  # ring_id -> (binding, obj)
    done: set[int] = field(default_factory=set)  # rings whose output is produced
    dropped: set[int] = field(default_factory=set)  # output rings uninstalled mid-step (a batched step's run left)
    layers_us: int = 0  # StepRan's: said with StepCompleted

    def binds(self, ring_id: int) -> bool:
        return any(o.ring_id == ring_id for o in self.cmd.outputs) and ring_id not in self.dropped

    def finished(self) -> bool:
        return self.ran and self.done >= set(self.outputs)


@dataclass
class Grant:
    """A GrantSteps that stands, and where it is: the next object it takes, the step id and position that gets."""

    cmd: wire.GrantSteps
    sequence: int
    step_id: int
    start_pos: int

    def covers(self, facts: Any) -> bool:
        # any flag (a prompt chunk, drafts, a rewind) asks for something else than the position one on
        return facts.sequence == self.sequence and facts.extent == self.cmd.row_bytes and not facts.flags

    def next_step(self, port_id: int, facts: Any, handle: wire.DeviceHandle) -> wire.ExecuteStep:
        """The ExecuteStep the stage controller would have sent for this object; the grant moves past it."""
        c, o = self.cmd, self.cmd.output
        step = wire.ExecuteStep(c.role_id, self.step_id, [wire.InputBinding(port_id, facts.object_id, facts.sequence, handle)],
                                [wire.OutputBinding(o.port_id, o.ring_id, facts.object_id, facts.sequence, o.extent, facts.flags)],
                                {**c.runtime, "start_pos": self.start_pos}, True)
        self.sequence, self.step_id, self.start_pos = self.sequence + 1, self.step_id + 1, self.start_pos + 1
        return step


class WorkerCore:
    """One compute process's state; `handle` is the only way it changes."""

    def __init__(self, arena_bytes: int, log: Any = None) -> None:
        self.arena_bytes = arena_bytes  # SWACTOR_ARENA_BYTES: InitializeWorker.arena_ceiling must agree
        self.state = WorkerState.BOOTING
        self.generation = 0
        self.ring_abi = 0
        self.codec: Any = None
        self.sink: Any = None
        self.log = log or get_logger(component="worker")
        self.roles = RoleSlot(self._do, self.log)
        self.rings = RingTable()
        self.handles: dict[int, Any] = {}  # handle id -> device object
        self.step: Step | None = None
        self.grant: Grant | None = None
        self.shutdown_mode: str | None = None
        self._init: wire.InitializeWorker | None = None  # waiting for RingHelperOpened, then BackendReady
        self._opening: dict[int, wire.InstallRing] = {}  # waiting for RingOpened
        self._next_handle = 1
        self._out: list[m.Action] = []
        self._commands: dict[type, Any] = {
            wire.InitializeWorker: self._initialize,
            wire.ConfigureRole: self.roles.configure,
            wire.CancelRole: self.roles.cancel,
            wire.InstallRing: self._install_ring,
            wire.UninstallRing: self._uninstall_ring,
            wire.ShareWakeFds: lambda c: self._do(m.ShareFds(c.ring_id, self.rings.end(c.ring_id))),
            wire.RingReadable: lambda _c: None,  # hints: every input ends in progress()
            wire.RingWritable: lambda _c: None,
            wire.ExecuteStep: self._execute_step,
            wire.GrantSteps: self._grant_steps,
            wire.RevokeGrant: lambda c: self._end_grant("revoked", c.grant_id),
            wire.ReleaseDeviceObject: lambda c: self._release(c.device_handle),
            wire.ShutdownWorker: self._shutdown,
        }
        self._inputs: dict[type, Any] = {
            m.Malformed: lambda i: self._raise(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, i.detail),
            m.HostFailed: lambda i: self._raise(i.reason, i.detail),
            m.Signal: self._signal,
            m.RingHelperOpened: self._ring_helper_opened,
            m.BackendReady: self._backend_ready,
            m.RingOpened: self._ring_opened,
            m.RingOpenFailed: self._ring_open_failed,
            m.LoadProgress: self.roles.progress,
            m.LoadDone: self.roles.ended,
            m.LoadFailed: self.roles.ended,
            m.RoleReset: self.roles.reset_done,
            m.StepRan: self._step_ran,
            m.StepRaised: self._step_raised,
        }

    # ---- the one entry point ----

    def handle(self, inp: m.Input) -> list[m.Action]:
        """The actions `inp` calls for, in order; the shell feeds outcomes back as inputs."""
        if self.state in TERMINAL:
            return []
        try:
            if type(inp) in self._commands:
                self._command(inp)
            else:
                self._inputs[type(inp)](inp)
            self._progress()
        except _Fatal as e:
            self._transition(WorkerInput.FATAL, reason=name(pb.WorkerFatalReason, e.reason))
            self.log.error("worker_fatal", reason=name(pb.WorkerFatalReason, e.reason), detail=e.detail)
            self._emit(wire.WorkerFatal(e.reason, e.detail))
            self._do(m.Exit(1))
        out, self._out = self._out, []
        return out

    def waits(self) -> list[Any]:
        """The ring ends the loop should sleep on (it arms them; a wake is `Signal.WAKE`)."""
        return self.rings.waits(self.step.outputs if self.step is not None else ())

    def _do(self, action: m.Action) -> None:
        self._out.append(action)

    def _emit(self, event: wire.Event) -> None:
        self._out.append(m.Emit(event))

    @staticmethod
    def _raise(reason: int, detail: str) -> None:
        raise _Fatal(reason, detail)

    def _transition(self, event: WorkerInput, **facts: Any) -> None:
        old, self.state = self.state, transition(self.state, event)
        self.log.info("worker_state", old=old.value, new=self.state.value, input=event.value,
                      worker_generation=self.generation, **facts)

    def _command(self, cmd: wire.Command) -> None:
        match admission(self.state, cmd):
            case Admission.MALFORMED:
                what = "sent twice" if isinstance(cmd, wire.InitializeWorker) else "before InitializeWorker"
                raise _Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, f"{type(cmd).__name__} {what}")
            case Admission.REFUSE:
                self._refuse_draining(cmd)
            case Admission.SERVE:
                self._commands[type(cmd)](cmd)

    def _refuse_draining(self, cmd: wire.Command) -> None:
        detail = "worker is draining"
        match cmd:
            case wire.ConfigureRole(role_id):
                self._emit(wire.RoleFailed(role_id, pb.ROLE_FAILURE_WORKER_SHUTTING_DOWN, detail))
            case wire.InstallRing():
                self._refuse_install(cmd, pb.RING_FAULT_WORKER_SHUTTING_DOWN, detail)
            case wire.ExecuteStep(role_id, step_id):
                self._emit(wire.StepFailed(role_id, step_id, pb.STEP_FAILURE_WORKER_SHUTTING_DOWN, detail))
            case wire.GrantSteps(role_id=role_id, grant_id=grant_id, sequence=sequence):
                self._emit(wire.GrantEnded(role_id, grant_id, sequence, detail))

    def _refuse_install(self, cmd: wire.InstallRing, reason: int, detail: str) -> None:
        if cmd.wake_fds:  # the announced fds must leave the socket, or the next ring gets them
            self._do(m.ShareFds(cmd.ring_id, None))
        self._emit(wire.RingFault(cmd.ring_id, cmd.edge_id, cmd.port_id, reason, detail))

    # ---- lifecycle ----

    def _initialize(self, cmd: wire.InitializeWorker) -> None:
        self._init = cmd
        self._do(m.OpenRingHelper())

    def _ring_helper_opened(self, r: m.RingHelperOpened) -> None:
        cmd = self._pending_init()
        if cmd.required_ring_helper_abi != r.ring_abi:
            raise _Fatal(pb.WORKER_FATAL_RING_HELPER_ABI_MISMATCH, f"required ring helper ABI {cmd.required_ring_helper_abi}, "
                                                  f"have {r.ring_abi}")
        if cmd.arena_ceiling != self.arena_bytes:
            raise _Fatal(pb.WORKER_FATAL_ARENA_MAP_FAILED, f"arena_ceiling {cmd.arena_ceiling} != SWACTOR_ARENA_BYTES {self.arena_bytes}")
        threads = cmd.backend.get("threads", 0)
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
            raise _Fatal(pb.WORKER_FATAL_BACKEND_INIT_FAILED,
                         f"backend.threads must be a non-negative integer (0 = auto), got {threads!r}")
        self.roles.threads = threads or None
        graph_cache = cmd.backend.get("graph_cache", "")
        if not isinstance(graph_cache, str):
            raise _Fatal(pb.WORKER_FATAL_BACKEND_INIT_FAILED, f"backend.graph_cache must be a directory path or \"\", got {graph_cache!r}")
        self.roles.graph_cache = graph_cache
        limit = cmd.backend.get("memory_limit", 0)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise _Fatal(pb.WORKER_FATAL_BACKEND_INIT_FAILED,
                         f"backend.memory_limit must be a non-negative integer (0 = the device's own), got {limit!r}")
        self.ring_abi, self.codec = r.ring_abi, r.codec
        self._do(m.OpenBackend(cmd.backend.get("device"), limit))

    def _backend_ready(self, r: m.BackendReady) -> None:
        cmd = self._pending_init()
        self._init = None
        self.sink = r.sink
        self.generation = cmd.worker_generation
        self._transition(WorkerInput.INITIALIZED)
        self._emit(wire.WorkerReady(r.pid, self.generation, self.ring_abi,
                                    {"device": r.device, "threads": self.roles.threads or 0}))

    def _pending_init(self) -> wire.InitializeWorker:
        if self._init is None or self.state is not WorkerState.BOOTING:
            raise _Fatal(pb.WORKER_FATAL_UNHANDLED_EXCEPTION, "backend outcome without an InitializeWorker waiting for it")
        return self._init

    def _shutdown(self, cmd: wire.ShutdownWorker) -> None:
        if cmd.mode not in SHUTDOWN_MODES:
            raise _Fatal(pb.WORKER_FATAL_MALFORMED_CONTROL_MESSAGE, f"ShutdownWorker.mode {cmd.mode!r}")
        self.shutdown_mode = cmd.mode
        self._end_grant("worker shutting down")
        self.roles.shutdown(cmd.mode)
        booting = self.state is WorkerState.BOOTING
        self._transition(WorkerInput.SHUTDOWN, mode=cmd.mode)
        if booting:
            self._emit(wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL))
            self._do(m.Exit(0))
        elif cmd.mode == "AbortInFlight" and self.step is not None:
            self._fail_step(pb.STEP_FAILURE_WORKER_SHUTTING_DOWN, "ShutdownWorker AbortInFlight")

    def _finish_draining(self) -> None:
        for ring_id in self.rings.ring_ids():
            self._uninstall(ring_id)
        for hid in sorted(self.handles):
            self._do(m.FreeDeviceObject(self.handles.pop(hid)))
        self._transition(WorkerInput.DRAINED)
        self._emit(wire.WorkerStopped(pb.WORKER_STOPPED_GRACEFUL if self.shutdown_mode == "Graceful"
                                      else pb.WORKER_STOPPED_ABORT_IN_FLIGHT))
        self._do(m.Exit(0))

    def _signal(self, signal: m.Signal) -> None:
        if signal is m.Signal.WAKE:
            return  # what a wake asks for, progress, follows every input
        self.log.warning("worker_stdin_closed")
        self._transition(WorkerInput.CONTROL_LOST)
        self._do(m.Exit(1))  # nobody reads stdout any more: no WorkerFatal

    # ---- rings ----

    def _install_ring(self, cmd: wire.InstallRing) -> None:
        problem = install_problem(cmd, cmd.ring_id in self.rings or cmd.ring_id in self._opening)
        if problem is not None:
            self._refuse_install(cmd, *problem)
            return
        self._opening[cmd.ring_id] = cmd
        self._do(m.OpenRing(cmd))

    def _ring_opened(self, r: m.RingOpened) -> None:
        cmd = self._opening.pop(r.ring_id)
        self.rings.add(cmd, r.end, self.codec, self.sink)
        self._emit(wire.RingInstalled(cmd.ring_id, cmd.edge_id, cmd.port_id))

    def _ring_open_failed(self, r: m.RingOpenFailed) -> None:
        cmd = self._opening.pop(r.ring_id)
        self._emit(wire.RingFault(cmd.ring_id, cmd.edge_id, cmd.port_id, r.reason, r.detail))

    def _uninstall_ring(self, cmd: wire.UninstallRing) -> None:
        step = self.step
        if step is not None and step.binds(cmd.ring_id):
            if len(step.cmd.outputs) - len(step.dropped) > 1:
                self._drop_output(step, cmd.ring_id)
            else:
                self._fail_step(pb.STEP_FAILURE_INVALID_OUTPUT_RING,
                                f"ring {cmd.ring_id} uninstalled ({name(pb.UninstallReason, cmd.reason)})")
        self._uninstall(cmd.ring_id)

    def _drop_output(self, step: Step, ring_id: int) -> None:
        """One run of a batched step left (its ring is being uninstalled): its output is dropped, the other runs'
        outputs go on, and the step completes without it (docs/runs-in-flight.md)."""
        step.dropped.add(ring_id)
        self.rings.abandon_output(ring_id)
        produced = step.outputs.pop(ring_id, None)
        if produced is not None:
            self._do(m.FreeDeviceObject(produced[1]))
        step.done.discard(ring_id)
        if step.finished():
            self._complete_step()

    def _uninstall(self, ring_id: int) -> None:
        if self.grant is not None and ring_id in (self.grant.cmd.ring_id, self.grant.cmd.output.ring_id):
            self._end_grant(f"ring {ring_id} uninstalled")
        end = self.rings.remove(ring_id)
        if end is not None:
            self._do(m.CloseRing(end))
        self._emit(wire.RingQuiesced(ring_id))

    def _progress(self) -> None:
        if self.state not in (WorkerState.RUNNING, WorkerState.DRAINING):
            return
        for cmd, iev in self.rings.pump_ingress():
            self._on_ingress(cmd, iev)
        for rid in list(self.step.outputs if self.step is not None else ()):
            for cmd, eev in self.rings.pump_egress(rid):
                self._on_egress(cmd, eev)
        if self.state is WorkerState.DRAINING and self.step is None and self.roles.loading is None:
            self._finish_draining()

    def _on_ingress(self, c: wire.InstallRing, ev: Any) -> None:
        match ev:
            case Loaded(facts, obj):
                hid, self._next_handle = self._next_handle, self._next_handle + 1
                self.handles[hid] = obj
                handle = wire.DeviceHandle(self.generation, hid)
                granted = self._granted_step(c, facts, handle)
                self._emit(wire.ObjectLoaded(c.ring_id, c.edge_id, c.port_id, facts.object_id, facts.sequence,
                                             facts.extent, handle, facts.flags, granted.step_id if granted else 0,
                                             at_us=wall_us()))
                if granted is not None:
                    self._execute_step(granted)
            case Failed(reason, detail, object_id, sequence):
                self._emit(wire.ObjectFailed(c.ring_id, c.edge_id, c.port_id, object_id, sequence, reason, detail))
            case Broken(reason, detail):
                self._emit(wire.RingFault(c.ring_id, c.edge_id, c.port_id, reason, detail))
            case Closed():
                self.log.info("ingress_closed", ring_id=c.ring_id, edge_id=c.edge_id)

    def _on_egress(self, c: wire.InstallRing, ev: Any) -> None:
        step = self.step
        if step is None:  # an earlier output of the same pump failed the step
            return
        match ev:
            case Produced(facts):
                self._emit(wire.ObjectProduced(c.ring_id, c.edge_id, c.port_id, facts.object_id, facts.sequence,
                                               facts.extent, at_us=wall_us()))
                step.done.add(c.ring_id)
                if step.finished():
                    self._complete_step()
            case Broken(reason, detail):
                self._emit(wire.RingFault(c.ring_id, c.edge_id, c.port_id, reason, detail))
                self._fail_step(pb.STEP_FAILURE_OUTPUT_COPY_FAILED, detail)

    # ---- step grants (docs/worker.md "Step grants") ----

    def _grant_steps(self, cmd: wire.GrantSteps) -> None:
        if self.grant is not None:
            self._emit(wire.GrantEnded(cmd.role_id, cmd.grant_id, cmd.sequence, f"grant {self.grant.cmd.grant_id} stands"))
        elif not self.roles.ready(cmd.role_id):
            self._emit(wire.GrantEnded(cmd.role_id, cmd.grant_id, cmd.sequence, f"role {cmd.role_id} is not configured"))
        elif cmd.ring_id not in self.rings or cmd.output.ring_id not in self.rings:
            self._emit(wire.GrantEnded(cmd.role_id, cmd.grant_id, cmd.sequence,
                                       f"rings {cmd.ring_id} -> {cmd.output.ring_id} are not installed"))
        elif not isinstance(start_pos := cmd.runtime.get("start_pos"), int) or isinstance(start_pos, bool) or start_pos < 0:
            self._emit(wire.GrantEnded(cmd.role_id, cmd.grant_id, cmd.sequence,
                                       f"runtime.start_pos must be a non-negative integer, got {start_pos!r}"))
        else:
            self.grant = Grant(cmd, cmd.sequence, cmd.step_id, start_pos)

    def _end_grant(self, cause: str, grant_id: int | None = None) -> None:
        """End the standing grant (only grant `grant_id`'s, when given: a revoke of one that ended is ignored)."""
        g = self.grant
        if g is not None and grant_id in (None, g.cmd.grant_id):
            self.grant = None
            self._emit(wire.GrantEnded(g.cmd.role_id, g.cmd.grant_id, g.sequence, cause))

    def _granted_step(self, c: wire.InstallRing, facts: Any, handle: wire.DeviceHandle) -> wire.ExecuteStep | None:
        """The step the grant starts on this loaded object, or None; an object on the granted ring that the grant
        cannot take ends it first, so the controller sees GrantEnded before that object's ObjectLoaded."""
        g = self.grant
        if g is None or c.ring_id != g.cmd.ring_id:
            return None
        if not g.covers(facts):
            self._end_grant(f"object {facts.sequence} ({facts.extent} bytes, flags {facts.flags}) is not a granted row")
        elif self.step is not None:
            self._end_grant(f"step {self.step.cmd.step_id} in flight when object {facts.sequence} loaded")
        elif not self.roles.ready(g.cmd.role_id):
            self._end_grant(f"role {g.cmd.role_id} is not configured")
        else:
            return g.next_step(c.port_id, facts, handle)
        return None

    # ---- steps ----

    def _execute_step(self, cmd: wire.ExecuteStep) -> None:
        problem = self._step_problem(cmd)
        if problem is not None:
            self._emit(wire.StepFailed(cmd.role_id, cmd.step_id, *problem))
            return
        self.log.debug("execute_step_started", step_id=cmd.step_id, role_id=cmd.role_id,
                       sequence=[b.sequence for b in cmd.inputs])  # per token: the node's lifecycle events say it
        self.step = Step(cmd)
        inputs = [self.handles[b.device_handle.id] for b in cmd.inputs]
        self._do(m.RunStep(cmd.step_id, self.roles.role, inputs, cmd.runtime))

    def _step_problem(self, cmd: wire.ExecuteStep) -> tuple[int, str] | None:
        """(StepFailure, detail) when the step cannot start (§29 execution requirements)."""
        if self.step is not None:
            return pb.STEP_FAILURE_ROLE_UNAVAILABLE, f"step {self.step.cmd.step_id} is still in flight"
        if not self.roles.ready(cmd.role_id):
            return pb.STEP_FAILURE_ROLE_UNAVAILABLE, f"role {cmd.role_id} is not configured"
        for b in cmd.inputs:
            h = b.device_handle
            if h.worker_generation != self.generation or h.id not in self.handles:
                return pb.STEP_FAILURE_INVALID_INPUT_HANDLE, f"handle {h.id} of generation {h.worker_generation}"
        if len({o.ring_id for o in cmd.outputs}) != len(cmd.outputs):
            return pb.STEP_FAILURE_INVALID_OUTPUT_RING, "two output bindings name the same ring"
        for o in cmd.outputs:
            if not self.rings.idle_egress(o.ring_id):
                return pb.STEP_FAILURE_INVALID_OUTPUT_RING, f"ring {o.ring_id} is not an idle installed egress ring"
        return None

    def _step_ran(self, r: m.StepRan) -> None:
        step = self.step
        if step is None or step.cmd.step_id != r.step_id or step.ran:  # the step ended meanwhile
            for obj in r.outputs:
                self._do(m.FreeDeviceObject(obj))
            return
        step.ran, step.layers_us = True, r.layers_us
        if len(r.outputs) != len(step.cmd.outputs):
            for obj in r.outputs:
                self._do(m.FreeDeviceObject(obj))
            self._fail_step(pb.STEP_FAILURE_OUTPUT_EXTENT_INVALID, f"role produced {len(r.outputs)} outputs, "
                                                   f"{len(step.cmd.outputs)} bound")
            return
        kept = []
        for b, obj in zip(step.cmd.outputs, r.outputs, strict=True):
            if b.ring_id in step.dropped:  # its run left while the role computed: nothing to write it to
                self._do(m.FreeDeviceObject(obj))
            else:
                kept.append((b, obj))
        step.outputs = {b.ring_id: (b, obj) for b, obj in kept}
        for b, obj in kept:
            try:
                self.rings.start_output(b, obj)
            except OutputRejected as e:
                self._fail_step(e.reason, e.detail)
                return
        if not kept:
            self._complete_step()

    def _step_raised(self, r: m.StepRaised) -> None:
        if self.step is not None and self.step.cmd.step_id == r.step_id and not self.step.ran:
            self._fail_step(r.reason, r.detail)

    def _end_step(self) -> Step:
        step = self.step
        assert step is not None
        self.step = None
        for _binding, obj in step.outputs.values():
            self._do(m.FreeDeviceObject(obj))
        return step

    def _complete_step(self) -> None:
        step = self._end_step()
        if step.cmd.release_inputs_after:
            for b in step.cmd.inputs:
                self._release(b.device_handle)
        self._emit(wire.StepCompleted(step.cmd.role_id, step.cmd.step_id, layers_us=step.layers_us))

    def _fail_step(self, reason: int, detail: str) -> None:
        step = self._end_step()
        for rid in step.outputs:
            c = self.rings.abandon_output(rid)
            if c is not None:  # a half-written object cannot be completed: the ring is lost for this edge
                self._emit(wire.RingFault(rid, c.edge_id, c.port_id, pb.RING_FAULT_WORKER_INTERNAL,
                                          f"output abandoned mid-object: {name(pb.StepFailure, reason)}"))
        self._emit(wire.StepFailed(step.cmd.role_id, step.cmd.step_id, reason, detail))

    # ---- device objects ----

    def _release(self, h: wire.DeviceHandle) -> None:
        if h.worker_generation != self.generation:
            self._emit(wire.ReleaseFailed(h, pb.RELEASE_FAILURE_STALE_GENERATION))
        elif self.step is not None and any(b.device_handle == h for b in self.step.cmd.inputs):
            self._emit(wire.ReleaseFailed(h, pb.RELEASE_FAILURE_IN_USE))
        elif h.id not in self.handles:
            self._emit(wire.ReleaseFailed(h, pb.RELEASE_FAILURE_UNKNOWN_HANDLE))
        else:
            self._do(m.FreeDeviceObject(self.handles.pop(h.id)))
            self._emit(wire.DeviceObjectReleased(h))
