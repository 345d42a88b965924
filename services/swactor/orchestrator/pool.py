"""The PoolReady gate (spec §9): plan only on a pool view that is ready and has stopped changing.

Policy: Booting and Suspect members block (they are in transition and may become Available);
Faulted and Left members are outside the candidate pool. Ready when the view has been unchanged
for `window_s`, no candidate is in transition, and enough candidates are provisionable.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from swactor.orchestrator.nodes import NodeInfo, NodeState


@dataclass(frozen=True)
class PoolStatus:
    ready: bool
    detail: str
    candidates: tuple[NodeInfo, ...]


def _key(members: Sequence[NodeInfo]) -> tuple:
    return tuple(sorted((m.node_id, m.state.value, m.edge_endpoint, m.control_endpoint) for m in members))


class PoolGate:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._key: tuple | None = None
        self._since = 0.0
        self.members: tuple[NodeInfo, ...] = ()

    def observe(self, members: Sequence[NodeInfo], now: float) -> None:
        """A new membership view; the stability window restarts only if it differs."""
        key = _key(members)
        if key != self._key:
            self._key, self._since = key, now
        self.members = tuple(members)

    def snapshot(self) -> PoolGate:
        """A copy that goes on observing on its own (a run's gate, seeded with the view history so far)."""
        return copy.copy(self)

    def stable_at(self) -> float | None:
        """When the current view will have been stable for the window (None before any view)."""
        return None if self._key is None else self._since + self.window_s

    def check(self, now: float, stages: int) -> PoolStatus:
        if self._key is None:
            return PoolStatus(False, "no membership view yet", ())
        transit = [m for m in self.members if m.state in (NodeState.BOOTING, NodeState.SUSPECT)]
        candidates = tuple(m for m in self.members if m.state not in (NodeState.FAULTED, NodeState.LEFT))
        ready = tuple(m for m in candidates if m.provisionable)
        if transit:
            names = ", ".join(f"{m.node_id} is {m.state.value}" for m in transit)
            return PoolStatus(False, f"waiting for candidate nodes: {names}", ready)
        unready = [m for m in candidates if not m.provisionable]
        if unready:
            names = ", ".join(str(m.node_id) for m in unready)
            return PoolStatus(False, f"Available node(s) {names} lack edge/control endpoints", ready)
        if len(ready) < stages:
            return PoolStatus(False, f"{stages} stage(s) need {stages} Available node(s), the pool has {len(ready)}", ready)
        stable_for = now - self._since
        if stable_for < self.window_s:
            return PoolStatus(False, f"pool view stable for {stable_for:.1f}s of {self.window_s:.1f}s", ready)
        return PoolStatus(True, f"{len(ready)} Available node(s), view stable for {stable_for:.1f}s", ready)
