"""Plain data of the arena core: requests, layouts, leases, holders and the events the table emits.

No protobuf here: the servicer converts at the edge. Enum values equal the proto enum numbers
(protos/swactor/v1/arena.proto and common.proto) so the conversion is a cast.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from swactor.arena.freelist import Range
from swactor.arena.fsm import ArenaState
from swactor.common.layout import Layout


class Direction(enum.IntEnum):
    UNSPECIFIED = 0
    INGRESS = 1
    EGRESS = 2


class RejectReason(enum.IntEnum):
    """Why a lease can never be granted (LeaseRejectReason in arena.proto)."""

    EXCEEDS_CEILING = 1
    SHUTTING_DOWN = 2
    RING_INIT_FAILED = 3


class CancelReason(enum.IntEnum):
    """Why a queued lease left the queue unserved (LeaseCancelReason in arena.proto)."""

    CANCEL_LEASE = 1  # an explicit CancelLease
    HOLDER_GONE = 2  # the requesting holder's process exited
    STREAM_CLOSED = 3  # the caller abandoned its LeaseRing stream


class ReleaseProof(enum.IntEnum):
    """What the owner asserts when it releases (ReleaseProof in arena.proto)."""

    QUIESCED = 1  # pump stopped and worker ring quiesced (spec §38)
    NEVER_INSTALLED = 2  # a fresh lease no pump or worker ever used (spec §26)


class DetachProof(enum.IntEnum):
    """What a holder asserts when it stops using a ring (DetachProof in arena.proto)."""

    PUMP_STOPPED = 1
    RING_QUIESCED = 2
    COPIES_ENDED = 3


class AttachRole(enum.IntEnum):
    PUMP = 1
    WORKER_RING = 2
    COPY = 3
    OTHER = 4


class ReclaimCause(enum.IntEnum):
    RELEASED = 1  # explicit ReleaseRing with no attachment left
    LAST_DETACH = 2  # the owner was gone; the last attached holder detached
    HOLDER_EXITED = 3  # the last holder keeping the range exited


@dataclass(frozen=True, slots=True)
class RingRequest:
    """LeaseRing's arguments, already out of protobuf."""

    request_id: int
    requester: str
    edge_id: int
    direction: int
    data_capacity: int
    alignment: int
    holder_id: int
    spec_direction: int = 0
    host_pinning: int = 0
    wake_coalescing: int = 0
    prefault: bool = False

    def identity(self) -> dict[str, int | str]:
        """The fields that name the request wherever it is reported (log events, Stats' queued leases)."""
        return {"edge_id": self.edge_id, "requester": self.requester, "request_id": self.request_id,
                "holder_id": self.holder_id}


@dataclass(slots=True)
class Lease:
    request: RingRequest
    range: Range
    layout: Layout
    leased_at: float
    # False once the owning holder's process is gone: the range then only waits for attachments.
    owner_holds: bool = True
    attached: dict[int, AttachRole] = field(default_factory=dict)

    @property
    def ring_id(self) -> int:
        return self.layout.ring_id

    @property
    def owner(self) -> int:
        return self.request.holder_id


@dataclass(frozen=True, slots=True)
class Pending:
    request: RingRequest
    needed: int  # page-rounded range length
    range_alignment: int
    queued_at: float


@dataclass(slots=True)
class Holder:
    holder_id: int
    pid: int
    uid: int
    connected: bool = True


# ---- events: what a call on the table did, in order ----
# Each lists what it is about first: the lease request (and its ring, once leased), or the holder.


@dataclass(frozen=True, slots=True)
class _OfRequest:
    request: RingRequest


@dataclass(frozen=True, slots=True)
class _OfLease(_OfRequest):
    ring_id: int


@dataclass(frozen=True, slots=True)
class _OfHolder:
    holder: Holder


@dataclass(frozen=True, slots=True)
class LeaseQueued(_OfRequest):
    position: int  # 0 = head of the queue
    needed: int


@dataclass(frozen=True, slots=True)
class RingLeased(_OfRequest):
    layout: Layout


@dataclass(frozen=True, slots=True)
class LeaseRejected(_OfRequest):
    reason: RejectReason
    detail: str


@dataclass(frozen=True, slots=True)
class LeaseCancelled(_OfRequest):
    reason: CancelReason


@dataclass(frozen=True, slots=True)
class RingReleased(_OfLease):
    proof: ReleaseProof
    deferred: bool = False  # holders still attached: the last detach reclaims the range


@dataclass(frozen=True, slots=True)
class RingReclaimed(_OfLease):
    range: Range
    cause: ReclaimCause


@dataclass(frozen=True, slots=True)
class RingAttached(_OfLease):
    holder_id: int
    role: AttachRole


@dataclass(frozen=True, slots=True)
class RingDetached(_OfLease):
    holder_id: int
    proof: DetachProof | None  # None: the holder's process exited


@dataclass(frozen=True, slots=True)
class HolderJoined(_OfHolder):
    """A process took the arena from the fd hand-out server."""


@dataclass(frozen=True, slots=True)
class HolderDisconnected(_OfHolder):
    """Its connection closed but its process may still map the arena: it keeps every hold it has."""


@dataclass(frozen=True, slots=True)
class HolderGone(_OfHolder):
    """Its process exited: it dropped all it held."""


@dataclass(frozen=True, slots=True)
class StateChanged:
    old: ArenaState
    new: ArenaState
    detail: str


Event = (
    LeaseQueued
    | RingLeased
    | LeaseRejected
    | LeaseCancelled
    | RingReleased
    | RingReclaimed
    | RingAttached
    | RingDetached
    | HolderJoined
    | HolderDisconnected
    | HolderGone
    | StateChanged
)


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A lease as it stands now (Lease itself changes as holders attach and leave)."""

    request: RingRequest  # its holder_id is the owner's
    ring_id: int
    owner_pid: int
    owner_holds: bool
    attached_holder_ids: tuple[int, ...]
    layout: Layout
    range_length: int


@dataclass(frozen=True, slots=True)
class Stats:
    state: ArenaState
    ceiling: int
    leased_bytes: int
    free_bytes: int
    largest_free_range: int
    free_ranges: int
    leases: tuple[LeaseInfo, ...]
    queued: tuple[Pending, ...]
    holders: tuple[Holder, ...]
