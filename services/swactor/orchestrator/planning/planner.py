"""Run planning (spec §11): one RunPlan from model facts, the ready pool and the requested stages.

Pure functions: `plan_run` builds the plan on a placement (placement.py: nodes, block ranges, memory fit) and
`validate_plan` checks every §11 guarantee before anything is provisioned; both raise PlanError with a reason a
person can act on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from swactor.common.ids import new_id
from swactor.common.objflags import MAX_DRAFT
from swactor.common.sampling import SamplingPolicy
from swactor.modelfile.memory import DEFAULT_KV_DTYPE, StageBytes
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.models.gguf_model import ModelFacts
from swactor.orchestrator.planning.placement import (
    DEFAULT_MAX_SLOTS_PER_STAGE,
    MemoryNeed,
    Placement,
    PlanError,
    place,
)
from swactor.v1 import common_pb2

OBJECT_ALIGNMENT = 64
RING_ALIGNMENT = 64
TOKEN_BYTES = 4  # token ids travel as int32
OBJECT_HEADER_BYTES = 64  # room for one §17 ObjectHeader (40 bytes) rounded to the alignment


@dataclass(frozen=True)
class Endpoint:
    node_id: int
    stage_index: int | None  # None: the orchestrator's token endpoint


@dataclass(frozen=True)
class EdgePlan:
    edge_id: int
    kind: int  # common_pb2.EdgeKind
    producer: Endpoint
    consumer: Endpoint
    object_spec: common_pb2.ObjectSpec
    ring_data_capacity: int

    def ring_spec(self, direction: int) -> common_pb2.RingSpec:
        """The RingSpec for one end: EGRESS at the producer, INGRESS at the consumer."""
        return common_pb2.RingSpec(
            data_capacity=self.ring_data_capacity,
            alignment=RING_ALIGNMENT,
            direction=direction,  # type: ignore[arg-type]
            host_pinning=common_pb2.HOST_PINNING_PAGEABLE,
            wake_coalescing=common_pb2.WAKE_COALESCING_PENDING_BIT,
        )


@dataclass(frozen=True)
class StagePlan:
    stage_index: int
    stage_count: int
    node: NodeInfo
    layer_start: int
    layer_end_exclusive: int
    inbound_edge: int
    outbound_edge: int
    role_id: int
    memory: StageBytes | None = None  # the estimate the placement checked (None: the model's memory is unknown)
    # Runs whose KV caches fit on the node at once (placement.run_slots; None: unknown, see RunPlan.slots).
    run_slots: int | None = None
    # Its decode work in layers (Placement.work; 0.0: not known, the worker counts its blocks): the worker measures
    # its host's time per layer of a decode step against it (ProvisionStage runtime.compute_layers).
    compute_layers: float = 0.0

    @property
    def node_id(self) -> int:
        return self.node.node_id

    @property
    def device(self) -> int:
        """Which of its node's stage devices computes the stage (ProvisionStageRequest.device_index)."""
        return self.node.device

    def counters(self) -> dict[str, int]:
        """Its blocks (and device, on a node with several), and the memory the placement estimated against what its
        node advertised per device (provisioning event)."""
        out = {"layer_start": self.layer_start, "layer_end": self.layer_end_exclusive}
        if self.node.devices > 1:
            out["device"] = self.device
        if self.memory is not None:
            out |= {"memory_bytes": self.memory.total, "node_memory_bytes": self.node.memory_bytes}
        if self.node.ms_per_layer:  # the speed the split was chosen by, and the decode step it predicts here
            out["step_us_per_layer"] = round(self.node.ms_per_layer * 1000)
            if self.compute_layers:
                out["compute_us"] = round(self.node.ms_per_layer * 1000 * self.compute_layers)
        return out


@dataclass(frozen=True)
class Seat:
    """One stage's place in a pipeline: its node and device, its blocks and the run slots it holds. Runs in flight
    share a stage's resident weights only when their plans agree on every seat (docs/runs-in-flight.md "Admission")."""

    node_id: int
    layer_start: int
    layer_end_exclusive: int
    run_slots: int
    device: int = 0


