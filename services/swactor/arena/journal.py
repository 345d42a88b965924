"""Core events -> structured log events (spec §40), and the human STATUS= line for systemd.

Every lease-related event carries ring_id (0 while none exists yet), edge_id, requester,
request_id and holder_id; reasons are the stable proto enum names.
"""

from __future__ import annotations

from typing import Any

import structlog

from swactor.arena import model
from swactor.common.events import get_logger
from swactor.v1 import arena_pb2


def log() -> structlog.typing.FilteringBoundLogger:
    """Resolved at each use: a logger bound at import time would miss configure_logging()."""
    return get_logger(component="COMPONENT_ARENA")


def _ids(req: model.RingRequest, ring_id: int = 0) -> dict[str, Any]:
    return {"ring_id": ring_id, **req.identity()}


def emit(ev: model.Event) -> None:
    match ev:
        case model.LeaseQueued(request=r):
            log().info("ring_lease_queued", **_ids(r), position=ev.position, needed_bytes=ev.needed)
        case model.RingLeased(request=r, layout=lay):
            log().info(
                "ring_leased",
                **_ids(r, lay.ring_id),
                arena_offset=lay.arena_offset,
                total_len=lay.total_len,
                data_capacity=lay.data_capacity,
                direction=r.direction,
            )
        case model.LeaseRejected(request=r):
            reason = arena_pb2.LeaseRejectReason.Name(int(ev.reason))
            log().warning("ring_lease_rejected", **_ids(r), reason=reason, detail=ev.detail)
        case model.LeaseCancelled(request=r):
            log().info(
                "ring_lease_cancelled", **_ids(r), reason=arena_pb2.LeaseCancelReason.Name(int(ev.reason))
            )
        case model.RingReleased(request=r):
            log().info(
                "ring_released", **_ids(r, ev.ring_id), proof=arena_pb2.ReleaseProof.Name(int(ev.proof))
            )
        case model.RingReclaimed(request=r):
            log().info(
                "ring_reclaimed",
                **_ids(r, ev.ring_id),
                cause=ev.cause.name,
                arena_offset=ev.range.offset,
                length=ev.range.length,
            )
        case model.RingAttached(request=r):
            log().info(
                "ring_attached",
                **_ids(r, ev.ring_id),
                attached_holder_id=ev.holder_id,
                role=arena_pb2.AttachRole.Name(int(ev.role)),
            )
        case model.RingDetached(request=r):
            proof = "HOLDER_EXITED" if ev.proof is None else arena_pb2.DetachProof.Name(int(ev.proof))
            log().info("ring_detached", **_ids(r, ev.ring_id), attached_holder_id=ev.holder_id, proof=proof)
        case model.HolderJoined(holder=h):
            log().info("arena_holder_joined", holder_id=h.holder_id, pid=h.pid, uid=h.uid)
        case model.HolderDisconnected(holder=h):
            log().info("arena_holder_disconnected", holder_id=h.holder_id, pid=h.pid)
        case model.HolderGone(holder=h):
            log().info("arena_holder_gone", holder_id=h.holder_id, pid=h.pid)
        case model.StateChanged():
            log().info("arena_state_changed", old=ev.old.value, new=ev.new.value, detail=ev.detail)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def status_line(st: model.Stats, allocated: int | None = None) -> str:
    """What `systemctl status swactor-arena` shows, e.g.
    'ready: 3 leases, 192.0 MiB leased, 63.8 GiB free (largest 63.8 GiB), 1 queued, 2 holders'."""
    parts = [
        f"{len(st.leases)} lease{'s' * (len(st.leases) != 1)}",
        f"{human_bytes(st.leased_bytes)} leased",
        f"{human_bytes(st.free_bytes)} free (largest {human_bytes(st.largest_free_range)})",
        f"{len(st.queued)} queued",
        f"{len(st.holders)} holder{'s' * (len(st.holders) != 1)}",
    ]
    if allocated is not None:
        parts.append(f"{human_bytes(allocated)} resident")
    return f"{st.state.value.replace('_', ' ')}: " + ", ".join(parts)
