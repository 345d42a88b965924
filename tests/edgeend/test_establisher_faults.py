"""EdgeEstablisher faults of issue 12, as pure transitions: a lease the arena keeps queued past the
pressure timeout, and wake eventfds the driver cannot hand over."""

from __future__ import annotations

from swactor.edgeend import establisher as e
from swactor.v1 import common_pb2 as pb

from .test_establisher import layout, prov, ready


def test_a_lease_queued_past_the_pressure_timeout_fails_the_edge_and_withdraws_the_request() -> None:
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    failed, cancel = est.handle(e.LeaseTimedOut(11, 30.0))
    assert failed == e.EdgeFailed(5, pb.RUN_FAULT_ARENA_PRESSURE_TIMEOUT, pb.COMPONENT_ARENA,
                                  "ring lease not granted within 30s: the arena is under pressure")
    assert cancel == e.CancelLease(11) and est.state(5) is e.EdgeState.FAILED
    # the grant raced the cancel: released at once, never installed
    assert est.handle(e.RingLeased(11, layout())) == [e.ReleaseRing(70, never_installed=True)]
    assert est.handle(e.StopEdge(5)) == [e.EdgeStopped(5)] and est.state(5) is e.EdgeState.STOPPED


def test_a_pressure_timeout_after_the_grant_changes_nothing() -> None:
    est = e.EdgeEstablisher()
    est.handle(e.Provision(prov(), 11))
    est.handle(e.RingLeased(11, layout()))
    assert est.handle(e.LeaseTimedOut(11, 30.0)) == []
    assert est.state(5) is e.EdgeState.WAITING_FOR_WORKER_RING
    assert est.handle(e.LeaseTimedOut(999, 30.0)) == []  # unknown request


def test_wake_fds_unavailable_fails_the_edge_and_stops_its_pump_first() -> None:
    for before_ready in (True, False):
        est = e.EdgeEstablisher()
        est.handle(e.Provision(prov(), 11))
        est.handle(e.RingLeased(11, layout()))
        est.handle(e.RingInstalled(70))
        if not before_ready:
            est.handle(e.DriverEdgeReady(5, 70))
        failed, stop = est.handle(e.WakeFdsUnavailable(5, "WakeFdError: connection refused"))
        assert failed == e.EdgeFailed(5, pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, pb.COMPONENT_EDGE_DRIVER,
                                      "wake eventfds unavailable: WakeFdError: connection refused")
        assert stop == e.StopPump(5, 70)  # the driver runs a pump for it: §38 order as for any fault
        assert est.handle(e.PumpStopped(5, 70)) == [e.UninstallRing(70, pb.UNINSTALL_RING_FAULTED)]
        assert est.handle(e.RingQuiesced(70)) == [e.ReleaseRing(70, never_installed=False)]


def test_wake_fds_unavailable_on_a_ready_edge() -> None:
    est = ready()
    failed, stop = est.handle(e.WakeFdsUnavailable(5, "gone"))
    assert failed.reason == pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED and stop == e.StopPump(5, 70)
