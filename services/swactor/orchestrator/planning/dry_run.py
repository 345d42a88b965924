"""What SubmitRun would do with a request on the pool as it is now: refuse it (and why), or place it (`swactor
submit --dry-run`, the Plan RPC). Pure: the membership view and the run's Demand in, answers out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.planning.placement import (
    Network,
    Placement,
    PlanError,
    Shortfall,
    place,
    pool_units,
)
from swactor.orchestrator.planning.pool import Demand, PoolStatus
from swactor.v1 import common_pb2
from swactor.v1 import orchestrator_pb2 as opb


def _place(members: Sequence[NodeInfo], demand: Demand, network: Network | None) -> Placement:
    return place(members, demand.stages, demand.num_layers, demand.node_ids, demand.memory, network, demand.ranges)


def pool_refusal(members: Sequence[NodeInfo], demand: Demand, network: Network | None = None) -> str:
    """Why SubmitRun refuses the run on this pool (FAILED_PRECONDITION), or "" when it takes it. A pinned node
    that is a member but not Available yet is waited for by the PoolReady gate, not refused here; so is a suspected
    member whose devices the run needs (SWIM suspects a healthy member when a few packets in a row are lost on a WAN
    path, and it refutes that within seconds: the gate waits up to pool_timeout_s for it)."""
    provisionable = [m for m in members if m.provisionable]
    devices = len(pool_units(provisionable))
    suspected = sum(m.devices for m in members if m.state is NodeState.SUSPECT)
    if devices < demand.stages <= devices + suspected:
        return ""
    if demand.stages > devices:
        pinned = {m.node_id: m for m in members if m.node_id in demand.node_ids and not m.provisionable}
        which = "; pinned node(s) not Available: " + ", ".join(
            f"{n} ({m.state.value}{': ' + m.reason if m.reason else ''})" for n, m in pinned.items()) if pinned else ""
        cut = "".join(f"; node {m.node_id} is unreachable: {m.unreachable}" for m in members
                      if m.unreachable and m.node_id not in pinned)
        return (f"{demand.stages} stage(s) need {demand.stages} stage device(s); the pool has {devices} on "
                f"{len(provisionable)} Available node(s) (of {len(members)} known){which}{cut}")
    known = {m.node_id for m in members if m.state is not NodeState.LEFT}
    unknown = [n for n in demand.node_ids if n not in known]
    if unknown:
        return f"node(s) {unknown} named by node_ids are not members of the pool"
    ready = {m.node_id: m for m in members if m.provisionable}
    over = [f"node {n} is named {k} times but has {ready[n].devices} stage device(s)"
            for n, k in Counter(demand.node_ids).items() if n in ready and k > ready[n].devices]
    if over:  # a node not Available yet has not said how many it has: the gate waits for it
        return "; ".join(over)
    try:
        _place(members, demand, network)
    except Shortfall as e:
        return f"{common_pb2.RunFaultReason.Name(e.reason)}: {e}"  # type: ignore[arg-type]
    except PlanError:
        pass  # pinned nodes not Available yet: the gate waits for them
    return ""


def plan_response(model: str, members: Sequence[NodeInfo], demand: Demand, status: PoolStatus, *,
                  prompt_tokens: int, max_seq_len: int, network: Network | None = None) -> opb.PlanResponse:
    """The refusal SubmitRun would give (if any), the §9 gate for this run, and the placement with per-stage bytes
    (for a memory shortfall, the closest split tried, its stages over their device's memory marked) and the RTT of
    each hop of its ring."""
    out = opb.PlanResponse(model=model, stages=demand.stages, prompt_tokens=prompt_tokens, max_seq_len=max_seq_len,
                           refusal=pool_refusal(members, demand, network), pool_ready=status.ready, pool_detail=status.detail,
                           memory_known=demand.memory is not None,
                           max_slots_per_stage=demand.memory.max_slots if demand.memory is not None else 0,
                           kv_dtype=demand.memory.kv_dtype if demand.memory is not None else "")
    try:
        placement = _place(members, demand, network)
    except Shortfall as e:
        placement = e.placement
    except PlanError as e:
        out.placement_detail = str(e)
        return out
    out.split = placement.split
    if (per_token := placement.compute_ms_per_token()) is not None:
        out.compute_ms_per_token = per_token
    if (predicted := placement.predicted_ms_per_token()) is not None:
        out.predicted_ms_per_token = predicted
    over = set(placement.over())
    for k, (node, (lo, hi)) in enumerate(zip(placement.nodes, placement.ranges, strict=True)):
        stage = opb.PlannedStage(stage_index=k, node_id=node.node_id, device_index=node.device, layer_start=lo,
                                 layer_end_exclusive=hi, node_memory_bytes=node.memory_bytes, fits=k not in over,
                                 ms_per_layer=node.ms_per_layer)
        if placement.needs:  # the work is counted from the model's weights only when its memory is known
            stage.compute_layers = placement.work[k]
        if (compute := placement.compute_ms(k)) is not None:
            stage.compute_ms = compute
        if placement.needs:
            need = placement.needs[k]
            stage.weights_bytes, stage.kv_cache_bytes = need.weights, need.kv_cache
            stage.scratch_bytes, stage.runtime_bytes, stage.total_bytes = need.scratch, need.runtime, need.total
            if placement.slots[k] is not None:
                stage.run_slots = placement.slots[k]
        out.placement.append(stage)
    if network is not None:
        ids = [n.node_id for n in placement.nodes]
        out.orchestrator_node_id = network.origin
        out.hop_rtt_ms.extend(-1.0 if h is None else h for h in network.ring(ids))
        if (one_way := network.one_way_ms(ids)) is not None:
            out.network_ms_per_token = one_way
    return out
