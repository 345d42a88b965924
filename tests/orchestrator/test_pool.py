"""The PoolReady gate (spec §9) judges the candidates a run needs: tables of views, a scripted clock."""

from __future__ import annotations

import dataclasses

import pytest

from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.planning.placement import MemoryNeed
from swactor.orchestrator.planning.pool import Demand, PoolGate

from .helpers import node
from .test_placement import LLAMA8B, GiB

B, A, S, F, L = NodeState.BOOTING, NodeState.AVAILABLE, NodeState.SUSPECT, NodeState.FAULTED, NodeState.LEFT


def view(*states: NodeState, memory: tuple[int, ...] = ()) -> tuple[NodeInfo, ...]:
    return tuple(dataclasses.replace(node(i + 1, s), memory_bytes=memory[i] if memory else 0)
                 for i, s in enumerate(states))


def gate(members: tuple[NodeInfo, ...], at: float = 0.0) -> PoolGate:
    g = PoolGate(2.0)
    g.observe(members, at)
    return g


@pytest.mark.parametrize(
    ("states", "demand", "ready", "nodes", "says"),
    [
        ((A, A, B), Demand(2), True, [1, 2], "not candidates: 3 is booting"),
        ((A, S, A), Demand(2), True, [1, 3], "not candidates: 2 is suspect"),
        ((B, A, A, F, L), Demand(2), True, [2, 3], "1 is booting, 4 is faulted, 5 is left"),
        ((A, B, S), Demand(2), False, [], "2 stage(s) need 2 stage device(s), the pool has 1 on 1 Available node(s) (not candidates: 2 is booting, 3 is suspect)"),
        ((A, A, B), Demand(2, node_ids=(3, 1)), False, [], "pinned node 3 is booting"),
        ((A, A), Demand(2, node_ids=(2, 7)), False, [], "pinned node 7 is not a member"),
        ((A, S, A), Demand(2, node_ids=(3, 1)), True, [3, 1], "not candidates: 2 is suspect"),
    ],
)
def test_the_gate_judges_only_the_nodes_the_run_needs(states, demand: Demand, ready: bool, nodes: list[int], says: str) -> None:
    status = gate(view(*states)).check(10.0, demand)
    assert status.ready is ready and [n.node_id for n in status.candidates] == nodes
    assert says in status.detail
    assert (status.waiting_for == "") is ready


def test_no_view_yet() -> None:
    status = PoolGate(2.0).check(0.0, Demand(1))
    assert not status.ready and status.waiting_for == "a membership view"


def test_a_change_outside_the_placement_does_not_restart_the_window() -> None:
    g = gate(view(A, A, A))
    g.observe(view(A, A, S), 1.5)  # node 3 is not chosen for two stages
    assert g.check(2.0, Demand(2)).ready
    g.observe((*view(A), dataclasses.replace(node(2), control_endpoint="10.0.0.2:9999"), node(3, S)), 2.5)
    status = g.check(3.0, Demand(2))  # node 2 moved its control endpoint: it is judged again from 2.5
    assert not status.ready and status.ready_at == 4.5 and status.waiting_for == "node(s) 1, 2 to stay unchanged for 2.0s"
    assert g.check(4.5, Demand(2)).ready


def test_memory_chooses_the_candidates_and_a_shortfall_is_waited_for() -> None:
    need = MemoryNeed(LLAMA8B, 4096)
    g = gate(view(A, A, A, memory=(8 * GiB, 40 * GiB, 40 * GiB)))
    status = g.check(5.0, Demand(2, num_layers=32, memory=need))
    assert status.ready and [n.node_id for n in status.candidates] == [2, 3]
    assert status.placement is not None and status.placement.ranges == ((0, 16), (16, 32))
    status = gate(view(A, A, memory=(2 * GiB, 2 * GiB))).check(5.0, Demand(2, num_layers=32, memory=need))
    assert not status.ready and status.waiting_for.startswith("a placement: the model does not fit the nodes' memory: stage 0")
    # a bigger node joining is chosen, and waited for until it has been unchanged for the window
    g.observe(view(A, A, A, A, memory=(8 * GiB, 40 * GiB, 40 * GiB, 80 * GiB)), 6.0)
    status = g.check(6.5, Demand(2, num_layers=32, memory=need))
    assert not status.ready and [n.node_id for n in status.candidates] == [2, 4] and status.ready_at == 8.0


def test_a_snapshot_observes_on_its_own() -> None:
    g = gate(view(A, A))
    run = g.snapshot()
    run.observe(view(A, B), 1.0)
    assert not run.check(5.0, Demand(2)).ready and g.check(5.0, Demand(2)).ready


def test_a_refused_shortfall_names_the_pinned_nodes_that_are_not_available() -> None:
    from swactor.orchestrator.planning.dry_run import pool_refusal

    members = (node(1), dataclasses.replace(node(2), state=NodeState.BOOTING), node(3))
    said = pool_refusal(members, Demand(3, (1, 2, 3), 30))
    assert said.startswith("3 stage(s) need 3 stage device(s); the pool has 2 on 2 Available node(s) (of 3 known)")
    assert said.endswith("; pinned node(s) not Available: 2 (booting)")
    assert "pinned" not in pool_refusal(members, Demand(3, (), 30))  # nothing pinned: nothing to name


def test_a_suspected_member_the_run_needs_is_waited_for_not_refused() -> None:
    """On a lossy WAN path SWIM suspects a healthy member for a few seconds: SubmitRun takes a run that needs it and
    the gate waits for it (pool_timeout_s); a run that needs more than the suspected ones could give is refused."""
    from swactor.orchestrator.planning.dry_run import pool_refusal

    members = (node(1), dataclasses.replace(node(2), state=NodeState.SUSPECT), node(3))
    assert pool_refusal(members, Demand(3, (), 30)) == ""
    gate = PoolGate(window_s=0.0)
    gate.observe(members, 0.0)
    assert not gate.check(1.0, Demand(3, (), 30)).ready
    gate.observe((node(1), node(2), node(3)), 2.0)
    assert gate.check(3.0, Demand(3, (), 30)).ready
    four = pool_refusal(members, Demand(4, (), 30))
    assert four.startswith("4 stage(s) need 4 stage device(s); the pool has 2 on 2 Available node(s) (of 3 known)")
