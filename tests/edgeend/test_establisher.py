"""EdgeEstablisher record FSM (§26) and the edge teardown order (§38), as pure transitions."""

from __future__ import annotations

import pytest

from swactor.common.layout import Layout
from swactor.edgeend import establisher as e
from swactor.edgeend.objects import ObjSpec
from swactor.v1 import arena_pb2
from swactor.v1 import common_pb2 as pb

SPEC = ObjSpec("Activations", 64, "Float", 4, 4, 4)


def prov(edge_id: int = 5, direction: str = "Ingress") -> e.EdgeProvision:
    return e.EdgeProvision(edge_id, direction, peer_node_id=99, port_id=0, object_spec=SPEC, ring_spec=None)


def layout(ring_id: int = 70) -> Layout:
    return Layout(ring_id, 0, 4096, 0, 256, 3840, 64)


def ready(direction: str = "Ingress") -> e.EdgeEstablisher:
    est = e.EdgeEstablisher()
    assert est.handle(e.Provision(prov(5, direction), 11)) == [e.LeaseRing(11, 5, direction, None)]
    assert est.state(5) is e.EdgeState.WAITING_FOR_LEASE
    assert est.handle(e.RingLeased(11, layout())) == [e.InstallRing(prov(5, direction), layout())]
    assert est.state(5) is e.EdgeState.WAITING_FOR_WORKER_RING
    want = e.EstablishRecv(5, 99, layout()) if direction == "Ingress" else e.EstablishSend(5, 99, layout())
    assert est.handle(e.RingInstalled(70)) == [want]
    assert est.state(5) is e.EdgeState.WAITING_FOR_DRIVER
    assert est.handle(e.DriverEdgeReady(5, 70)) == []  # the ring host does not hold the pump's eventfds yet
    assert est.state(5) is e.EdgeState.WAITING_FOR_DRIVER
    assert est.handle(e.WakeFdsHanded(5)) == [e.EdgeReady(5, 70)]
    assert est.state(5) is e.EdgeState.READY
    return est


def test_ready_needs_the_driver_and_the_wake_fds_in_either_order() -> None:
    """A stage granted a step before its compute process holds the pump's eventfds commits on its own ones and
    the pump sleeps through the object (seen on a pool: the first token hung until the pump's periodic look)."""
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    est.handle(e.RingInstalled(70))
    assert est.handle(e.WakeFdsHanded(5)) == []
    assert est.state(5) is e.EdgeState.WAITING_FOR_DRIVER
    assert est.handle(e.DriverEdgeReady(5, 70)) == [e.EdgeReady(5, 70)]
    assert est.handle(e.WakeFdsHanded(5)) == [] and est.handle(e.DriverEdgeReady(5, 70)) == []  # once


@pytest.mark.parametrize("direction", ["Ingress", "Egress"])
def test_setup_and_ordered_teardown(direction: str) -> None:
    est = ready(direction)
    assert est.handle(e.StopEdge(5)) == [e.StopPump(5, 70)]
    assert est.state(5) is e.EdgeState.STOPPING_PUMP
    assert est.handle(e.RingQuiesced(70)) == []  # early proof is kept, but the pump goes first
    est = ready(direction)
    est.handle(e.StopEdge(5))
    assert est.handle(e.PumpStopped(5, 70)) == [e.UninstallRing(70, pb.UNINSTALL_EDGE_STOPPED)]
    assert est.state(5) is e.EdgeState.STOPPING_WORKER_RING
    assert est.handle(e.RingQuiesced(70)) == [e.ReleaseRing(70, never_installed=False)]
    assert est.state(5) is e.EdgeState.RELEASING_ARENA
    assert est.handle(e.Released(70)) == [e.EdgeStopped(5)]
    assert est.state(5) is e.EdgeState.STOPPED
    assert est.handle(e.StopEdge(5)) == [e.EdgeStopped(5)]  # idempotent


