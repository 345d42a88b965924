"""GpuWorkerCtl FSM of spec §31, as an I/O-free core.

The core takes inputs (controller commands, worker events, process notifications, timer ticks) with
`now` passed in and returns actions for the asyncio shell in `ctl.py`: spawn/kill the process, write a
command line, deliver an event to subscribers. It owns worker_generation numbering, the table of
installed rings and the live device handles of the current generation, and synthesizes the §30
events a dead worker can no longer send (WorkerCrashed, RingFault, StepFailed, RingQuiesced).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from swactor.common.events import get_logger
from swactor.common.reasons import name
from swactor.v1 import common_pb2 as pb
from swactor.worker.process import wire


class CtlState(enum.Enum):
    NOT_STARTED = "NotStarted"
    SPAWNING = "Spawning"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    STOPPING = "Stopping"
    KILLING = "Killing"
    CRASHED = "Crashed"
    FAILED = "Failed"
    STOPPED = "Stopped"


# ---- inputs ----


@dataclass(frozen=True)
class Start:
    """Spawn a new worker generation (from NotStarted, Failed or Stopped)."""


# What a process says or suffers is tagged with the generation it was spawned for: a killed process's
# last lines and its exit, or a spawn that finishes after its generation gave up, arrive while a newer
# generation is Spawning or Initializing, and must not be taken for the newer one's.


@dataclass(frozen=True)
class Spawned:
    worker_generation: int
    pid: int


@dataclass(frozen=True)
class SpawnFailed:
    worker_generation: int
    detail: str


@dataclass(frozen=True)
class FromWorker:
    worker_generation: int
    event: wire.Event


@dataclass(frozen=True)
class StdoutMalformed:
    """The worker wrote a line that is not a known event: a worker/process fault (§28)."""

    worker_generation: int
    detail: str


@dataclass(frozen=True)
class ProcessExited:
    worker_generation: int
    returncode: int


@dataclass(frozen=True)
class Tick:
    """The deadline may have passed."""


@dataclass(frozen=True)
class Send:
    command: wire.Command


Input = Start | Spawned | SpawnFailed | FromWorker | StdoutMalformed | ProcessExited | Tick | Send

# ---- actions ----


@dataclass(frozen=True)
class SpawnProcess:
    worker_generation: int


@dataclass(frozen=True)
class WriteCommand:
    command: wire.Command


@dataclass(frozen=True)
class KillProcess:
    worker_generation: int


@dataclass(frozen=True)
class Deliver:
    """An event for the ctl's subscribers (worker events and synthesized ones)."""

    event: Any


@dataclass(frozen=True)
class WorkerCrashed:
    """Synthesized (§30): the worker process exited, errored or broke its stdout contract."""

    worker_generation: int
    returncode: int | None
    detail: str


@dataclass(frozen=True)
class WorkerFailed:
    """The worker never became ready: `cause` says how; `fatal` is the WorkerFatalReason when the
    worker said WorkerFatal (UNSPECIFIED otherwise)."""

    worker_generation: int
    cause: NeverReady
    detail: str
    fatal: int = pb.WORKER_FATAL_REASON_UNSPECIFIED


class NeverReady(enum.Enum):
    """How a worker generation failed before WorkerReady (the ctl's own causes, not §37 reasons)."""

    SPAWN_FAILED = "SpawnFailed"
    INITIALIZE_TIMEOUT = "InitializeTimeout"
    PROCESS_EXITED = "ProcessExited"
    WORKER_FATAL = "WorkerFatal"


Action = SpawnProcess | WriteCommand | KillProcess | Deliver


@dataclass
class InstalledRing:
    edge_id: int
    port_id: int
    direction: str
    acked: bool = False


