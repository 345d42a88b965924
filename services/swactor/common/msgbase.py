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
    ring_id: int


@dataclass(frozen=True)
class OfEdge:
    edge_id: int


@dataclass(frozen=True)
class OfRole:
    role_id: int


@dataclass(frozen=True)
class Failure:
    reason: int
    detail: str = ""
