"""EdgeEstablisher record FSM of spec §26 with the edge teardown order of §38, as an I/O-free core.

One record per edge of this node. The core turns provisioning, arena, ring-host and driver events
into actions; the shell executes them against the arena-manager, the edge-driver and the *ring
host* (the GpuWorkerCtl on a stage node, the local token endpoint on the orchestrator: the same
InstallRing/UninstallRing/RingInstalled/RingQuiesced contract).

  New -> WaitingForLease -> WaitingForWorkerRing -> WaitingForDriver -> Ready
  (Ready once the driver reports the edge established *and* the ring host holds the pump's wake
  eventfds: a step granted before those reach it would commit to its ring signalling eventfds nobody
  waits on, and the pump would sleep through its first object)
  any live state -> Stopping: StoppingPump -> StoppingWorkerRing -> ReleasingArena -> Stopped
  lease rejected, or still queued after the pressure timeout -> Failed

Teardown (§38) never releases a lease before the pump stopped and the ring quiesced (or the ring
host process is gone). A lease granted after cancellation is released at once, never installed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from swactor.common.events import get_logger
from swactor.common.msgbase import Failure, OfEdge, OfRing
from swactor.common.reasons import name, stream_fault_run_reason
from swactor.v1 import arena_pb2
from swactor.v1 import common_pb2 as pb


class EdgeState(enum.Enum):
    NEW = "New"
    WAITING_FOR_LEASE = "WaitingForLease"
    WAITING_FOR_WORKER_RING = "WaitingForWorkerRing"
    WAITING_FOR_DRIVER = "WaitingForDriver"
    READY = "Ready"
    STOPPING_PUMP = "StoppingPump"
    STOPPING_WORKER_RING = "StoppingWorkerRing"
    RELEASING_ARENA = "ReleasingArena"
    STOPPED = "Stopped"
    FAILED = "Failed"


LIVE = (EdgeState.WAITING_FOR_LEASE, EdgeState.WAITING_FOR_WORKER_RING, EdgeState.WAITING_FOR_DRIVER,
        EdgeState.READY)
STOPPING = (EdgeState.STOPPING_PUMP, EdgeState.STOPPING_WORKER_RING, EdgeState.RELEASING_ARENA)
TERMINAL = (EdgeState.STOPPED, EdgeState.FAILED)


@dataclass(frozen=True)
class EdgeProvision:
    """ProvisionTx / ProvisionRx of §26 plus what the ring host needs for InstallRing."""

    edge_id: int
    direction: str  # "Egress" (Tx: this node produces) | "Ingress" (Rx: this node consumes)
    peer_node_id: int  # consumer node for Tx; producer node for Rx (the driver takes no other's stream)
    port_id: int
    object_spec: Any  # objects.ObjSpec (stage node) | common_pb2.ObjectSpec (token endpoints)
    ring_spec: Any  # common_pb2.RingSpec


@dataclass(frozen=True)
class _Request:
    """Messages about one lease request list its id first, as those about a ring or an edge do theirs
    (swactor.common.msgbase); an input's base says how the core finds its record (`_record_for`)."""
    request_id: int


# ---- inputs ----


@dataclass(frozen=True)
class Provision:
    edge: EdgeProvision
    request_id: int


@dataclass(frozen=True)
class RingLeased(_Request):
    layout: Any  # common.layout.Layout


@dataclass(frozen=True)
class RingLeaseRejected(Failure, _Request):
    """A LeaseRejectReason; UNSPECIFIED: the arena-manager gave no answer."""


@dataclass(frozen=True)
class LeaseTimedOut(_Request):
    """The lease was not granted within the shell's pressure timeout (the arena queued it: §36
    temporary pressure timeout)."""

    waited_s: float


@dataclass(frozen=True)
class WakeFdsUnavailable(OfEdge):
    """The driver accepted the edge but its pump's wake eventfds could not be fetched or taken: the ring
    host and the pump would only find each other's progress by their once-a-second look, so the edge fails."""

    detail: str


