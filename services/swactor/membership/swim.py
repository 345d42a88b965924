"""The SWIM engine behind a thin interface, so the service never depends on one implementation.

An engine runs the protocol (probes, indirect probes, suspicion, dissemination, Lifeguard) off
the service's event loop and reports what it sees as `SwimEvent`s about `SwimMember`s.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol


class Liveness(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True)
class SwimMember:
    name: str
    addr: str
    liveness: Liveness
    incarnation: int
    meta: Mapping[str, str] = field(default_factory=dict)
    epoch: int = 0


class SwimEventKind(enum.Enum):
    JOINED = "joined"
    SUSPECT = "suspect"
    RECOVERED = "recovered"
    DEAD = "dead"
    LEFT = "left"
    UPDATED = "updated"
    # Events were lost (a slow consumer): re-read members() and diff.
    RESYNC = "resync"
    # A user message from `member` (the RTT probes and rows of rtt.py), not a change of the member.
    MESSAGE = "message"


@dataclass(frozen=True)
class SwimEvent:
    kind: SwimEventKind
    member: SwimMember | None = None
    data: bytes = b""  # MESSAGE only


@dataclass(frozen=True)
class SwimSettings:
    name: str
    bind: str
    advertise: str | None
    seeds: list[str]
    cluster: str
    key: bytes
    meta: Mapping[str, str]
    probe_interval_s: float
    probe_timeout_s: float
    indirect_checks: int
    suspicion_mult: int
    suspicion_max_mult: int
    expected_confirmations: int
    awareness_max: int
    gossip_interval_s: float
    gossip_nodes: int
    retransmit_mult: int
    push_pull_interval_s: float


@dataclass(frozen=True)
class SwimCounters:
    packets_received: int = 0
    decrypt_failures: int = 0
    decode_errors: int = 0
    probes_sent: int = 0
    probes_failed: int = 0
    suspicions: int = 0
    refutations: int = 0
    local_health: int = 0


class SwimStartError(RuntimeError):
    """The engine could not start (gossip address in use, seeds unresolvable); names the cause."""


class MessageFailed(Exception):
    """A user message was refused (not a live member, too large, engine closed); names why."""


class JoinFailed(Exception):
    """No seed answered a join attempt."""


class SwimBackend(Protocol):
    async def start(self) -> None:
        """Bind the gossip socket and start the protocol (a first join may still be pending)."""

    async def join(self, seeds: list[str]) -> int:
        """Sync state with the seeds; returns how many answered; raises JoinFailed if none."""

    def local(self) -> SwimMember: ...

    def members(self) -> list[SwimMember]:
        """Alive and suspect members, this node included."""

    def member(self, name: str) -> SwimMember | None:
        """One member by name, dead and left tombstones included."""

    def events(self) -> AsyncIterator[SwimEvent]:
        """Events from the moment of this call (not of the first read), so that a caller can
        subscribe, then read members(), and miss nothing in between."""

    async def set_meta(self, meta: Mapping[str, str]) -> None: ...

    async def send(self, name: str, data: bytes) -> None:
        """A best-effort user message to one live member (MESSAGE there); MessageFailed when it cannot go."""

    async def broadcast(self, data: bytes) -> None:
        """A best-effort user message gossiped to every member (at most 256 bytes); MessageFailed when refused."""

    def counters(self) -> SwimCounters: ...

    async def leave(self, timeout_s: float) -> None:
        """Announce a graceful leave (peers see "left", not "dead") and wait for it to spread."""

    async def close(self) -> None: ...
