"""What the compute-process core takes besides wire commands, and the actions it returns (§28-33).

The core (`core.WorkerCore`) never touches an fd, a pipe, a thread or the device: what needs one is
an action the shell (`shell.py`) performs, and its outcome comes back as one of the inputs below.
Ring ends, device objects, roles and the ingress sink are opaque to the core; it only moves them
between its tables and the actions (and lets the §32 ring-object FSMs pump ring ends through their
narrow interfaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swactor.edgeend.objects import HeaderCodec, ObjectSink
from swactor.worker.process import wire

# ---- inputs (besides wire.Command) ----


@dataclass(frozen=True)
class Malformed:
    """A stdin line that is not a known command (WorkerFatal MalformedControlMessage)."""

    detail: str


@dataclass(frozen=True)
class ControlClosed:
    """stdin reached its end: the ctl is gone."""


@dataclass(frozen=True)
class Wake:
    """An armed ring eventfd fired (already acked), or a ring end said progress is possible now."""


@dataclass(frozen=True)
class RingHelperOpened:
    """The native ring helper is loaded: its ABI, and the §17 ObjectHeader codec over it."""

    ring_abi: int
    codec: HeaderCodec


@dataclass(frozen=True)
class BackendReady:
    """OpenBackend succeeded: the arena is mapped and the device is up."""

    pid: int
    device: str  # tinygrad's canonical name
    sink: ObjectSink  # lands ingress objects in device memory


@dataclass(frozen=True)
class HostFailed:
    """The shell could not do what an action asked, and the process cannot go on."""

    reason: int  # WorkerFatalReason
    detail: str


@dataclass(frozen=True)
class RingOpened:
    ring_id: int
    end: Any  # ringport.ConsumerEnd (Ingress) | ringport.ProducerEnd (Egress)


@dataclass(frozen=True)
class RingOpenFailed:
    ring_id: int
    reason: int  # RingFaultReason
    detail: str


@dataclass(frozen=True)
class LoadProgress:
    role_id: int
    done: int
    total: int


@dataclass(frozen=True)
class LoadDone:
    role_id: int
    role: Any  # roles.Role


@dataclass(frozen=True)
class LoadFailed:
    """The load failed."""

    role_id: int
    reason: int  # RoleFailure
    detail: str


@dataclass(frozen=True)
class RoleReset:
    """ResetRole's outcome: the resident role starts a new run, or (reason: a RoleFailure) it refused
    the new config and stays resident, unconfigured."""

    role_id: int
    reason: int | None = None  # RoleFailure
    detail: str = ""


@dataclass(frozen=True)
class StepRan:
    step_id: int
    outputs: list[Any]  # device objects (ObjectSource: extent, read_into)


@dataclass(frozen=True)
class StepRaised:
    step_id: int
    reason: int  # StepFailure (failures.STEP_FAILURES)
    detail: str


LoadEvent = LoadProgress | LoadDone | LoadFailed
Input = (
    wire.Command | Malformed | ControlClosed | Wake | RingHelperOpened | BackendReady | HostFailed | RingOpened | RingOpenFailed
    | LoadProgress | LoadDone | LoadFailed | RoleReset | StepRan | StepRaised
)

# ---- actions ----


@dataclass(frozen=True)
class Emit:
    """Write this event on stdout."""

    event: wire.Event


@dataclass(frozen=True)
class OpenRingHelper:
    """Import the native ring helper -> RingHelperOpened."""


@dataclass(frozen=True)
class OpenBackend:
    """Map the arena, open the tinygrad device -> BackendReady | HostFailed."""

    device: str | None


@dataclass(frozen=True)
class OpenRing:
    """Take the ring's eventfds from the fd socket when announced, open its end -> RingOpened |
    RingOpenFailed | HostFailed."""

    cmd: wire.InstallRing


@dataclass(frozen=True)
class ShareFds:
    """Take the eventfds ShareWakeFds announced off the fd socket; reopen `end` on them (None: the ring
    is not installed, the fds are just closed) -> nothing | HostFailed."""

    ring_id: int
    end: Any


@dataclass(frozen=True)
class CloseRing:
    """Release a ring end: it never touches ring memory again."""

    end: Any


@dataclass(frozen=True)
class StartLoad:
    """Load a role for `config` on a loader thread -> LoadProgress*, then LoadDone | LoadFailed."""

    role_id: int
    config: dict[str, Any]
    threads: int | None


@dataclass(frozen=True)
class CancelLoad:
    """Ask the load of `role_id` to stop at its next layer (its outcome still arrives)."""

    role_id: int


@dataclass(frozen=True)
class ResetRole:
    """Reset the resident role's per-run state for `config` -> RoleReset | LoadFailed."""

    role_id: int
    role: Any
    config: dict[str, Any]


@dataclass(frozen=True)
class RunStep:
    """Run role code on the inputs -> StepRan | StepRaised."""

    step_id: int
    role: Any
    inputs: list[Any]
    runtime: dict[str, Any]


@dataclass(frozen=True)
class FreeDeviceObject:
    obj: Any


@dataclass(frozen=True)
class Exit:
    code: int


Action = (Emit | OpenRingHelper | OpenBackend | OpenRing | ShareFds | CloseRing | StartLoad | CancelLoad | ResetRole | RunStep
          | FreeDeviceObject | Exit)