@dataclass(frozen=True)
class RunPlan:
    run_id: int
    model: ModelFacts
    max_seq_len: int
    orchestrator_node_id: int
    stages: tuple[StagePlan, ...]
    edges: tuple[EdgePlan, ...]
    max_tokens: int
    sampling: SamplingPolicy
    prompt_tokens: int
    prefill_chunk: int = 0  # tokens per prompt chunk object (docs/orchestrator.md "Prefill chunks"), stages compile for
    # it; 0: the prompt is one object and stages run it row by row
    trace_objects: bool = False  # stages report per-object events (SubmitRunRequest.trace_objects)
    kv_dtype: str = DEFAULT_KV_DTYPE  # the stages' KV cache dtype ([orchestrator].kv_dtype), as placement counted it
    max_slots_per_stage: int = DEFAULT_MAX_SLOTS_PER_STAGE  # [orchestrator].max_slots_per_stage, as placement capped
    ring_rtt_ms: float = 0.0  # the token ring's measured round trip at plan time (Placement.ring_ms; 0: unknown)

    @property
    def prompt_chunks(self) -> int:
        """The prompt's chunk objects (prefill_chunk tokens each; one object when 0)."""
        return -(-self.prompt_tokens // self.prefill_chunk) if self.prefill_chunk else 1

    def slots(self, stage: StagePlan) -> int:
        """The runs `stage` holds at once (its KV cache slots): what the stage is told (StageRuntimeFacts.run_slots)
        and what admission fills. A node whose memory is unknown is given max_slots_per_stage, as placement would
        give one with room for them."""
        return stage.run_slots if stage.run_slots is not None else self.max_slots_per_stage

    def seats(self) -> tuple[Seat, ...]:
        """Where each stage sits: what every run sharing these stages' resident weights must agree on."""
        return tuple(Seat(s.node_id, s.layer_start, s.layer_end_exclusive, self.slots(s), s.device) for s in self.stages)

    def edge(self, edge_id: int) -> EdgePlan:
        for e in self.edges:
            if e.edge_id == edge_id:
                return e
        raise KeyError(edge_id)

    @property
    def token_in(self) -> EdgePlan:
        return self.edge(self.stages[0].inbound_edge)

    @property
    def token_out(self) -> EdgePlan:
        return self.edge(self.stages[-1].outbound_edge)


def run_max_seq_len(model: ModelFacts, cap: int) -> int:
    return min(model.max_seq_len, cap)


def memory_need(model: ModelFacts, max_seq_len_cap: int, max_slots: int = DEFAULT_MAX_SLOTS_PER_STAGE,
                kv_dtype: str = DEFAULT_KV_DTYPE) -> MemoryNeed | None:
    """What placement checks stages against: the model's memory profile at the run's context, the most run slots
    a stage is given and the KV cache dtype a slot is counted in (None: the model's memory is unknown)."""
    if model.memory is None:
        return None
    return MemoryNeed(model.memory, run_max_seq_len(model, max_seq_len_cap), max_slots, kv_dtype)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def activation_spec(model: ModelFacts, max_seq_len: int) -> common_pb2.ObjectSpec:
    return common_pb2.ObjectSpec(
        kind=common_pb2.OBJECT_KIND_ACTIVATIONS,
        max_extent=max_seq_len * model.hidden_dim * model.dtype_width_bytes,
        dtype_family=model.dtype_family,  # type: ignore[arg-type]
        dtype_width_bytes=model.dtype_width_bytes,
        row_elements=model.hidden_dim,
        alignment=OBJECT_ALIGNMENT,
        sequence_policy=common_pb2.SEQUENCE_POLICY_STRICTLY_CONSECUTIVE,
    )


def token_spec(max_tokens_per_object: int) -> common_pb2.ObjectSpec:
    return common_pb2.ObjectSpec(
        kind=common_pb2.OBJECT_KIND_TOKENS,
        max_extent=max_tokens_per_object * TOKEN_BYTES,
        dtype_family=common_pb2.DTYPE_FAMILY_INT,
        dtype_width_bytes=TOKEN_BYTES,
        row_elements=1,
        alignment=TOKEN_BYTES,
        sequence_policy=common_pb2.SEQUENCE_POLICY_STRICTLY_CONSECUTIVE,
    )


def ring_capacity(spec: common_pb2.ObjectSpec, ceiling: int) -> int:
    """A transfer window that holds one whole object when it fits under `ceiling` (objects may be
    larger than the ring, spec §34), never below 64 KiB, in 4 KiB pages."""
    want = _round_up(spec.max_extent + OBJECT_HEADER_BYTES, 4096)
    return max(65536, min(want, _round_up(ceiling, 4096)))


def plan_run(
    *,
    run_id: int,
    model: ModelFacts,
    pool: Sequence[NodeInfo],
    stages: int,
    max_tokens: int,
    prompt_tokens: int,
    sampling: SamplingPolicy,
    orchestrator_node_id: int,
    max_seq_len_cap: int = 4096,
    ring_ceiling_bytes: int = 4 << 20,
    node_ids: Sequence[int] = (),
    id_source: Callable[[], int] = new_id,
    placement: Placement | None = None,
    max_slots_per_stage: int = DEFAULT_MAX_SLOTS_PER_STAGE,
    kv_dtype: str = DEFAULT_KV_DTYPE,
) -> RunPlan:
    """The plan on `placement` (the PoolReady gate's, counted in the same kv_dtype), else on a placement made here
    from the ready pool (`node_ids` pinned in their order). The stages are told kv_dtype: they keep the KV cache the
    planner counted."""
    if max_tokens <= 0:
        raise PlanError(f"max_tokens must be positive, got {max_tokens}", common_pb2.RUN_FAULT_MODEL_REFUSED)
    max_seq_len = run_max_seq_len(model, max_seq_len_cap)
    if prompt_tokens <= 0:
        raise PlanError("the prompt has no tokens", common_pb2.RUN_FAULT_MODEL_REFUSED)
    if prompt_tokens >= max_seq_len:
        raise PlanError(
            f"prompt is {prompt_tokens} tokens; the run's context holds {max_seq_len}",
            common_pb2.RUN_FAULT_MODEL_REFUSED,
        )
    if placement is None:
        placement = place(pool, stages, model.num_layers, node_ids,
                          memory_need(model, max_seq_len_cap, max_slots_per_stage, kv_dtype))
    chosen, ranges = placement.nodes, placement.ranges
    if len(chosen) != stages or len(ranges) != stages:
        raise PlanError(f"the placement has {len(chosen)} stage device(s) and {len(ranges)} range(s) for {stages} stage(s)")

    orch = Endpoint(orchestrator_node_id, None)
    tokens_in = token_spec(max_seq_len)
    tokens_out = token_spec(1 + MAX_DRAFT)  # one token, or one per row of drafts (objflags.VERIFY)
    acts = activation_spec(model, max_seq_len)
    edge_ids = [id_source() for _ in range(stages + 1)]
    edges: list[EdgePlan] = []
    for k in range(stages + 1):
        if k == 0:
            kind, prod, spec = common_pb2.EDGE_KIND_TOKEN_IN, orch, tokens_in
        else:
            prod = Endpoint(chosen[k - 1].node_id, k - 1)
            kind = common_pb2.EDGE_KIND_TOKEN_OUT if k == stages else common_pb2.EDGE_KIND_ACTIVATION
            spec = tokens_out if k == stages else acts
        cons = orch if k == stages else Endpoint(chosen[k].node_id, k)
        edges.append(EdgePlan(edge_ids[k], kind, prod, cons, spec, ring_capacity(spec, ring_ceiling_bytes)))
    stage_plans = tuple(
        StagePlan(k, stages, chosen[k], lo, hi, edge_ids[k], edge_ids[k + 1], id_source(),
                  placement.needs[k] if placement.needs else None, placement.slots[k] if placement.slots else None,
                  placement.work[k] if placement.work else 0.0)
        for k, (lo, hi) in enumerate(ranges)
    )
    plan = RunPlan(
        run_id=run_id,
        model=model,
        max_seq_len=max_seq_len,
        orchestrator_node_id=orchestrator_node_id,
        stages=stage_plans,
        edges=tuple(edges),
        max_tokens=max_tokens,
        sampling=sampling,
        prompt_tokens=prompt_tokens,
        kv_dtype=kv_dtype,
        max_slots_per_stage=max_slots_per_stage,
        ring_rtt_ms=placement.ring_ms,
    )
    validate_plan(plan)
    return plan


def validate_plan(plan: RunPlan) -> None:
    """Every §11 guarantee, checked before provisioning; raises PlanError naming the broken one."""
    n = len(plan.stages)
    if n == 0:
        raise PlanError("plan has no stages", common_pb2.RUN_FAULT_MODEL_REFUSED)
    expect = 0
    for k, s in enumerate(plan.stages):
        if s.stage_index != k or s.stage_count != n:
            raise PlanError(f"stage {k}: index/count {s.stage_index}/{s.stage_count} do not match position {k}/{n}")
        if s.layer_start != expect:
            raise PlanError(f"stage {k}: layers start at {s.layer_start}, expected {expect} (gap or overlap)")
        if s.layer_end_exclusive <= s.layer_start:
            raise PlanError(f"stage {k}: empty layer range {s.layer_start}..{s.layer_end_exclusive}")
        expect = s.layer_end_exclusive
        if s.node_id == 0:
            raise PlanError(f"stage {k}: node id 0 is not a node")
    if expect != plan.model.num_layers:
        raise PlanError(f"layer ranges end at {expect}, the model has {plan.model.num_layers} blocks")
    nodes = [s.node_id for s in plan.stages]
    units = [s.node.unit for s in plan.stages]
    if len(set(units)) != n:
        raise PlanError(f"a stage device holds more than one stage: {units} ((node, device) per stage)")
    taken: dict[int, int] = {}
    for k, s in enumerate(plan.stages):
        if not 0 <= s.device < max(1, s.node.devices):
            raise PlanError(f"stage {k}: node {s.node_id} has {s.node.devices} stage device(s), not device {s.device}")
        # a node's stages are on its devices 0, 1, ... in stage order: what run records and dry runs show them by
        expect_device = taken[s.node_id] = taken.get(s.node_id, -1) + 1
        if s.device != expect_device:
            raise PlanError(f"stage {k}: node {s.node_id} device {s.device}, expected device {expect_device} (a "
                            "node's stages take its devices 0, 1, ... in stage order)")
    ids = [e.edge_id for e in plan.edges]
    if len(set(ids)) != len(ids) or 0 in ids:
        raise PlanError(f"edge ids are not unique non-zero values: {ids}")
    if len(plan.edges) != n + 1:
        raise PlanError(f"a {n}-stage pipeline needs {n + 1} edges, plan has {len(plan.edges)}")
    orch = Endpoint(plan.orchestrator_node_id, None)
    for k, e in enumerate(plan.edges):
        want_kind = (
            common_pb2.EDGE_KIND_TOKEN_IN if k == 0 else common_pb2.EDGE_KIND_TOKEN_OUT if k == n else common_pb2.EDGE_KIND_ACTIVATION
        )
        want_prod = orch if k == 0 else Endpoint(nodes[k - 1], k - 1)
        want_cons = orch if k == n else Endpoint(nodes[k], k)
        if (e.kind, e.producer, e.consumer) != (want_kind, want_prod, want_cons):
            raise PlanError(f"edge {k} ({e.edge_id}) has the wrong kind or endpoints")
        spec = e.object_spec
        row_bytes = spec.row_elements * spec.dtype_width_bytes
        if spec.max_extent == 0 or row_bytes == 0 or spec.max_extent % row_bytes:
            raise PlanError(f"edge {e.edge_id}: max_extent {spec.max_extent} is not a whole number of {row_bytes}-byte rows")
        if e.ring_data_capacity <= 0 or e.ring_data_capacity % RING_ALIGNMENT:
            raise PlanError(f"edge {e.edge_id}: ring capacity {e.ring_data_capacity} is not a positive multiple of {RING_ALIGNMENT}")
    for k, s in enumerate(plan.stages):
        if (s.inbound_edge, s.outbound_edge) != (ids[k], ids[k + 1]):
            raise PlanError(f"stage {k}: inbound/outbound edges do not match the edge list")
    acts = [e for e in plan.edges if e.kind == common_pb2.EDGE_KIND_ACTIVATION]
    for e in acts:
        want = plan.max_seq_len * plan.model.hidden_dim * plan.model.dtype_width_bytes
        if e.object_spec.max_extent != want:
            raise PlanError(f"edge {e.edge_id}: activation max_extent {e.object_spec.max_extent} != {want}")