@dataclass(frozen=True)
class WakeFdsHanded(OfEdge):
    """The ring host holds the pump's wake eventfds (or has none to take): whatever it is asked after
    this (a step) commits and consumes on eventfds the pump sleeps on."""


@dataclass(frozen=True)
class RingInstalled(OfRing):
    """The ring host opened the ring."""


@dataclass(frozen=True)
class RingFault(Failure, OfRing):
    """The ring host reports the ring unusable: a RingFaultReason."""


@dataclass(frozen=True)
class RingQuiesced(OfRing):
    """The ring host no longer touches the ring."""


@dataclass(frozen=True)
class _EdgeEnd(OfEdge):
    """The edge-driver's events (and StopPump) name the end by its ring as well as its edge: both ends
    of one edge can live on one host with two owners (the orchestrator's token edge into a co-located
    first stage), and one owner must never take the other's end for its own (seen: a stage took the
    orchestrator's PumpStopped for its own, released its ring under a live pump and leaked it)."""

    ring_id: int  # 0 (StreamFault only): no end is established (a parked stream expired): matched by edge


@dataclass(frozen=True)
class DriverEdgeReady(_EdgeEnd):
    """The edge-driver reports the edge established (EdgeEvent.ready)."""


@dataclass(frozen=True)
class StreamFault(Failure, _EdgeEnd):
    """The edge-driver reports the edge's stream failed (EdgeEvent.fault): a StreamFaultReason."""


@dataclass(frozen=True)
class StreamClosed(_EdgeEnd):
    """The edge-driver reports the edge's stream ended in order (EdgeEvent.closed)."""


@dataclass(frozen=True)
class PumpStopped(_EdgeEnd):
    """The edge-driver stopped the edge's pump (EdgeEvent.pump_stopped): it no longer touches the ring."""


@dataclass(frozen=True)
class DriverFailed(OfEdge):
    """EstablishSend/Recv or StopEdge could not be delivered to the edge-driver."""

    detail: str


@dataclass(frozen=True)
class Released(OfRing):
    """The arena-manager took the ring's lease back (ReleaseRing done)."""


@dataclass(frozen=True)
class StopEdge(OfEdge):
    """The run no longer needs the edge: tear it down (§38)."""


Input = (Provision | RingLeased | RingLeaseRejected | LeaseTimedOut | RingInstalled | RingFault | RingQuiesced
         | DriverEdgeReady | StreamFault | StreamClosed | PumpStopped | DriverFailed | WakeFdsUnavailable
         | WakeFdsHanded | Released | StopEdge)

# ---- actions ----


@dataclass(frozen=True)
class LeaseRing(_Request):
    edge_id: int
    direction: str
    ring_spec: Any


@dataclass(frozen=True)
class CancelLease(_Request):
    """Withdraw a lease request the arena still queues."""


@dataclass(frozen=True)
class InstallRing:
    edge: EdgeProvision
    layout: Any


@dataclass(frozen=True)
class UninstallRing(OfRing):
    reason: int  # UninstallReason


@dataclass(frozen=True)
class EstablishSend(OfEdge):
    rx_node_id: int
    layout: Any


@dataclass(frozen=True)
class EstablishRecv(OfEdge):
    tx_node_id: int  # the plan's producer node: the driver refuses streams for the edge from others
    layout: Any


@dataclass(frozen=True)
class StopPump(_EdgeEnd):
    """Ask the driver to stop this owner's end of the edge (PumpStopped answers)."""


@dataclass(frozen=True)
class ReleaseRing(OfRing):
    never_installed: bool  # proof NEVER_INSTALLED (§26 stale grant) vs QUIESCED (§38)


@dataclass(frozen=True)
class EdgeReady(OfEdge):
    """To the local Tx/Rx actor / StageController."""

    ring_id: int


@dataclass(frozen=True)
class EdgeFailed(OfEdge):
    reason: int  # RunFaultReason
    component: int  # Component of the detector
    detail: str
    cause: str = ""  # the §37 cause's name when the detector gave one apart (a StreamFaultReason's)


