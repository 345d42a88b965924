"""The facts several FSM cores' messages carry, as bases each message subclasses.

A message about one ring, edge or role lists that identity first; a failure ends with its reason (the
common.proto enum value its docstring names) and detail. So `RingFault(ring_id, reason, detail)` has
the same fields in the order `case` patterns match them, in every core that declares one, and a core
may match on a base (`case OfRing(ring_id)`) where the identity is all it needs. The bases are never
sent or matched as messages themselves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OfRing:
    """About one ring: its §18 ring id, unique on its host while the ring is leased."""

    ring_id: int


@dataclass(frozen=True)
class OfEdge:
    """About one edge of a run's plan: its §6 edge id (both ends of the edge carry it)."""

    edge_id: int


@dataclass(frozen=True)
class OfRole:
    """About one worker role: the id ConfigureRole gave it in its compute process."""

    role_id: int


@dataclass(frozen=True)
class Failure:
    """Something failed: `reason` is a common.proto enum value (the subclass's docstring names the
    enum: RingFaultReason, RunFaultReason, ...) and `detail` says what went wrong, for people."""

    reason: int
    detail: str = ""
