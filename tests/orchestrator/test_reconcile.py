"""Restart reconciliation core (orchestrator/fleet/reconcile.py): every transition on a scripted clock."""

from __future__ import annotations

from swactor.orchestrator.fleet import reconcile as R
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

RUN = 41


def node(node_id: int, state: NodeState = NodeState.AVAILABLE, control: str = "h:7441") -> NodeInfo:
    return NodeInfo(node_id, state, edge_endpoint="h:7400", control_endpoint=control)


def leftover(*nodes: int, edges: tuple[int, ...] = (100, 101)) -> R.Leftover:
    return R.Leftover(RUN, tuple(enumerate(nodes)), edges)


def kinds(actions: list) -> list[str]:
    return [pb.LifecycleEventKind.Name(a.event.kind) for a in actions if isinstance(a, R.Emit)]


def of(actions: list, kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def torn_down(actions: list) -> pb.LifecycleEvent:
    (ev,) = [a.event for a in actions if isinstance(a, R.Emit) and a.event.kind == pb.RUN_TORN_DOWN]
    return ev


def test_leftover_from_a_stored_run_names_its_stages_and_token_edges() -> None:
    run = opb.Run(run_id=RUN)
    run.placement.add(stage_index=1, node_id=8, inbound_edge_id=51, outbound_edge_id=52)
    run.placement.add(stage_index=0, node_id=7, inbound_edge_id=50, outbound_edge_id=51)
    assert R.Leftover.of(run) == R.Leftover(RUN, ((0, 7), (1, 8)), (50, 52))


def test_happy_path_stop_confirm_release_then_run_torn_down() -> None:
    core = R.Reconciler((leftover(7, 8),))
    out = core.handle(R.Tick(), 0.0)
    assert of(out, R.ReleaseLocal) == [R.ReleaseLocal(RUN, (100, 101))]
    assert of(out, R.SendStopRun) == []  # no view yet: where are the nodes?
    out = core.handle(R.View((node(7), node(8))), 0.1)
    assert [(a.stage_index, a.node.node_id) for a in of(out, R.SendStopRun)] == [(0, 7), (1, 8)]
    assert kinds(out) == ["STOP_RUN_SENT", "STOP_RUN_SENT"]
    assert core.busy_nodes() == {7: (RUN,), 8: (RUN,)}
    masked = core.mask_view((node(7), node(8), node(9)))
    assert [m.state for m in masked] == [NodeState.BOOTING, NodeState.BOOTING, NodeState.AVAILABLE]
    assert f"run {RUN}" in masked[0].reason
    out = core.handle(R.StopAnswered(RUN, 0, known=True), 0.2)
    assert of(out, R.WatchUntilStopped) == [R.WatchUntilStopped(RUN, 0, node(7))]
    out = core.handle(R.StopAnswered(RUN, 1, known=False), 0.2)  # that node had forgotten the run
    assert kinds(out) == ["STAGE_STOPPED"] and of(out, R.ViewChanged)
    assert core.busy_nodes() == {7: (RUN,)}
    out = core.handle(R.StageStoppedSeen(RUN, 0), 0.5)
    assert kinds(out) == ["STAGE_STOPPED"] and not core.done  # the local edges are not released yet
    out = core.handle(R.LocalReleased(RUN, ""), 0.6)
    ev = torn_down(out)
    assert core.done and ev.reason == "" and dict(ev.counters) == {"stages_stopped": 2, "stages_unconfirmed": 0}
    assert core.busy_nodes() == {} and core.deadline() is None


def test_a_node_that_held_several_runs_in_flight_stays_masked_until_every_one_is_stopped() -> None:
    other = R.Leftover(RUN + 1, ((0, 7),), (200, 201))
    core = R.Reconciler((leftover(7, 8), other))
    core.handle(R.View((node(7), node(8))), 0.0)
    assert core.busy_nodes() == {7: (RUN, RUN + 1), 8: (RUN,)}
    assert core.mask_view((node(7),))[0].reason == f"tearing down runs {RUN}, {RUN + 1} left by the previous orchestrator"
    core.handle(R.StopAnswered(RUN, 0, known=False), 0.1)
    assert core.busy_nodes() == {7: (RUN + 1,), 8: (RUN,)}
    core.handle(R.StopAnswered(RUN + 1, 0, known=False), 0.2)
    assert core.busy_nodes() == {8: (RUN,)} and core.mask_view((node(7),))[0].state is NodeState.AVAILABLE


def test_stop_run_is_retried_with_backoff_until_answered() -> None:
    core = R.Reconciler((leftover(7),))
    core.handle(R.View((node(7),)), 0.0)
    out = core.handle(R.StopFailed(RUN, 0, "UNAVAILABLE: connection refused"), 0.1)
    assert out == [] and core.deadline() == 0.1 + R.RETRY_FIRST_S
    assert of(core.handle(R.Tick(), 0.5), R.SendStopRun) == []
    out = core.handle(R.Tick(), 0.6)
    assert len(of(out, R.SendStopRun)) == 1 and kinds(out) == []  # stop_run_sent only once
    core.handle(R.StopFailed(RUN, 0, "again"), 0.7)
    assert core.deadline() == 0.7 + 2 * R.RETRY_FIRST_S
    for _ in range(10):  # the backoff is capped
        core.handle(R.Tick(), core.deadline() or 0.0)
        core.handle(R.StopFailed(RUN, 0, "again"), 100.0)
    assert core.deadline() == 100.0 + R.RETRY_MAX_S
    assert core.busy_nodes() == {7: (RUN,)}  # retried as long as the node is in the pool


def test_a_node_that_leaves_the_pool_ends_the_retries() -> None:
    core = R.Reconciler((leftover(7),))
    core.handle(R.View((node(7),)), 0.0)
    core.handle(R.StopFailed(RUN, 0, "refused"), 0.1)
    out = core.handle(R.View((node(7, NodeState.LEFT),)), 0.2)
    (ev,) = [a.event for a in out if isinstance(a, R.Emit) and a.event.kind == pb.STAGE_STOPPED]
    assert ev.reason == "RUN_FAULT_MEMBERSHIP_LOST" and ev.component == pb.COMPONENT_MEMBERSHIP
    out = core.handle(R.LocalReleased(RUN, ""), 0.3)
    assert torn_down(out).reason == "" and core.done


def test_a_node_absent_from_the_view_counts_as_gone_after_the_grace() -> None:
    core = R.Reconciler((leftover(7, 8),), absent_grace_s=10.0)
    core.handle(R.View((node(8),)), 1.0)  # node 7 never shows up
    assert core.deadline() == 11.0
    assert kinds(core.handle(R.Tick(), 10.9)) == []
    assert kinds(core.handle(R.Tick(), 11.0)) == ["STAGE_STOPPED"]


def test_a_present_but_unreachable_node_waits_without_a_timer() -> None:
    core = R.Reconciler((leftover(7),))
    core.handle(R.View((node(7),)), 0.0)
    core.handle(R.StopFailed(RUN, 0, "refused"), 0.1)
    core.handle(R.View((node(7, NodeState.FAULTED, control=""),)), 0.2)
    assert of(core.handle(R.Tick(), 1.0), R.SendStopRun) == []
    assert core.deadline() is None  # nothing to do until the view changes
    out = core.handle(R.View((node(7),)), 2.0)
    assert len(of(out, R.SendStopRun)) == 1


def test_a_broken_confirmation_stream_sends_stop_run_again() -> None:
    core = R.Reconciler((leftover(7),))
    core.handle(R.View((node(7),)), 0.0)
    core.handle(R.StopAnswered(RUN, 0, known=True), 0.1)
    core.handle(R.ConfirmLost(RUN, 0, "UNAVAILABLE"), 0.2)
    assert len(of(core.handle(R.Tick(), 0.2 + R.RETRY_FIRST_S), R.SendStopRun)) == 1


def test_no_stage_stopped_within_the_confirm_timeout_is_named_in_run_torn_down() -> None:
    core = R.Reconciler((leftover(7),), confirm_timeout_s=30.0)
    core.handle(R.View((node(7),)), 0.0)
    core.handle(R.StopAnswered(RUN, 0, known=True), 1.0)
    core.handle(R.LocalReleased(RUN, "ring 5 of edge 100 still leased (owner holds: False, attached holders: [3])"), 1.1)
    assert core.deadline() == 31.0
    assert not core.done and core.handle(R.Tick(), 30.9) == []
    ev = torn_down(core.handle(R.Tick(), 31.0))
    assert ev.reason == "RUN_FAULT_TEARDOWN_TIMEOUT"
    assert "no StageStopped from stage 0 on node 7" in ev.detail and "ring 5 of edge 100" in ev.detail
    assert dict(ev.counters) == {"stages_stopped": 0, "stages_unconfirmed": 1}
    assert core.busy_nodes() == {}  # given up on: the node is offered to new runs again


def test_local_leftovers_alone_make_a_teardown_timeout() -> None:
    core = R.Reconciler((leftover(7),))
    core.handle(R.View((node(7),)), 0.0)
    core.handle(R.StopAnswered(RUN, 0, known=False), 0.1)
    ev = torn_down(core.handle(R.LocalReleased(RUN, "edge-driver / arena-manager unreachable"), 0.2))
    assert ev.reason == "RUN_FAULT_TEARDOWN_TIMEOUT" and "unreachable" in ev.detail


def test_several_runs_finish_independently() -> None:
    a, b = R.Leftover(1, ((0, 7),), (10, 11)), R.Leftover(2, ((0, 8),), (20, 21))
    core = R.Reconciler((a, b))
    core.handle(R.View((node(7), node(8))), 0.0)
    core.handle(R.StopAnswered(1, 0, known=False), 0.1)
    out = core.handle(R.LocalReleased(1, ""), 0.2)
    assert torn_down(out).run_id == 1 and not core.done
    core.handle(R.StopAnswered(2, 0, known=False), 0.3)
    assert torn_down(core.handle(R.LocalReleased(2, ""), 0.4)).run_id == 2 and core.done


def test_late_answers_after_a_terminal_state_change_nothing() -> None:
    core = R.Reconciler((leftover(7),))
    core.handle(R.View((node(7, NodeState.LEFT),)), 0.0)
    assert core.handle(R.StopAnswered(RUN, 0, known=True), 0.1) == []
    assert core.handle(R.StageStoppedSeen(RUN, 0), 0.2) == []