@dataclass(frozen=True)
class EdgeStopped(OfEdge):
    """The edge holds nothing any more: its pump stopped, its ring quiesced and released."""


Action = (LeaseRing | CancelLease | InstallRing | UninstallRing | EstablishSend | EstablishRecv | StopPump
          | ReleaseRing | EdgeReady | EdgeFailed | EdgeStopped)


@dataclass
class EdgeRecord:
    edge: EdgeProvision
    request_id: int
    state: EdgeState = EdgeState.NEW
    ring_id: int | None = None
    layout: Any = None
    install_sent: bool = False
    ring_gone: bool = False  # quiesced, or its host process was reaped
    driver_sent: bool = False
    driver_ready: bool = False  # DriverEdgeReady came
    wake_fds_handed: bool = False  # WakeFdsHanded came
    pump_stopped: bool = False
    failed: EdgeFailed | None = None


@dataclass
class EdgeEstablisher:
    """All edge records of one node (§26). `handle()` is the only way state changes."""

    records: dict[int, EdgeRecord] = field(default_factory=dict)
    by_request: dict[int, int] = field(default_factory=dict)
    by_ring: dict[int, int] = field(default_factory=dict)

    def _transition(self, rec: EdgeRecord, new: EdgeState, **facts: Any) -> None:
        old, rec.state = rec.state, new
        get_logger(edge_id=rec.edge.edge_id, ring_id=rec.ring_id).info(
            "edge_record_state", old=old.value, new=new.value, **facts)

    def state(self, edge_id: int) -> EdgeState | None:
        rec = self.records.get(edge_id)
        return rec.state if rec else None

    def handle(self, inp: Input) -> list[Action]:
        match inp:
            case Provision(edge, request_id):
                return self._provision(edge, request_id)
            case RingLeased(request_id, layout):
                return self._leased(request_id, layout)
            case RingLeaseRejected(request_id, reason, detail):
                return self._rejected(request_id, reason, detail)
            case LeaseTimedOut(request_id, waited_s):
                return self._lease_timed_out(request_id, waited_s)
            case StopEdge(edge_id):
                return self._stop(rec, None) if (rec := self.records.get(edge_id)) else []
        rec = self._record_for(inp)
        if rec is None:
            return []  # stale event for an unknown (or already forgotten) record
        match inp:
            case RingInstalled():
                if rec.state is EdgeState.WAITING_FOR_WORKER_RING:
                    rec.driver_sent = True
                    self._transition(rec, EdgeState.WAITING_FOR_DRIVER)
                    e = rec.edge
                    if e.direction == "Egress":
                        return [EstablishSend(e.edge_id, e.peer_node_id, rec.layout)]
                    return [EstablishRecv(e.edge_id, e.peer_node_id, rec.layout)]
                return []
            case RingFault(_, reason, detail):
                if reason in (pb.RING_FAULT_WORKER_PROCESS_EXITED, pb.RING_FAULT_WORKER_SHUTTING_DOWN):
                    rec.ring_gone = True  # the reaped process is the quiescence proof (§38)
                return self._stop(rec, EdgeFailed(rec.edge.edge_id, pb.RUN_FAULT_RING_FAULT, pb.COMPONENT_WORKER,
                                                  f"{name(pb.RingFaultReason, reason)}: {detail}"))
            case RingQuiesced():
                rec.ring_gone = True
                return self._advance_teardown(rec)
            case DriverEdgeReady():
                rec.driver_ready = True
                return self._maybe_ready(rec)
            case WakeFdsHanded():
                rec.wake_fds_handed = True
                return self._maybe_ready(rec)
            case StreamFault(_, _, reason, detail):
                # Established once the driver said so, though not Ready before the ring host has the eventfds.
                established = rec.driver_ready or rec.state is not EdgeState.WAITING_FOR_DRIVER
                run = stream_fault_run_reason(reason, established=established)
                return self._stop(rec, EdgeFailed(rec.edge.edge_id, run, pb.COMPONENT_EDGE_DRIVER, detail,
                                                  name(pb.StreamFaultReason, reason)))
            case WakeFdsUnavailable(_, detail):  # the driver runs a pump for it: StopPump as usual
                return self._stop(rec, EdgeFailed(rec.edge.edge_id, pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED,
                                                  pb.COMPONENT_EDGE_DRIVER, f"wake eventfds unavailable: {detail}"))
            case DriverFailed(_, detail):
                rec.pump_stopped = True  # the driver never (or no longer) runs a pump for it
                return self._stop(rec, EdgeFailed(rec.edge.edge_id, pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED,
                                                  pb.COMPONENT_EDGE_DRIVER, detail))
            case StreamClosed():
                return []  # orderly end of the stream: the worker classifies EOF alignment (§25)
            case PumpStopped():
                rec.pump_stopped = True
                return self._advance_teardown(rec)
            case Released():
                if rec.state is EdgeState.RELEASING_ARENA:
                    return self._finish(rec)
                return []
        raise TypeError(f"unknown establisher input {inp!r}")  # pragma: no cover

    def _record_for(self, inp: Input) -> EdgeRecord | None:
        match inp:
            case _EdgeEnd(edge_id, ring_id) if ring_id:
                eid = self.by_ring.get(ring_id)
                if eid != edge_id:
                    return None  # another owner's end of the edge on this host, or a ring since reused
            case OfRing(ring_id):
                eid = self.by_ring.get(ring_id)
            case OfEdge(edge_id):
                eid = edge_id
            case _:
                return None
        return self.records.get(eid) if eid is not None else None

    # ---- setup ----

    def _maybe_ready(self, rec: EdgeRecord) -> list[Action]:
        if rec.state is not EdgeState.WAITING_FOR_DRIVER or not (rec.driver_ready and rec.wake_fds_handed):
            return []
        self._transition(rec, EdgeState.READY)
        assert rec.ring_id is not None
        return [EdgeReady(rec.edge.edge_id, rec.ring_id)]

    def _provision(self, edge: EdgeProvision, request_id: int) -> list[Action]:
        if edge.edge_id in self.records:
            rec = self.records[edge.edge_id]
            return [EdgeFailed(edge.edge_id, pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, pb.COMPONENT_STAGE_CONTROLLER,
                               f"edge {edge.edge_id} is already provisioned ({rec.state.value})")]
        rec = EdgeRecord(edge, request_id)
        self.records[edge.edge_id] = rec
        self.by_request[request_id] = edge.edge_id
        self._transition(rec, EdgeState.WAITING_FOR_LEASE, request_id=request_id)
        return [LeaseRing(request_id, edge.edge_id, edge.direction, edge.ring_spec)]

    def _waiting(self, request_id: int) -> EdgeRecord | None:
        """The record that made this lease request, while it still waits for the lease."""
        eid = self.by_request.get(request_id)
        rec = self.records.get(eid) if eid is not None else None
        return rec if rec is not None and rec.state is EdgeState.WAITING_FOR_LEASE else None

    def _leased(self, request_id: int, layout: Any) -> list[Action]:
        rec = self._waiting(request_id)
        if rec is None:
            # §26: an unused fresh lease granted after cancellation is released, never installed.
            get_logger(ring_id=layout.ring_id).info("edge_stale_lease_released", request_id=request_id)
            return [ReleaseRing(layout.ring_id, never_installed=True)]
        rec.ring_id, rec.layout = layout.ring_id, layout
        self.by_ring[layout.ring_id] = rec.edge.edge_id
        rec.install_sent = True
        self._transition(rec, EdgeState.WAITING_FOR_WORKER_RING)
        return [InstallRing(rec.edge, layout)]

    def _rejected(self, request_id: int, reason: int, detail: str) -> list[Action]:
        rec = self._waiting(request_id)
        if rec is None:
            return []
        run_reason = (pb.RUN_FAULT_RING_REQUEST_OVERSIZED if reason == arena_pb2.LEASE_REJECT_EXCEEDS_CEILING
                      else pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED)
        reason_name = name(arena_pb2.LeaseRejectReason, reason)
        return [self._lease_failed(rec, run_reason, f"{reason_name}: {detail}", reason_name)]

    def _lease_timed_out(self, request_id: int, waited_s: float) -> list[Action]:
        rec = self._waiting(request_id)
        if rec is None:
            return []
        failure = self._lease_failed(rec, pb.RUN_FAULT_ARENA_PRESSURE_TIMEOUT,
                                     f"ring lease not granted within {waited_s:g}s: the arena is under pressure",
                                     "PressureTimeout")
        # A grant racing the cancel is released as stale (_leased: the record is no longer waiting).
        return [failure, CancelLease(request_id)]

    def _lease_failed(self, rec: EdgeRecord, run_reason: int, detail: str, why: str) -> EdgeFailed:
        """The record never got its ring: Failed, with nothing to tear down."""
        rec.failed = EdgeFailed(rec.edge.edge_id, run_reason, pb.COMPONENT_ARENA, detail)
        self._transition(rec, EdgeState.FAILED, reason=why)
        return rec.failed

    # ---- teardown (§38) ----

    def _stop(self, rec: EdgeRecord, failure: EdgeFailed | None) -> list[Action]:
        actions: list[Action] = []
        if failure is not None and rec.failed is None and rec.state not in TERMINAL:
            rec.failed = failure
            actions.append(failure)
        if rec.state in STOPPING:
            return actions + self._advance_teardown(rec)
        if rec.state in TERMINAL:
            if failure is None:  # StopEdge on a finished record: nothing holds resources any more
                if rec.state is EdgeState.FAILED:
                    self._transition(rec, EdgeState.STOPPED, reason="StopEdge")
                actions.append(EdgeStopped(rec.edge.edge_id))
            return actions
        if rec.state is EdgeState.WAITING_FOR_LEASE:
            self._transition(rec, EdgeState.STOPPED, reason="StopEdge")
            return [*actions, CancelLease(rec.request_id), EdgeStopped(rec.edge.edge_id)]
        self._transition(rec, EdgeState.STOPPING_PUMP)
        if rec.driver_sent and not rec.pump_stopped:
            assert rec.ring_id is not None
            actions.append(StopPump(rec.edge.edge_id, rec.ring_id))
        return actions + self._advance_teardown(rec)

    def _advance_teardown(self, rec: EdgeRecord) -> list[Action]:
        actions: list[Action] = []
        if rec.state is EdgeState.STOPPING_PUMP and (rec.pump_stopped or not rec.driver_sent):
            self._transition(rec, EdgeState.STOPPING_WORKER_RING)
            if rec.install_sent and not rec.ring_gone:
                assert rec.ring_id is not None
                reason = pb.UNINSTALL_RING_FAULTED if rec.failed is not None else pb.UNINSTALL_EDGE_STOPPED
                actions.append(UninstallRing(rec.ring_id, reason))
        if rec.state is EdgeState.STOPPING_WORKER_RING and (rec.ring_gone or not rec.install_sent):
            self._transition(rec, EdgeState.RELEASING_ARENA)
            assert rec.ring_id is not None
            actions.append(ReleaseRing(rec.ring_id, never_installed=False))
        return actions

    def _finish(self, rec: EdgeRecord) -> list[Action]:
        self._transition(rec, EdgeState.STOPPED)
        return [EdgeStopped(rec.edge.edge_id)]

    def forget(self, edge_id: int) -> None:
        """Drop a terminal record (after its run ended), so the edge id may be provisioned again."""
        rec = self.records.get(edge_id)
        if rec is not None and rec.state in TERMINAL:
            del self.records[edge_id]
            self.by_request.pop(rec.request_id, None)
            if rec.ring_id is not None:
                self.by_ring.pop(rec.ring_id, None)
