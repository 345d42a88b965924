"""The PoolReady gate (spec §9), judged on the candidates a run needs.

A run's intended candidate pool is the nodes its placement would use (placement.py): its `--node` pins, else
enough Available nodes with edge and control endpoints (as many stage devices as stages), chosen among the healthy
ones (by memory when the model's is known). PoolReady = every such node Available and unchanged (state, endpoints,
advertised memory and stage devices) for `window_s`.
A member outside the placement (Booting, Suspect, Faulted, Left, or simply not chosen) neither holds the run nor
restarts its window; a pinned node that is not Available yet is waited for. `waiting_for` says what a closed gate
waits for in words that change only when that changes (the run records it as a POOL_WAITING event).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.planning.placement import MemoryNeed, Network, Placement, PlanError, place


@dataclass(frozen=True)
class Demand:
    """What a run needs from the pool."""

    stages: int
    node_ids: tuple[int, ...] = ()
    num_layers: int = 0  # 0: choose the nodes only (no model to split: ListNodes' gate)
    memory: MemoryNeed | None = None
    # The block ranges of the runs in flight it joins (pinned to their nodes): it takes exactly those, whatever the
    # nodes' speeds measured since, so its stages share their resident weights. () = placed by `place`'s rules.
    ranges: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class PoolStatus:
    ready: bool
    detail: str
    # What a closed gate waits for, free of timings ("" when ready).
    waiting_for: str = ""
    placement: Placement | None = None
    # When the placement's nodes will have been unchanged for the window (None: no placement).
    ready_at: float | None = None

    @property
    def candidates(self) -> tuple[NodeInfo, ...]:
        return self.placement.nodes if self.placement is not None else ()


def _key(m: NodeInfo) -> tuple:
    # Not ms_per_layer: a new speed figure moves blocks between the nodes, it does not make one less ready.
    return (m.state, m.edge_endpoint, m.control_endpoint, m.edge_cert_fingerprint, m.memory_bytes, m.devices)


def _closed(why: str, detail: str) -> PoolStatus:
    return PoolStatus(False, detail, waiting_for=why)


class PoolGate:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.members: tuple[NodeInfo, ...] = ()
        # Where tokens start and the RTTs between members: placement orders stages by it (None: node-id order).
        self.network: Network | None = None
        self._seen = False
        # node id -> (what the gate judges of it, since when it has been so)
        self._since: dict[int, tuple[tuple, float]] = {}

    def observe(self, members: Sequence[NodeInfo], now: float) -> None:
        """A new membership view; a node's stability restarts only when what is judged of it changed."""
        since: dict[int, tuple[tuple, float]] = {}
        for m in members:
            old = self._since.get(m.node_id)
            since[m.node_id] = old if old is not None and old[0] == _key(m) else (_key(m), now)
        self._since, self.members, self._seen = since, tuple(members), True

    def snapshot(self) -> PoolGate:
        """A copy that goes on observing on its own (a run's gate, seeded with the view history so far)."""
        return copy.copy(self)  # observe() replaces the dict, never mutates it

    def check(self, now: float, demand: Demand | int) -> PoolStatus:
        demand = demand if isinstance(demand, Demand) else Demand(demand)
        if not self._seen:
            return _closed("a membership view", "no membership view yet")
        view = {m.node_id: m for m in self.members}
        for node_id in demand.node_ids:
            m = view.get(node_id)
            if m is None:
                return _closed(f"pinned node {node_id} to join the pool", f"pinned node {node_id} is not a member")
            if not m.provisionable:
                what = (m.state.value if m.state is not NodeState.AVAILABLE else f"unreachable: {m.unreachable}"
                        if m.unreachable else "Available without edge/control endpoints")
                return _closed(f"pinned node {node_id} to be Available (it is {what})", f"pinned node {node_id} is {what}")
        try:
            placement = place(self.members, demand.stages, demand.num_layers, demand.node_ids, demand.memory,
                              self.network, demand.ranges)
        except PlanError as e:
            return _closed(f"a placement: {e}{self._outside(())}", f"{e}{self._outside(())}")
        since = max(self._since[n.node_id][1] for n in placement.nodes)
        ready_at = since + self.window_s
        names = ", ".join(str(i) for i in dict.fromkeys(n.node_id for n in placement.nodes))  # a node once
        if now < ready_at:
            why = f"node(s) {names} to stay unchanged for {self.window_s:.1f}s"
            return PoolStatus(False, f"{why} (so far {now - since:.1f}s)", why, placement, ready_at)
        detail = f"node(s) {names} Available, unchanged for {now - since:.1f}s{self._outside(placement.nodes)}"
        return PoolStatus(True, detail, "", placement, ready_at)

    def _outside(self, chosen: Sequence[NodeInfo]) -> str:
        """The members left out because they are not Available (they do not hold the run)."""
        ids = {n.node_id for n in chosen}
        sick = [f"{m.node_id} is " + (f"unreachable: {m.unreachable}" if m.unreachable else m.state.value)
                for m in sorted(self.members, key=lambda m: m.node_id) if m.node_id not in ids and not m.provisionable]
        return f" (not candidates: {', '.join(sick)})" if sick else ""
