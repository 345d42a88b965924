"""The stage node's relay of its edges' object timings (issue 7) into the run's lifecycle events.

For one provisioned run: the local edge-driver's ObjectTimings of the stage's inbound edge (RECV
end) and outbound edge (SEND end) become EDGE_OBJECT_RECEIVED / EDGE_OBJECT_SENT events
(swactor.edge.timing_events) with the run's identities, passed to `emit` with the driver's
stamps kept. A driver port without `object_timings` (node test fakes) relays nothing; a lost
watch is logged and ends the relay (timings are diagnostics, never a reason to fault a run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swactor.common.events import get_logger
from swactor.edge.timing_events import lifecycle_events
from swactor.v1 import common_pb2, edge_pb2


async def relay_object_timings(driver: Any, *, run_id: int, node_id: int, stage_index: int, inbound_edge: int,
                               outbound_edge: int, emit: Callable[[common_pb2.LifecycleEvent], None]) -> None:
    source = getattr(driver, "object_timings", None)
    if source is None:
        return
    ends = {inbound_edge: edge_pb2.EDGE_ROLE_RECV, outbound_edge: edge_pb2.EDGE_ROLE_SEND}
    try:
        async for batch in source(set(ends)):
            if ends.get(batch.edge_id) != batch.role:
                continue  # the other end of a self edge belongs to the orchestrator
            for ev in lifecycle_events(batch, run_id=run_id, node_id=node_id, stage_index=stage_index):
                emit(ev)
    except Exception as e:  # grpc errors and a driver restart: diagnostics only
        get_logger(component="stage_node").warning("edge_timing_watch_lost", run_id=run_id, node_id=node_id,
                                                   stage_index=stage_index, detail=f"{type(e).__name__}: {e}")
