"""ProvisionStage (stage.proto) -> StagePlan: every check a node makes before accepting a plan (§12, §39).

A plan that does not fit this node or is internally inconsistent is refused with the field named;
it never reaches the StageController.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swactor.common.control_tls import orchestrator_name
from swactor.common.objflags import MAX_PREFILL_CHUNK
from swactor.distribution.request import FetchRequest
from swactor.edgeend.establisher import EdgeProvision
from swactor.edgeend.objects import ObjSpec
from swactor.modelfile.memory import DEFAULT_KV_DTYPE, KV_DTYPE_BYTES, MAX_RUN_SLOTS
from swactor.v1 import common_pb2, stage_pb2
from swactor.worker.stage_fsm import INPUT_PORT, OUTPUT_PORT, StagePlan

_KIND = {common_pb2.OBJECT_KIND_TOKENS: "Tokens", common_pb2.OBJECT_KIND_ACTIVATIONS: "Activations",
         common_pb2.OBJECT_KIND_WEIGHTS: "Weights"}
_FAMILY = {common_pb2.DTYPE_FAMILY_FLOAT: "Float", common_pb2.DTYPE_FAMILY_INT: "Int",
           common_pb2.DTYPE_FAMILY_UINT: "Uint", common_pb2.DTYPE_FAMILY_BFLOAT: "Bfloat"}
TOKEN_BYTES = 4


class PlanRejected(ValueError):
    """The plan is refused; `field` names what was wrong."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


def _require(ok: bool, field: str, detail: str) -> None:
    if not ok:
        raise PlanRejected(field, detail)


def obj_spec(field: str, spec: common_pb2.ObjectSpec) -> ObjSpec:
    _require(spec.kind in _KIND, f"{field}.kind", "must be TOKENS, ACTIVATIONS or WEIGHTS")
    _require(spec.dtype_family in _FAMILY, f"{field}.dtype_family", "is unspecified")
    _require(spec.sequence_policy == common_pb2.SEQUENCE_POLICY_STRICTLY_CONSECUTIVE, f"{field}.sequence_policy",
             "only STRICTLY_CONSECUTIVE is supported")
    _require(spec.dtype_width_bytes > 0 and spec.row_elements > 0, f"{field}", "dtype_width_bytes and row_elements must be > 0")
    _require(spec.alignment > 0 and spec.alignment & (spec.alignment - 1) == 0, f"{field}.alignment",
             f"{spec.alignment} is not a power of two")
    row = spec.dtype_width_bytes * spec.row_elements
    _require(spec.max_extent >= row, f"{field}.max_extent", f"{spec.max_extent} is smaller than one row ({row} B)")
    return ObjSpec(_KIND[spec.kind], spec.max_extent, _FAMILY[spec.dtype_family], spec.dtype_width_bytes,
                        spec.row_elements, spec.alignment)


def _edge_spec_checks(field: str, kind: int, spec: common_pb2.ObjectSpec, req: stage_pb2.ProvisionStageRequest) -> None:
    m = req.model
    if kind in (common_pb2.EDGE_KIND_TOKEN_IN, common_pb2.EDGE_KIND_TOKEN_OUT):
        _require(spec.kind == common_pb2.OBJECT_KIND_TOKENS and spec.dtype_family == common_pb2.DTYPE_FAMILY_INT
                 and spec.dtype_width_bytes == TOKEN_BYTES and spec.row_elements == 1, f"{field}.object_spec",
                 "token edges carry int32 token ids, one per row")
    else:
        _require(spec.kind == common_pb2.OBJECT_KIND_ACTIVATIONS and spec.dtype_family == common_pb2.DTYPE_FAMILY_FLOAT
                 and spec.dtype_width_bytes == 4 and spec.row_elements == m.hidden_dim, f"{field}.object_spec",
                 f"activation edges carry float32 rows of hidden_dim={m.hidden_dim}")
        _require(spec.max_extent <= m.max_seq_len * m.hidden_dim * 4, f"{field}.object_spec.max_extent",
                 "exceeds max_seq_len * hidden_dim * dtype_width_bytes (§17)")


