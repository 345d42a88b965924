"""What the compute-process core takes besides wire commands, and the actions it returns (§28-33).

The core (`core.WorkerCore`) never touches an fd, a pipe, a thread or the device: what needs one is
an action the shell (`shell.py`) performs, and its outcome comes back as one of the inputs below.
Ring ends, device objects, roles and the ingress sink are opaque to the core; it only moves them
between its tables and the actions (and lets the §32 ring-object FSMs pump ring ends through their
narrow interfaces).

Messages about one ring, one role or one step list that identity first, and a failure ends with its
reason and detail (swactor.common.msgbase, as in `wire`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from swactor.common.msgbase import Failure, OfRing, OfRole
from swactor.edgeend.objects import HeaderCodec, ObjectSink
from swactor.worker.process import wire


@dataclass(frozen=True)
class _Step:
    step_id: int


# ---- inputs (besides wire.Command) ----


@dataclass(frozen=True)
class Malformed:
    """A stdin line that is not a known command (WorkerFatal MalformedControlMessage)."""

    detail: str


class Signal(enum.Enum):
    """Inputs that carry nothing but their kind."""

    WAKE = "wake"  # an armed ring eventfd fired (already acked), or an end said progress is possible now
    CONTROL_CLOSED = "control_closed"  # stdin reached its end: the ctl is gone


@dataclass(frozen=True)
class RingHelperOpened:
    """The native ring helper is loaded: its ABI, and the §17 ObjectHeader codec over it."""

    ring_abi: int
    codec: HeaderCodec


@dataclass(frozen=True)
class BackendReady:
    """OpenBackend succeeded: the arena is mapped, the device (tinygrad's canonical name) is up, and
    `sink` lands ingress objects in its memory."""

    pid: int
    device: str
    sink: ObjectSink


@dataclass(frozen=True)
class HostFailed(Failure):
    """The shell could not do what an action asked and the process cannot go on: a WorkerFatalReason."""


@dataclass(frozen=True)
class RingOpened(OfRing):
    end: Any  # ringport.ConsumerEnd (Ingress) | ringport.ProducerEnd (Egress)


@dataclass(frozen=True)
class RingOpenFailed(Failure, OfRing):
    """The ring end could not be opened: a RingFaultReason."""


@dataclass(frozen=True)
class LoadProgress(OfRole):
    done: int
    total: int
    phase: str = "weights"  # "weights": layers read; "compile": graph calls of StageModel.prepare


@dataclass(frozen=True)
class LoadDone(OfRole):
    role: Any  # roles.Role


@dataclass(frozen=True)
class LoadFailed(Failure, OfRole):
    """The load failed (or was cancelled): a RoleFailure."""


@dataclass(frozen=True)
class RoleReset(OfRole):
    """ResetRole's outcome: the resident role starts a new run, or (reason: a RoleFailure) it refused
    the new config and stays resident, unconfigured."""

    reason: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class StepRan(_Step):
    outputs: list[Any]  # device objects (ObjectSource: extent, read_into)
    layers_us: int = 0  # the step's time in the model's blocks, where the role says (roles.layers_seconds); 0: not


@dataclass(frozen=True)
class StepRaised(Failure, _Step):
    """Role code raised: a StepFailure (failures.STEP_FAILURES)."""


LoadEvent = LoadProgress | LoadDone | LoadFailed
Input = (
    wire.Command | Signal | Malformed | RingHelperOpened | BackendReady | HostFailed | RingOpened
    | RingOpenFailed | LoadProgress | LoadDone | LoadFailed | RoleReset | StepRan | StepRaised
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
    """Map the arena, open the tinygrad device (None: its default) with at most `memory_limit` bytes of
    allocations (0: the device's own limit) -> BackendReady | HostFailed."""

    device: str | None
    memory_limit: int = 0


@dataclass(frozen=True)
class OpenRing:
    """Take the ring's eventfds off the fd socket when announced, open its end -> RingOpened |
    RingOpenFailed | HostFailed."""

    cmd: wire.InstallRing


@dataclass(frozen=True)
class ShareFds(OfRing):
    """Take the eventfds ShareWakeFds announced off the fd socket and reopen `end` on them (None: the
    ring is not installed, the fds are just closed) -> nothing | HostFailed."""

    end: Any


@dataclass(frozen=True)
class CloseRing:
    """Release a ring end: it never touches ring memory again."""

    end: Any


@dataclass(frozen=True)
class StartLoad(OfRole):
    """Load a role on a loader thread -> LoadProgress*, then LoadDone | LoadFailed. threads: CPU cores
    of the compute kernels (None: auto); graph_cache: the compiled-graph cache directory ("" = none)."""

    config: dict[str, Any]
    threads: int | None
    graph_cache: str = ""


@dataclass(frozen=True)
class CancelLoad(OfRole):
    """Ask the load to stop at its next layer (its outcome still arrives)."""


@dataclass(frozen=True)
class ResetRole(OfRole):
    """Reset the resident role's per-run state for `config` -> RoleReset."""

    role: Any
    config: dict[str, Any]


@dataclass(frozen=True)
class RunStep(_Step):
    """Run role code on the inputs -> StepRan | StepRaised."""

    role: Any
    inputs: list[Any]
    runtime: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FreeDeviceObject:
    obj: Any


@dataclass(frozen=True)
class Exit:
    code: int


Action = (Emit | OpenRingHelper | OpenBackend | OpenRing | ShareFds | CloseRing | StartLoad | CancelLoad | ResetRole
          | RunStep | FreeDeviceObject | Exit)
