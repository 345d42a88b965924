"""protobuf <-> arena core data, in one place (the servicer and the client both use it)."""

from __future__ import annotations

from swactor.arena.model import (
    Holder,
    LeaseCancelled,
    LeaseInfo,
    LeaseQueued,
    LeaseRejected,
    Pending,
    RingLeased,
    RingRequest,
    Stats,
)
from swactor.v1 import arena_pb2


def ring_request(msg: arena_pb2.LeaseRingRequest) -> RingRequest:
    spec = msg.ring_spec
    return RingRequest(
        request_id=msg.request_id,
        requester=msg.requester,
        edge_id=msg.edge_id,
        direction=msg.direction,
        data_capacity=spec.data_capacity,
        alignment=spec.alignment,
        holder_id=msg.holder_id,
        spec_direction=spec.direction,
        host_pinning=spec.host_pinning,
        wake_coalescing=spec.wake_coalescing,
        prefault=msg.prefault,
    )


def lease_update(ev: LeaseQueued | RingLeased | LeaseRejected | LeaseCancelled) -> arena_pb2.LeaseRingUpdate:
    rid = ev.request.request_id
    match ev:
        case LeaseQueued():
            return arena_pb2.LeaseRingUpdate(
                queued=arena_pb2.LeaseQueued(request_id=rid, position=ev.position, needed_bytes=ev.needed)
            )
        case RingLeased():
            return arena_pb2.LeaseRingUpdate(
                leased=arena_pb2.RingLeased(
                    request_id=rid, edge_id=ev.request.edge_id, layout=ev.layout.to_pb()
                )
            )
        case LeaseRejected():
            return arena_pb2.LeaseRingUpdate(
                rejected=arena_pb2.RingLeaseRejected(request_id=rid, reason=int(ev.reason), detail=ev.detail)
            )
        case LeaseCancelled():
            return arena_pb2.LeaseRingUpdate(
                cancelled=arena_pb2.LeaseCancelled(request_id=rid, reason=int(ev.reason))
            )


def _lease_info(info: LeaseInfo) -> arena_pb2.ArenaLeaseInfo:
    r = info.request
    return arena_pb2.ArenaLeaseInfo(
        ring_id=info.ring_id,
        request_id=r.request_id,
        requester=r.requester,
        edge_id=r.edge_id,
        direction=r.direction,
        owner_holder_id=r.holder_id,
        owner_pid=info.owner_pid,
        owner_holds=info.owner_holds,
        attached_holder_ids=list(info.attached_holder_ids),
        layout=info.layout.to_pb(),
    )


def _queued(q: Pending, now: float) -> arena_pb2.ArenaQueuedLease:
    return arena_pb2.ArenaQueuedLease(
        **q.request.identity(), needed_bytes=q.needed, queued_seconds=max(0.0, now - q.queued_at)
    )


def _holder(h: Holder) -> arena_pb2.ArenaHolderInfo:
    return arena_pb2.ArenaHolderInfo(holder_id=h.holder_id, pid=h.pid, uid=h.uid, connected=h.connected)


STATE_TO_PB = {
    "booting": arena_pb2.ARENA_STATE_BOOTING,
    "ready": arena_pb2.ARENA_STATE_READY,
    "failed": arena_pb2.ARENA_STATE_FAILED,
    "shutting_down": arena_pb2.ARENA_STATE_SHUTTING_DOWN,
}


def stats_to_pb(st: Stats, now: float) -> arena_pb2.ArenaStats:
    return arena_pb2.ArenaStats(
        state=STATE_TO_PB[st.state.value],
        ceiling_bytes=st.ceiling,
        leased_bytes=st.leased_bytes,
        free_bytes=st.free_bytes,
        largest_free_range=st.largest_free_range,
        free_ranges=st.free_ranges,
        leases=[_lease_info(i) for i in st.leases],
        queued=[_queued(q, now) for q in st.queued],
        holders=[_holder(h) for h in st.holders],
    )