def test_stop_while_waiting_for_lease_cancels_and_releases_a_late_grant() -> None:
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    assert est.handle(e.StopEdge(5)) == [e.CancelLease(11), e.EdgeStopped(5)]
    assert est.state(5) is e.EdgeState.STOPPED
    # the grant won the race with CancelLease: released at once, never installed (§26)
    assert est.handle(e.RingLeased(11, layout())) == [e.ReleaseRing(70, never_installed=True)]
    assert est.handle(e.RingLeased(999, layout(71))) == [e.ReleaseRing(71, never_installed=True)]


def test_lease_rejected_fails_the_edge() -> None:
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    (failed,) = est.handle(e.RingLeaseRejected(11, arena_pb2.LEASE_REJECT_EXCEEDS_CEILING, "needs 2 GiB"))
    assert failed == e.EdgeFailed(5, pb.RUN_FAULT_RING_REQUEST_OVERSIZED, pb.COMPONENT_ARENA,
                                 "LEASE_REJECT_EXCEEDS_CEILING: needs 2 GiB")
    assert est.state(5) is e.EdgeState.FAILED
    assert est.handle(e.StopEdge(5)) == [e.EdgeStopped(5)] and est.state(5) is e.EdgeState.STOPPED


def test_stop_while_waiting_for_worker_ring_uninstalls_without_pump() -> None:
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    assert est.handle(e.StopEdge(5)) == [e.UninstallRing(70, pb.UNINSTALL_EDGE_STOPPED)]
    assert est.state(5) is e.EdgeState.STOPPING_WORKER_RING
    assert est.handle(e.RingQuiesced(70)) == [e.ReleaseRing(70, never_installed=False)]


def test_ring_fault_while_waiting_for_worker_ring() -> None:
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    actions = est.handle(e.RingFault(70, pb.RING_FAULT_RING_LAYOUT_INVALID, "bad"))
    assert actions[0] == e.EdgeFailed(5, pb.RUN_FAULT_RING_FAULT, pb.COMPONENT_WORKER, "RING_FAULT_RING_LAYOUT_INVALID: bad")
    assert actions[1:] == [e.UninstallRing(70, pb.UNINSTALL_RING_FAULTED)]


def test_driver_stream_fault_in_ready_runs_the_teardown() -> None:
    est = ready()
    actions = est.handle(e.StreamFault(5, 70, pb.STREAM_FAULT_CONNECTION_LOST, "peer gone"))
    assert actions == [e.EdgeFailed(5, pb.RUN_FAULT_STREAM_FAULT, pb.COMPONENT_EDGE_DRIVER, "peer gone",
                                    "STREAM_FAULT_CONNECTION_LOST"),
                       e.StopPump(5, 70)]
    assert est.handle(e.PumpStopped(5, 70)) == [e.UninstallRing(70, pb.UNINSTALL_RING_FAULTED)]


def test_stream_fault_while_waiting_for_driver_and_establish_failure() -> None:
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    est.handle(e.RingInstalled(70))
    actions = est.handle(e.DriverFailed(5, "edge-driver unreachable"))
    assert actions[0].reason == pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED
    assert actions[1:] == [e.UninstallRing(70, pb.UNINSTALL_RING_FAULTED)]  # no pump ever ran: straight to the ring


def test_worker_crash_counts_as_quiescence() -> None:
    est = ready()
    actions = est.handle(e.RingFault(70, pb.RING_FAULT_WORKER_PROCESS_EXITED, "gone"))
    assert actions == [e.EdgeFailed(5, pb.RUN_FAULT_RING_FAULT, pb.COMPONENT_WORKER, "RING_FAULT_WORKER_PROCESS_EXITED: gone"), e.StopPump(5, 70)]
    # pump stopped, and the reaped worker already proved quiescence: release without UninstallRing
    assert est.handle(e.PumpStopped(5, 70)) == [e.ReleaseRing(70, never_installed=False)]


