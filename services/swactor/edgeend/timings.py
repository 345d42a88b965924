"""ObjectTimings batches (WatchEdges with object_timings) as run lifecycle events (issue 7).

Whoever owns the run's end of an edge on a host (the stage node for its inbound RECV and
outbound SEND end, the orchestrator for token-in SEND and token-out RECV) subscribes to its local
driver and relays these with the run's identities:

  EDGE_OBJECT_SENT      time_us = the object's last byte handed to QUIC;
                        counters picked_us (first byte read from the egress ring), extent
  EDGE_OBJECT_RECEIVED  time_us = its last byte committed into the ingress ring;
                        counters arrived_us (last byte arrived from QUIC), first_us, extent

Stamps are the driver host's wall clock; across hosts they compare only as well as the clocks agree.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from swactor.v1 import common_pb2, edge_pb2, edge_pb2_grpc


def lifecycle_events(batch: edge_pb2.ObjectTimings, *, run_id: int, node_id: int,
                     stage_index: int | None) -> list[common_pb2.LifecycleEvent]:
    sent = batch.role == edge_pb2.EDGE_ROLE_SEND
    out = []
    for m in batch.objects:
        ev = common_pb2.LifecycleEvent(
            kind=common_pb2.EDGE_OBJECT_SENT if sent else common_pb2.EDGE_OBJECT_RECEIVED,
            run_id=run_id, node_id=node_id, edge_id=batch.edge_id, ring_id=batch.ring_id, object_id=m.object_id,
            sequence=m.sequence, component=common_pb2.COMPONENT_EDGE_DRIVER,
            time_us=m.last_us if sent else m.committed_us)
        if stage_index is not None:
            ev.stage_index = stage_index
        if sent:
            ev.counters.update({"picked_us": m.first_us, "extent": m.extent})
        else:
            ev.counters.update({"arrived_us": m.last_us, "first_us": m.first_us, "extent": m.extent})
        out.append(ev)
    return out


async def watch_object_timings(stub: edge_pb2_grpc.EdgeDriverStub,
                               edge_ids: set[int]) -> AsyncIterator[edge_pb2.ObjectTimings]:
    """The driver's ObjectTimings batches for `edge_ids` (its coarse events are skipped)."""
    req = edge_pb2.WatchEdgesRequest(edge_ids=sorted(edge_ids), object_timings=True)
    async for ev in stub.WatchEdges(req):
        if ev.WhichOneof("event") == "objects":
            yield ev.objects


async def relay_object_timings(driver: Any, ends: dict[int, int], *, run_id: int, node_id: int, stage_index: int | None,
                               emit: Callable[[common_pb2.LifecycleEvent], None], log: Any) -> None:
    """Relay the local driver's timings of this host's run ends (`ends`: edge id -> the role of the end owned here)
    as lifecycle events until the watch ends. A driver port without `object_timings` (test fakes) relays nothing; a
    lost watch is logged and ends the relay: timings are diagnostics, never a reason to fault a run."""
    source = getattr(driver, "object_timings", None)
    if source is None:
        return
    try:
        async for batch in source(set(ends)):
            if ends.get(batch.edge_id) != batch.role:
                continue  # the other end of an edge whose two ends are on this host: its owner relays it
            for ev in lifecycle_events(batch, run_id=run_id, node_id=node_id, stage_index=stage_index):
                emit(ev)
    except Exception as e:  # grpc errors, a driver restart
        log.warning("edge_timing_watch_lost", run_id=run_id, node_id=node_id, stage_index=stage_index,
                    detail=f"{type(e).__name__}: {e}")