def _ring(field: str, spec: common_pb2.RingSpec, direction: int) -> None:
    _require(spec.direction == direction, f"{field}.ring_spec.direction",
             f"must be {common_pb2.RingDirection.Name(direction)}")
    _require(spec.data_capacity > 0, f"{field}.ring_spec.data_capacity", "must be > 0")


def _hex64(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _weights_fetch(req: stage_pb2.ProvisionStageRequest) -> FetchRequest:
    """The url variant of gguf_source: the stage fetches its ranges from the orchestrator's model server (or from
    the model's own source_url, falling back to the server)."""
    src = req.gguf_source
    _require(not src.path, "gguf_source", "set either path or url, not both")
    _require(src.url.startswith("https://"), "gguf_source.url", "must be an https:// URL of the orchestrator's model server")
    _require(_hex64(src.sha256), "gguf_source.sha256", "must be 64 lowercase hex digits with a url")
    _require(_hex64(src.manifest_sha256), "gguf_source.manifest_sha256", "must be 64 lowercase hex digits with a url")
    _require(src.size > 0, "gguf_source.size", "must be > 0 with a url")
    _require(not src.source_url or src.source_url.startswith(("http://", "https://")), "gguf_source.source_url",
             f"must be empty or the model's http(s):// URL, not {src.source_url[:80]!r}")
    return FetchRequest(url=src.url, sha256=src.sha256, size=src.size, manifest_sha256=src.manifest_sha256,
                        layer_start=req.layer_start, layer_end=req.layer_end_exclusive, num_layers=req.model.num_layers,
                        tls_name=orchestrator_name(req.orchestrator_node_id), source_url=src.source_url)


def build_plan(req: stage_pb2.ProvisionStageRequest, *, node_id: int, role_id: int) -> StagePlan:
    """The validated StagePlan for this node, or PlanRejected naming the field."""
    _require(req.run_id != 0, "run_id", "must be non-zero")
    _require(req.node_id == node_id, "node_id", f"plan is addressed to node {req.node_id}, this is node {node_id}")
    _require(req.stage_count > 0 and req.stage_index < req.stage_count, "stage_index",
             f"{req.stage_index} is not below stage_count {req.stage_count}")
    m = req.model
    _require(m.num_layers > 0 and m.hidden_dim > 0 and m.max_seq_len > 0, "model", "num_layers, hidden_dim and max_seq_len must be > 0")
    _require(m.dtype_family == common_pb2.DTYPE_FAMILY_FLOAT and m.dtype_width_bytes == 4, "model.dtype",
             "activations are float32 in this MVP")
    _require(req.layer_start < req.layer_end_exclusive <= m.num_layers, "layer_start/layer_end_exclusive",
             f"[{req.layer_start}, {req.layer_end_exclusive}) is not a non-empty range within {m.num_layers} layers")
    first, last = req.stage_index == 0, req.stage_index == req.stage_count - 1
    _require(first == (req.layer_start == 0), "layer_start", "only stage 0 starts at layer 0")
    _require(last == (req.layer_end_exclusive == m.num_layers), "layer_end_exclusive",
             "only the last stage ends at the last layer")
    src = req.gguf_source
    fetch = _weights_fetch(req) if src.url else None
    if fetch is None:
        _require(bool(src.path) and Path(src.path).is_absolute(), "gguf_source.path", "must be an absolute local path")
    _require(not src.sha256 or _hex64(src.sha256), "gguf_source.sha256", "must be 64 lowercase hex digits or empty")
    inb, outb = req.inbound, req.outbound
    _require(inb.edge_id != 0 and outb.edge_id != 0 and inb.edge_id != outb.edge_id, "inbound/outbound.edge_id",
             "edge ids must be non-zero and distinct")
    want_in = common_pb2.EDGE_KIND_TOKEN_IN if first else common_pb2.EDGE_KIND_ACTIVATION
    want_out = common_pb2.EDGE_KIND_TOKEN_OUT if last else common_pb2.EDGE_KIND_ACTIVATION
    _require(inb.kind == want_in, "inbound.kind", f"stage {req.stage_index} consumes {common_pb2.EdgeKind.Name(want_in)}")
    _require(outb.kind == want_out, "outbound.kind", f"stage {req.stage_index} produces {common_pb2.EdgeKind.Name(want_out)}")
    _require(outb.consumer_node_id != 0, "outbound.consumer_node_id", "must name the consumer node")
    _edge_spec_checks("inbound", inb.kind, inb.object_spec, req)
    _edge_spec_checks("outbound", outb.kind, outb.object_spec, req)
    _ring("inbound", inb.ring_spec, common_pb2.RING_DIRECTION_INGRESS)
    _ring("outbound", outb.ring_spec, common_pb2.RING_DIRECTION_EGRESS)
    in_spec, out_spec = obj_spec("inbound.object_spec", inb.object_spec), obj_spec("outbound.object_spec", outb.object_spec)
    rt = req.runtime
    sampling: dict[str, Any] = {}
    if last:
        s = rt.sampling
        _require(s.temperature >= 0 and 0 <= s.top_p <= 1, "runtime.sampling", "temperature >= 0 and top_p in [0, 1]")
        sampling = {"temperature": float(s.temperature), "top_k": int(s.top_k),
                    "top_p": float(s.top_p) if s.top_p > 0 else 1.0, "seed": int(s.seed),
                    "skip_draws": int(s.skip_draws)}
    else:
        _require(not rt.HasField("sampling"), "runtime.sampling", "only the last stage samples")
    chunk = rt.prefill_chunk or 1
    _require(chunk <= min(m.max_seq_len, MAX_PREFILL_CHUNK), "runtime.prefill_chunk",
             f"{chunk} rows: at most min(max_seq_len, {MAX_PREFILL_CHUNK})")
    # the planner counted this stage's run slots in this dtype: a value the compute core cannot keep is refused here,
    # not at the role's load
    kv_dtype = rt.kv_dtype or DEFAULT_KV_DTYPE
    _require(kv_dtype in KV_DTYPE_BYTES, "runtime.kv_dtype", f"{rt.kv_dtype!r} is not one of {', '.join(KV_DTYPE_BYTES)}")
    slots = rt.run_slots or 1
    _require(slots <= MAX_RUN_SLOTS, "runtime.run_slots", f"{slots} run slots: at most {MAX_RUN_SLOTS}")
    # With a URL the path is the weights cache's file, known once fetched; its ranges are verified piece
    # by piece, so the compute process does not hash the (sparse) file again.
    config = {"kind": "llama_stage", "gguf_path": src.path, "gguf_sha256": "" if fetch else src.sha256,
              "layer_start": req.layer_start, "layer_end": req.layer_end_exclusive, "max_seq_len": m.max_seq_len,
              "hidden_dim": m.hidden_dim, "sampling": sampling, "prefill_chunk": chunk, "kv_dtype": kv_dtype,
              "slots": slots}
    return StagePlan(
        run_id=req.run_id, stage_index=req.stage_index, stage_count=req.stage_count, role_id=rt.role_id or role_id,
        inbound=EdgeProvision(inb.edge_id, "Ingress", inb.producer_node_id, INPUT_PORT, in_spec, inb.ring_spec),
        outbound=EdgeProvision(outb.edge_id, "Egress", outb.consumer_node_id, OUTPUT_PORT, out_spec, outb.ring_spec),
        outbound_kind=outb.kind, role_config=config, fetch=fetch, trace=rt.trace_objects,
        in_row_bytes=in_spec.dtype_width_bytes * in_spec.row_elements,
        out_row_bytes=out_spec.dtype_width_bytes * out_spec.row_elements)