def test_duplicate_provision_and_stale_events() -> None:
    est = ready()
    (failed,) = est.handle(e.Provision(prov(), 12))
    assert failed.reason == pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED
    assert est.handle(e.RingInstalled(12345)) == []
    assert est.handle(e.DriverEdgeReady(777, 70)) == []
    assert est.handle(e.StreamClosed(5, 70)) == []
    est.handle(e.StopEdge(5))
    est.handle(e.PumpStopped(5, 70))
    est.handle(e.RingQuiesced(70))
    est.handle(e.Released(70))
    est.forget(5)
    assert est.state(5) is None


def test_stream_fault_before_driver_ready_is_an_establishment_failure() -> None:
    """A dial that fails (the peer never answers) faults the edge before DriverEdgeReady: §36's edge
    establishment failure, not a stream fault."""
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    est.handle(e.RingInstalled(70))
    actions = est.handle(e.StreamFault(5, 70, pb.STREAM_FAULT_PEER_UNREACHABLE, "no handshake"))
    assert actions[0] == e.EdgeFailed(5, pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, pb.COMPONENT_EDGE_DRIVER,
                                      "no handshake", "STREAM_FAULT_PEER_UNREACHABLE")


def test_stream_fault_after_driver_ready_before_the_eventfds_is_a_stream_fault() -> None:
    """The edge is established (a rogue's parked stream already runs into the ring) but not Ready while the ring host
    takes the eventfds: a reset then is the stream's fault, not the establishment's (seen in CI)."""
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    est.handle(e.RingInstalled(70))
    assert est.handle(e.DriverEdgeReady(5, 70)) == []
    actions = est.handle(e.StreamFault(5, 70, pb.STREAM_FAULT_STREAM_RESET, "peer reset the stream"))
    assert actions[0] == e.EdgeFailed(5, pb.RUN_FAULT_STREAM_FAULT, pb.COMPONENT_EDGE_DRIVER,
                                      "peer reset the stream", "STREAM_FAULT_STREAM_RESET")


def test_pump_ring_fault_is_a_ring_fault() -> None:
    est = ready()
    actions = est.handle(e.StreamFault(5, 70, pb.STREAM_FAULT_RING_FAULT, "RingStateInvalid"))
    assert actions[0] == e.EdgeFailed(5, pb.RUN_FAULT_RING_FAULT, pb.COMPONENT_EDGE_DRIVER,
                                      "RingStateInvalid", "STREAM_FAULT_RING_FAULT")


def test_the_other_owners_end_of_the_same_edge_is_not_ours() -> None:
    """Both ends of one edge can live on one host (the orchestrator's token edge into a co-located
    first stage): the other end's driver events name its ring and leave this record alone (seen: a
    stage took the orchestrator's PumpStopped for its own and released its ring under a live pump)."""
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    assert est.handle(e.PumpStopped(5, 71)) == []  # the orchestrator's send end, ring 71, stopped first
    assert est.handle(e.StreamFault(5, 71, pb.STREAM_FAULT_CONNECTION_LOST, "theirs")) == []
    est.handle(e.RingInstalled(70))
    assert est.handle(e.DriverEdgeReady(5, 71)) == [] and est.state(5) is e.EdgeState.WAITING_FOR_DRIVER
    assert est.handle(e.StopEdge(5)) == [e.StopPump(5, 70)]  # our pump still runs: stopped before the ring goes
    assert est.handle(e.PumpStopped(5, 70)) == [e.UninstallRing(70, pb.UNINSTALL_EDGE_STOPPED)]


def test_a_fault_without_an_end_is_matched_by_edge() -> None:
    est = ready()
    (failed, stop) = est.handle(e.StreamFault(5, 0, pb.STREAM_FAULT_RENDEZVOUS_TIMEOUT, "parked stream expired"))
    assert failed.reason == pb.RUN_FAULT_STREAM_FAULT and stop == e.StopPump(5, 70)
