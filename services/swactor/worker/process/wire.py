"""The process adapter of spec §28-30: its commands (stdin) and events (stdout), and their JSON form, one per line.

(framing.py carries the step's hot messages as binary frames instead; every message keeps this JSON form.)

Every message is `{"type": "<Name>", ...fields}`; fields are exactly the dataclass fields below,
a reason field holds a common.proto enum value (swactor.common.reasons) and is carried as the value's
name, e.g. `"reason": "RING_FAULT_HEADER_MALFORMED"`. Decoding is strict: a missing, unknown or
wrongly typed field, or a reason name its enum does not have, is a `MalformedMessage` naming it. Payload bytes never appear here; device
objects travel only as opaque `DeviceHandle`s.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, TypeVar

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from swactor.common.layout import Layout
from swactor.common.msgbase import OfRing, OfRole
from swactor.edgeend.objects import ObjSpec
from swactor.v1 import common_pb2 as pb

T = TypeVar("T")

# Reason fields: the enum's int value in Python, its value name on the wire.
UninstallReason = Annotated[int, pb.UninstallReason]
WorkerFatalReason = Annotated[int, pb.WorkerFatalReason]
WorkerStoppedReason = Annotated[int, pb.WorkerStoppedReason]
RoleFailure = Annotated[int, pb.RoleFailure]
RingFaultReason = Annotated[int, pb.RingFaultReason]
ObjectFailure = Annotated[int, pb.ObjectFailure]
StepFailure = Annotated[int, pb.StepFailure]
ReleaseFailure = Annotated[int, pb.ReleaseFailure]


class MalformedMessage(ValueError):
    """A line that is not valid JSON or does not have a known message shape."""


# ---- shared shapes ----


@dataclass(frozen=True)
class DeviceHandle:
    """§6: valid only in the worker generation that created it."""

    worker_generation: int
    id: int


@dataclass(frozen=True)
class InputBinding:
    port_id: int
    object_id: int
    sequence: int
    device_handle: DeviceHandle


@dataclass(frozen=True)
class OutputBinding:
    port_id: int
    ring_id: int
    object_id: int
    sequence: int
    extent: int
    flags: int = 0


# The identities messages about one ring or role (swactor.common.msgbase), one installed ring end, one
# object on it, or one step share: each message lists them first, so its positional order is the base's
# fields, then its own; a failure ends with its reason (typed with its enum for the codec) and detail.
# (The bases are never sent or matched themselves.)


@dataclass(frozen=True)
class _RingEnd(OfRing):
    edge_id: int
    port_id: int


@dataclass(frozen=True)
class _RingObject(_RingEnd):
    object_id: int
    sequence: int
    extent: int


@dataclass(frozen=True)
class _Step:
    role_id: int
    step_id: int


@dataclass(frozen=True)
class _Grant(OfRole):
    grant_id: int


# ---- commands (§29) ----


@dataclass(frozen=True)
class InitializeWorker:
    worker_generation: int
    arena_ceiling: int
    required_ring_helper_abi: int
    backend: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigureRole(OfRole):
    config: dict[str, Any]


@dataclass(frozen=True)
class CancelRole(OfRole):
    """Abandon the ConfigureRole load of `role_id` if it is still loading (StopRun during Preparing).

    Adapter extension (§15 "stop or reset worker role state according to local policy"): the load
    ends at its next layer and answers RoleFailed(role_id, LoadCancelled). A role that is already
    configured stays resident (warm for the next run); an unknown role_id is ignored."""


@dataclass(frozen=True)
class InstallRing(_RingEnd):
    direction: str  # Ingress | Egress
    layout: Layout
    object_spec: ObjSpec
    # True: the ring's two eventfds (readable, writable) were sent just before this line on the
    # SWACTOR_FD_SOCKET side channel (SCM_RIGHTS, payload = ring_id as u64 LE), so wake hints are
    # shared with the ring's other end. False: the worker makes private eventfds (see loop.py).
    wake_fds: bool = False


@dataclass(frozen=True)
class UninstallRing(OfRing):
    reason: UninstallReason


@dataclass(frozen=True)
class ShareWakeFds(OfRing):
    """Re-open an installed ring's handle with the eventfds sent just before on the fd socket
    (the edge-driver makes a pump's eventfds only once the edge is established, after InstallRing)."""


@dataclass(frozen=True)
class RingReadable(OfRing):
    """A hint: committed bytes may be waiting (also an event the worker may send)."""


@dataclass(frozen=True)
class RingWritable(OfRing):
    """A hint: free space may be waiting (also an event the worker may send)."""


@dataclass(frozen=True)
class ExecuteStep(_Step):
    inputs: list[InputBinding]
    outputs: list[OutputBinding]
    runtime: dict[str, Any] = field(default_factory=dict)
    release_inputs_after: bool = True


@dataclass(frozen=True)
class GrantSteps(_Step):
    """A standing grant of decode steps (adapter extension; docs/worker.md "Step grants"): the stage controller
    authorises, ahead of time, the steps of the run's next one-row objects on ingress ring `ring_id`, so a decode
    step starts as its input loads instead of one round trip later.

    Each granted step is the ExecuteStep the controller would have sent: the input is the object of sequence
    `sequence` (then +1 each), loaded with extent `row_bytes` and without PROMPT_CONTINUES; its step id is `step_id`
    (then +1 each); it writes `output` with the input's object id, sequence and flags; `runtime` is the first
    step's, whose start_pos advances by one per step; its input is released after it. The worker says which
    step it started in that object's ObjectLoaded (`granted_step`). Any other object on the ring, a step still in
    flight when one loads, the ring or role going, or RevokeGrant ends the grant: GrantEnded, then the object is
    the controller's as before. One grant at a time."""

    grant_id: int
    ring_id: int
    sequence: int
    row_bytes: int
    output: OutputBinding
    runtime: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RevokeGrant(_Grant):
    """End the grant `grant_id` if it still stands (GrantEnded answers; a grant already ended is ignored)."""


@dataclass(frozen=True)
class ReleaseDeviceObject:
    device_handle: DeviceHandle


@dataclass(frozen=True)
class ShutdownWorker:
    mode: str = "Graceful"  # Graceful | AbortInFlight


Command = (
    InitializeWorker
    | ConfigureRole
    | CancelRole
    | InstallRing
    | UninstallRing
    | ShareWakeFds
    | RingReadable
    | RingWritable
    | ExecuteStep
    | GrantSteps
    | RevokeGrant
    | ReleaseDeviceObject
    | ShutdownWorker
)

# ---- events (§30) ----


@dataclass(frozen=True)
class WorkerReady:
    pid: int
    worker_generation: int
    ring_helper_abi: int
    backend: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerFatal:
    reason: WorkerFatalReason
    detail: str = ""


@dataclass(frozen=True)
class WorkerStopped:
    reason: WorkerStoppedReason


@dataclass(frozen=True)
class RoleProgress(OfRole):
    """Load progress of ConfigureRole: phase "weights" counts layers read (§40 weights_load_progress), then phase
    "compile" counts graph calls while the role compiles its decode / prefill graphs (done/total; total 0: every
    graph came from the compiled-graph cache)."""

    layers_loaded: int
    layers_total: int
    phase: str = "weights"


@dataclass(frozen=True)
class RoleConfigured(OfRole):
    warm: bool = False  # weights were already resident; only role state was reset


@dataclass(frozen=True)
class RoleFailed(OfRole):
    reason: RoleFailure
    detail: str = ""


@dataclass(frozen=True)
class RingInstalled(_RingEnd):
    """The ring is open in the worker; its parser / producer runs."""


@dataclass(frozen=True)
class RingFault(_RingEnd):
    reason: RingFaultReason
    detail: str = ""


@dataclass(frozen=True)
class RingQuiesced(OfRing):
    """The worker no longer touches the ring (UninstallRing done)."""


@dataclass(frozen=True)
class ObjectLoaded(_RingObject):
    device_handle: DeviceHandle
    flags: int = 0  # the object header's flags (swactor.common.objflags): the StageController passes them on
    granted_step: int = 0  # the step a GrantSteps started on it (0: none, the controller decides)
    # When this process took it from the ring (wall clock, µs): its OBJECT_LOADED event's time. The controller reads
    # this line later, after a granted step may already have produced the output, so its own clock would be late.
    at_us: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ObjectProduced(_RingObject):
    """The object's last byte is committed to the egress ring."""

    at_us: int = field(default=0, compare=False)  # when (wall clock, µs): its OBJECT_PRODUCED event's time


@dataclass(frozen=True)
class ObjectFailed(_RingEnd):
    object_id: int | None  # None: the header never parsed
    sequence: int | None
    reason: ObjectFailure
    detail: str = ""


@dataclass(frozen=True)
class StepCompleted(_Step):
    """Every output of the step is produced. layers_us (adapter extension; 0 = not said): the time the step spent in
    the model's blocks, said for one run's one-row step (the host's speed: worker/step_speed.py)."""

    layers_us: int = field(default=0, compare=False)


@dataclass(frozen=True)
class StepFailed(_Step):
    reason: StepFailure
    detail: str = ""


@dataclass(frozen=True)
class GrantEnded(_Grant):
    """The grant stands no more: `sequence` is the first object it did not take (the controller's again)."""

    sequence: int
    cause: str = ""  # why, for the log: revoked, an object it does not cover, the ring or role gone


@dataclass(frozen=True)
class DeviceObjectReleased:
    device_handle: DeviceHandle


@dataclass(frozen=True)
class ReleaseFailed:
    device_handle: DeviceHandle
    reason: ReleaseFailure


Event = (
    WorkerReady
    | WorkerFatal
    | WorkerStopped
    | RoleProgress
    | RoleConfigured
    | RoleFailed
    | RingInstalled
    | RingFault
    | RingQuiesced
    | ObjectLoaded
    | ObjectProduced
    | ObjectFailed
    | StepCompleted
    | StepFailed
    | GrantEnded
    | DeviceObjectReleased
    | ReleaseFailed
    | RingReadable
    | RingWritable
)

COMMANDS: dict[str, type] = {c.__name__: c for c in typing.get_args(Command)}
EVENTS: dict[str, type] = {c.__name__: c for c in typing.get_args(Event)}


# ---- codec ----


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _enum_of(hint: Any) -> EnumTypeWrapper | None:
    if typing.get_origin(hint) is Annotated:
        return next((m for m in typing.get_args(hint)[1:] if isinstance(m, EnumTypeWrapper)), None)
    return None


def _encode_value(hint: Any, value: Any) -> Any:
    enum = _enum_of(hint)
    if enum is not None:
        return enum.Name(value)
    if dataclasses.is_dataclass(value):
        return {f.name: _encode_value(_hints(type(value))[f.name], getattr(value, f.name))
                for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_encode_value(typing.get_args(hint)[0], v) for v in value]
    return value


def encode(message: Any) -> str:
    """One line (no newline) for a command or event dataclass."""
    return json.dumps({"type": type(message).__name__, **_encode_value(type(message), message)}, separators=(",", ":"))


def _decode_value(path: str, hint: Any, value: Any) -> Any:
    enum = _enum_of(hint)
    if enum is not None:
        values = enum.DESCRIPTOR.values_by_name
        if not isinstance(value, str) or value not in values or values[value].number == 0:
            known = ", ".join(n for n, v in values.items() if v.number)
            raise MalformedMessage(f"{path}: {value!r} is not a {enum.DESCRIPTOR.name}; known: {known}")
        return values[value].number
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            if type(None) in args:
                return None
            raise MalformedMessage(f"{path}: must not be null")
        (arm,) = [a for a in args if a is not type(None)]
        return _decode_value(path, arm, value)
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 2**64:
            raise MalformedMessage(f"{path}: expected an unsigned integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise MalformedMessage(f"{path}: expected a boolean, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise MalformedMessage(f"{path}: expected a string, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise MalformedMessage(f"{path}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(hint)
        return [_decode_value(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise MalformedMessage(f"{path}: expected an object, got {type(value).__name__}")
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise MalformedMessage(f"{path}: expected an object, got {type(value).__name__}")
        return _decode_fields(path, hint, value)  # type: ignore[arg-type]
    raise MalformedMessage(f"{path}: unsupported field type {hint!r}")  # pragma: no cover


def _decode_fields(path: str, cls: type[T], obj: dict[str, Any]) -> T:
    hints = _hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise MalformedMessage(f"{path}: unknown field(s) {', '.join(unknown)}")
    values = {}
    for name, f in known.items():
        if name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise MalformedMessage(f"{path}: missing field {name}")
            continue
        values[name] = _decode_value(f"{path}.{name}", hints[name], obj[name])
    return cls(**values)


def _decode(line: str | bytes, table: dict[str, type], what: str) -> Any:
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MalformedMessage(f"{what} line is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise MalformedMessage(f"{what} line is not a JSON object")
    name = obj.pop("type", None)
    if not isinstance(name, str) or name not in table:
        raise MalformedMessage(f"unknown {what} type {name!r}; known: {', '.join(sorted(table))}")
    return _decode_fields(name, table[name], obj)


def decode_command(line: str | bytes) -> Command:
    return _decode(line, COMMANDS, "command")  # type: ignore[no-any-return]


def decode_event(line: str | bytes) -> Event:
    return _decode(line, EVENTS, "event")  # type: ignore[no-any-return]
