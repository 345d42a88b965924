"""§40 node lifecycle events from membership views (orchestrator/fleet/node_events.py), stored as the
pool's events and relayed into active runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from swactor.orchestrator.fleet import node_events as N
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.manager import Orchestrator
from swactor.orchestrator.runs.store import RunStore
from swactor.v1 import common_pb2 as pb

from .helpers import node


def m(node_id: int, state: NodeState = NodeState.AVAILABLE, *, epoch: int = 1, gen: int = 1,
      reason: str = "") -> NodeInfo:
    return dataclasses.replace(node(node_id, state), epoch=epoch, worker_generation=gen, reason=reason)


def kinds(events: list[pb.LifecycleEvent]) -> list[tuple[str, int]]:
    return [(pb.LifecycleEventKind.Name(e.kind), e.node_id) for e in events]


def test_first_view_starts_every_node_and_announces_the_available_ones() -> None:
    t = N.NodeEventTracker()
    evs = t.observe((m(1), m(2, NodeState.BOOTING, gen=0)), 100)
    assert kinds(evs) == [("NODE_STARTED", 1), ("NODE_AVAILABLE", 1), ("NODE_STARTED", 2)]
    assert [e.worker_generation for e in evs] == [1, 1, 0] and all(e.time_us == 100 for e in evs)
    assert t.observe((m(1), m(2, NodeState.BOOTING, gen=0)), 101) == []  # nothing changed
    assert kinds(t.observe((m(1), m(2)), 102)) == [("NODE_AVAILABLE", 2)]


def test_a_worker_crash_and_restart_is_faulted_then_available_with_the_new_generation() -> None:
    t = N.NodeEventTracker()
    t.observe((m(1),), 0)
    (faulted,) = t.observe((m(1, NodeState.FAULTED, reason="RUN_FAULT_WORKER_CRASHED"),), 1)
    assert faulted.kind == pb.NODE_FAULTED and faulted.reason == "RUN_FAULT_WORKER_CRASHED"
    assert faulted.component == pb.COMPONENT_MEMBERSHIP
    (available,) = t.observe((m(1, gen=2),), 2)
    assert available.kind == pb.NODE_AVAILABLE and available.worker_generation == 2


def test_a_new_generation_while_available_is_announced() -> None:
    t = N.NodeEventTracker()
    t.observe((m(1),), 0)
    assert kinds(t.observe((m(1, gen=2),), 1)) == [("NODE_AVAILABLE", 1)]


def test_suspicion_is_no_event_and_death_is_node_faulted() -> None:
    t = N.NodeEventTracker()
    t.observe((m(1),), 0)
    assert t.observe((m(1, NodeState.SUSPECT),), 1) == []
    assert t.observe((m(1),), 2) == []  # refuted: nothing happened
    t.observe((m(1, NodeState.SUSPECT),), 3)
    (dead,) = t.observe((m(1, NodeState.LEFT),), 4)
    assert dead.kind == pb.NODE_FAULTED and dead.reason == "RUN_FAULT_MEMBERSHIP_LOST"


def test_a_restart_with_a_higher_epoch_starts_the_node_again() -> None:
    t = N.NodeEventTracker()
    t.observe((m(1),), 0)
    t.observe((m(1, NodeState.LEFT),), 1)
    assert kinds(t.observe((m(1, NodeState.BOOTING, epoch=2, gen=0),), 2)) == [("NODE_STARTED", 1)]
    assert kinds(t.observe((m(1, epoch=3),), 3)) == [("NODE_STARTED", 1), ("NODE_AVAILABLE", 1)]


def test_a_node_gone_from_the_view_and_a_departed_stranger() -> None:
    t = N.NodeEventTracker()
    t.observe((m(1), m(2)), 0)
    (gone,) = t.observe((m(1),), 1)
    assert gone.kind == pb.NODE_FAULTED and gone.node_id == 2 and "gone from the membership view" in gone.detail
    assert t.observe((m(1), m(3, NodeState.LEFT)), 2) == []  # never seen alive: nothing to say


def test_published_under_the_pool_id_and_into_active_runs(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "o.sqlite3")

    class Handle:
        def __init__(self) -> None:
            self.got: list[F.Input] = []

        def report(self, inp: F.Input) -> None:
            self.got.append(inp)

    h = Handle()
    evs = N.NodeEventTracker().observe((m(1),), 5)
    N.publish(evs, store, [h])  # type: ignore[list-item]
    assert kinds(store.events(N.POOL_EVENTS_RUN_ID)) == [("NODE_STARTED", 1), ("NODE_AVAILABLE", 1)]
    assert [type(i) for i in h.got] == [F.Relay, F.Relay]
    orch = Orchestrator(models=None, fleet=None, store=store, fsm_config=F.FsmConfig(orchestrator_node_id=1))  # type: ignore[arg-type]
    assert len(orch.events(0).events) == 2 and len(orch.events(0, pb.NODE_AVAILABLE).events) == 1
