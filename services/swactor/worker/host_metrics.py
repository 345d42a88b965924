"""What a host reports for monitoring (StageControl.GetHostMetrics, docs/operations.md "Metrics").

The worker answers for its whole host: the compute steps its stages completed (counted here, one integer add and one
float add per step), the weights its fetch pool received, and, asked at that moment over their local sockets, the
arena-manager's occupancy and the edge-driver's QUIC traffic and object transfers per peer. A local service that does
not answer within `LOCAL_TIMEOUT_S` leaves its part out and is named in `errors`; the rest is still reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from swactor.v1 import arena_pb2, edge_pb2, stage_pb2

LOCAL_TIMEOUT_S = 1.0


@dataclass
class StepTotals:
    """Completed compute steps per stage index since the worker started: how many, and their seconds in all."""

    by_stage: dict[int, list[float]] = field(default_factory=dict)  # stage_index -> [count, seconds]

    def completed(self, stage_index: int, seconds: float) -> None:
        totals = self.by_stage.setdefault(stage_index, [0, 0.0])
        totals[0] += 1
        totals[1] += max(0.0, seconds)

    def protos(self) -> list[stage_pb2.StageSteps]:
        return [stage_pb2.StageSteps(stage_index=i, count=int(n), seconds=s)
                for i, (n, s) in sorted(self.by_stage.items())]


@dataclass(frozen=True)
class HostSources:
    """Where the figures come from: the local services (asked per call) and the worker's own counters."""

    node_id: int
    arena_stats: Callable[[], Awaitable[arena_pb2.ArenaStats]]
    driver_status: Callable[[], Awaitable[edge_pb2.EdgeDriverStatus]]
    weights_received: Callable[[], int]
    steps: StepTotals


async def _ask(what: Callable[[], Awaitable[object]], timeout_s: float) -> object:
    try:
        return await asyncio.wait_for(what(), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except Exception as e:  # a local service down or refusing: named in the answer, not raised
        return f"{type(e).__name__}: {e}"


async def host_metrics(src: HostSources, timeout_s: float = LOCAL_TIMEOUT_S) -> stage_pb2.HostMetrics:
    arena, edge = await asyncio.gather(_ask(src.arena_stats, timeout_s), _ask(src.driver_status, timeout_s))
    out = stage_pb2.HostMetrics(node_id=src.node_id, weights_fetched_bytes=src.weights_received(),
                                steps=src.steps.protos())
    if isinstance(arena, arena_pb2.ArenaStats):
        out.arena.ceiling_bytes, out.arena.leased_bytes = arena.ceiling_bytes, arena.leased_bytes
        out.arena.free_bytes, out.arena.leases = arena.free_bytes, len(arena.leases)
    else:
        out.errors.append(f"arena: {arena}")
    if isinstance(edge, edge_pb2.EdgeDriverStatus):
        out.traffic.extend(edge.traffic)
        out.transfers.extend(edge.transfers)
    else:
        out.errors.append(f"edge: {edge}")
    return out