@dataclass
class CtlCore:
    """§31 GpuWorkerCtl: NotStarted -> Spawning -> Initializing -> Running -> Stopping -> Stopped."""

    arena_ceiling: int
    ring_helper_abi: int
    backend: dict[str, Any] = field(default_factory=dict)
    init_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    state: CtlState = CtlState.NOT_STARTED
    worker_generation: int = 0
    pid: int | None = None
    rings: dict[int, InstalledRing] = field(default_factory=dict)
    handles: set[int] = field(default_factory=set)
    step_in_flight: tuple[int, int] | None = None  # (role_id, step_id)
    grant: tuple[int, int] | None = None  # (role_id, grant_id) of the GrantSteps that stands: its steps start there
    deadline: float | None = None
    shutdown_mode: str = "Graceful"
    # Rings sent UninstallRing and not yet RingQuiesced. A process that does not quiesce them within
    # stop_timeout_s (frozen, wedged) is killed: a SIGKILLed process never runs user code again, so
    # it can write no ring byte and the kill is the quiescence proof (else the stage waits forever
    # and its rings stay leased).
    quiescing: set[int] = field(default_factory=set)

    def _transition(self, new: CtlState, **facts: Any) -> None:
        old, self.state = self.state, new
        get_logger(worker_generation=self.worker_generation).info(
            "worker_ctl_state", old=old.value, new=new.value, **facts)

    # ---- the one entry point ----

    def handle(self, inp: Input, now: float) -> list[Action]:
        match inp:
            case Spawned(gen, _) if gen != self.worker_generation:
                return [KillProcess(gen)]  # its generation gave up (or was replaced) while it was spawning
            case Spawned() | SpawnFailed() | FromWorker() | StdoutMalformed() | ProcessExited() \
                    if inp.worker_generation != self.worker_generation:
                return []  # an earlier generation's process: already given up for
            case Start():
                return self._start(now)
            case Spawned(_, pid):
                return self._spawned(pid, now)
            case SpawnFailed(_, detail):
                return self._never_ready(NeverReady.SPAWN_FAILED, detail)
            case FromWorker(_, event):
                return self._from_worker(event)
            case StdoutMalformed(_, detail):
                return self._process_broken(f"malformed worker event: {detail}", kill=True)
            case ProcessExited(_, rc):
                return self._exited(rc)
            case Tick():
                return self._tick(now)
            case Send(command):
                return self._send(command, now)
        raise TypeError(f"unknown ctl input {inp!r}")  # pragma: no cover

    # ---- lifecycle ----

    def _start(self, now: float) -> list[Action]:
        if self.state not in (CtlState.NOT_STARTED, CtlState.FAILED, CtlState.STOPPED):
            return []
        self.worker_generation += 1  # Restarting: a new generation invalidates all old handles
        self.rings.clear()
        self.handles.clear()
        self.quiescing.clear()
        self.step_in_flight = None
        self.grant = None
        self.deadline = now + self.init_timeout_s
        self._transition(CtlState.SPAWNING)
        return [SpawnProcess(self.worker_generation)]

    def _spawned(self, pid: int, now: float) -> list[Action]:
        if self.state is not CtlState.SPAWNING:  # given up (init timeout, shutdown) before the spawn returned
            return [KillProcess(self.worker_generation)]
        self.pid = pid
        self.deadline = now + self.init_timeout_s
        self._transition(CtlState.INITIALIZING, pid=pid)
        return [WriteCommand(wire.InitializeWorker(self.worker_generation, self.arena_ceiling,
                                                   self.ring_helper_abi, self.backend))]

    def _never_ready(self, cause: NeverReady, detail: str, *, kill: bool = False,
                     fatal: int = pb.WORKER_FATAL_REASON_UNSPECIFIED) -> list[Action]:
        self.deadline = None
        self._transition(CtlState.FAILED, reason=cause.value, fatal=name(pb.WorkerFatalReason, fatal))
        actions: list[Action] = [KillProcess(self.worker_generation)] if kill else []
        return [*actions, Deliver(WorkerFailed(self.worker_generation, cause, detail, fatal))]

    def _tick(self, now: float) -> list[Action]:
        if self.deadline is None or now < self.deadline:
            return []
        if self.state in (CtlState.SPAWNING, CtlState.INITIALIZING):
            return self._never_ready(NeverReady.INITIALIZE_TIMEOUT, f"no WorkerReady within {self.init_timeout_s}s", kill=True)
        if self.state is CtlState.STOPPING:
            self.deadline = None
            self._transition(CtlState.KILLING, reason="StopTimeout")
            return [KillProcess(self.worker_generation)]
        if self.state is CtlState.RUNNING and self.quiescing:
            rings, self.quiescing = sorted(self.quiescing), set()
            self.deadline = None
            actions = self._process_broken(f"ring(s) {rings} not quiesced within {self.stop_timeout_s}s", kill=True)
            for rid in rings:
                self.rings.pop(rid, None)
            return actions + [Deliver(wire.RingQuiesced(rid)) for rid in rings]
        return []

    def _exited(self, rc: int) -> list[Action]:
        self.pid = None
        if self.state in (CtlState.SPAWNING, CtlState.INITIALIZING):
            return self._never_ready(NeverReady.PROCESS_EXITED, f"worker exited with {rc} before WorkerReady")
        if self.state is CtlState.RUNNING:
            return self._process_broken(f"worker exited with {rc}", returncode=rc)
        if self.state in (CtlState.STOPPING, CtlState.KILLING):
            self.deadline = None
            actions = self._synthesize_ring_ends(pb.STEP_FAILURE_WORKER_SHUTTING_DOWN, pb.RING_FAULT_WORKER_SHUTTING_DOWN)
            self._transition(CtlState.STOPPED, returncode=rc)
            return actions
        return []

    def _process_broken(self, detail: str, *, returncode: int | None = None, kill: bool = False) -> list[Action]:
        """Crashed (§31): invalidate handles, fault installed rings and the in-flight step."""
        if self.state not in (CtlState.RUNNING, CtlState.INITIALIZING, CtlState.STOPPING):
            return []
        if self.state is CtlState.INITIALIZING:
            return self._never_ready(NeverReady.PROCESS_EXITED, detail, kill=kill)
        self._transition(CtlState.CRASHED, detail=detail)
        actions: list[Action] = [KillProcess(self.worker_generation)] if kill else []
        actions.append(Deliver(WorkerCrashed(self.worker_generation, returncode, detail)))
        actions += self._synthesize_ring_ends(pb.STEP_FAILURE_WORKER_PROCESS_EXITED, pb.RING_FAULT_WORKER_PROCESS_EXITED)
        self.handles.clear()
        self._transition(CtlState.FAILED)
        return actions

    def _synthesize_ring_ends(self, step_reason: int, ring_reason: int) -> list[Action]:
        actions: list[Action] = []
        self.grant = None  # it went with the process; the node's scheduler forgets it with the step
        if self.step_in_flight is not None:
            role_id, step_id = self.step_in_flight
            self.step_in_flight = None
            actions.append(Deliver(wire.StepFailed(role_id, step_id, step_reason, "worker process gone")))
        for ring_id, ring in sorted(self.rings.items()):
            actions.append(Deliver(wire.RingFault(ring_id, ring.edge_id, ring.port_id, ring_reason,
                                                  "worker process gone")))
        # The rings stay in the table until UninstallRing: the reaped process is the quiescence proof.
        return actions

    # ---- worker events ----

    def _from_worker(self, ev: wire.Event) -> list[Action]:
        if self.state is CtlState.INITIALIZING:
            match ev:
                case wire.WorkerReady(worker_generation=gen) if gen == self.worker_generation:
                    self.deadline = None
                    self._transition(CtlState.RUNNING, pid=ev.pid)
                    return [Deliver(ev)]
                case wire.WorkerFatal(reason, detail):
                    return self._never_ready(NeverReady.WORKER_FATAL, detail, kill=True, fatal=reason)
                case _:
                    return self._process_broken(f"unexpected {type(ev).__name__} before WorkerReady", kill=True)
        if self.state not in (CtlState.RUNNING, CtlState.STOPPING):
            return []  # stale event of a dead generation
        match ev:
            case wire.WorkerFatal(reason, detail):
                return self._process_broken(f"WorkerFatal {name(pb.WorkerFatalReason, reason)}: {detail}", kill=True)
            case wire.WorkerStopped():
                return [Deliver(ev)]
            case wire.RingInstalled(ring_id=rid) if rid in self.rings:
                self.rings[rid].acked = True
            case wire.RingQuiesced(ring_id=rid):
                self.rings.pop(rid, None)
                self.quiescing.discard(rid)
                if not self.quiescing and self.state is CtlState.RUNNING:
                    self.deadline = None
            case wire.ObjectLoaded(device_handle=h, granted_step=granted):
                self.handles.add(h.id)
                if granted and self.grant is not None:
                    self.step_in_flight = (self.grant[0], granted)
            case wire.GrantEnded(grant_id=gid) if self.grant is not None and self.grant[1] == gid:
                self.grant = None
            case wire.DeviceObjectReleased(device_handle=h):
                self.handles.discard(h.id)
            case wire.StepCompleted() | wire.StepFailed():
                self.step_in_flight = None
        return [Deliver(ev)]

    # ---- commands from controllers ----

    def _reject(self, cmd: wire.Command, reason_step: int, reason_ring: int, detail: str) -> list[Action]:
        match cmd:
            case wire.ExecuteStep(role_id=role_id, step_id=step_id):
                return [Deliver(wire.StepFailed(role_id, step_id, reason_step, detail))]
            case wire.InstallRing(ring_id=rid, edge_id=eid, port_id=pid):
                return [Deliver(wire.RingFault(rid, eid, pid, reason_ring, detail))]
            case wire.UninstallRing(ring_id=rid):
                # No live process holds the ring: the reaped (or never started) worker is the proof.
                self.rings.pop(rid, None)
                return [Deliver(wire.RingQuiesced(rid))]
            case wire.ConfigureRole(role_id=role_id):
                return [Deliver(wire.RoleFailed(role_id, pb.ROLE_FAILURE_WORKER_UNAVAILABLE, detail))]
            case wire.GrantSteps(role_id=role_id, grant_id=gid, sequence=seq):
                return [Deliver(wire.GrantEnded(role_id, gid, seq, detail))]
        return []

    def _send(self, cmd: wire.Command, now: float) -> list[Action]:
        if self.state is not CtlState.RUNNING:
            if isinstance(cmd, wire.ShutdownWorker) and self.state in (CtlState.SPAWNING, CtlState.INITIALIZING):
                self._transition(CtlState.KILLING, reason="ShutdownBeforeReady")
                return [KillProcess(self.worker_generation)]
            if self.state in (CtlState.STOPPING, CtlState.KILLING):
                step, ring = pb.STEP_FAILURE_WORKER_SHUTTING_DOWN, pb.RING_FAULT_WORKER_SHUTTING_DOWN
            else:
                step, ring = pb.STEP_FAILURE_WORKER_PROCESS_EXITED, pb.RING_FAULT_WORKER_PROCESS_EXITED
            return self._reject(cmd, step, ring, f"worker ctl is {self.state.value}")
        match cmd:
            case wire.InstallRing(ring_id=rid, edge_id=eid, port_id=pid, direction=d):
                if rid in self.rings:
                    return self._reject(cmd, pb.STEP_FAILURE_UNSPECIFIED, pb.RING_FAULT_RING_STATE_INVALID,
                                        f"ring {rid} is already installed")
                self.rings[rid] = InstalledRing(eid, pid, d)
            case wire.UninstallRing(ring_id=rid) if rid not in self.rings:
                return [Deliver(wire.RingQuiesced(rid))]  # never installed here: nothing to quiesce
            case wire.UninstallRing(ring_id=rid):
                self.quiescing.add(rid)
                self.deadline = self.deadline if self.deadline is not None else now + self.stop_timeout_s
            case wire.ExecuteStep(role_id=role_id, step_id=step_id, inputs=inputs):
                if self.step_in_flight is not None:
                    return self._reject(cmd, pb.STEP_FAILURE_ROLE_UNAVAILABLE, pb.RING_FAULT_REASON_UNSPECIFIED,
                                        "a step is already in flight (§14)")
                for b in inputs:
                    if b.device_handle.worker_generation != self.worker_generation or \
                            b.device_handle.id not in self.handles:
                        return self._reject(cmd, pb.STEP_FAILURE_INVALID_INPUT_HANDLE, pb.RING_FAULT_REASON_UNSPECIFIED,
                                            f"handle {b.device_handle} is not live in generation "
                                            f"{self.worker_generation}")
                self.step_in_flight = (role_id, step_id)
            case wire.GrantSteps(role_id=role_id, grant_id=gid, sequence=seq):
                if self.grant is not None:
                    return [Deliver(wire.GrantEnded(role_id, gid, seq, f"grant {self.grant[1]} stands"))]
                self.grant = (role_id, gid)
            case wire.ReleaseDeviceObject(device_handle=h) if h.worker_generation != self.worker_generation:
                return [Deliver(wire.ReleaseFailed(h, pb.RELEASE_FAILURE_STALE_GENERATION))]
            case wire.ShutdownWorker(mode=mode):
                self.shutdown_mode = mode
                self.deadline = now + self.stop_timeout_s
                self._transition(CtlState.STOPPING, mode=mode)
        return [WriteCommand(cmd)]
