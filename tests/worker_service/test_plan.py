"""ProvisionStage validation: every inconsistency is refused with the field named (§12, §39)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from swactor.v1 import common_pb2, stage_pb2
from swactor.worker.plan import PlanRejected, build_plan

from .plans import provision


def ok() -> stage_pb2.ProvisionStageRequest:
    return provision(node_id=5, orchestrator=1)


def test_valid_plans() -> None:
    p = build_plan(ok(), node_id=5, role_id=3)
    assert p.outbound_kind == common_pb2.EDGE_KIND_TOKEN_OUT and p.out_row_bytes == 4 and p.in_row_bytes == 576 * 4
    assert p.role_config["layer_start"] == 15 and p.role_config["sampling"]["temperature"] == 0.0
    first = build_plan(provision(node_id=5, orchestrator=1, stage_index=0, layers=(0, 15)), node_id=5, role_id=3)
    assert first.in_row_bytes == 4 and first.role_config["sampling"] == {}


def test_the_kv_dtype_passes_to_the_role_config() -> None:
    """The dtype the planner counted the stage's run slots in is the one its StageModel keeps; "" is float32."""
    assert build_plan(ok(), node_id=5, role_id=3).role_config["kv_dtype"] == "float32"
    for kv_dtype in ("float16", "float32"):
        r = ok()
        r.runtime.kv_dtype = kv_dtype
        assert build_plan(r, node_id=5, role_id=3).role_config["kv_dtype"] == kv_dtype
    r = ok()
    r.runtime.kv_dtype = "int8"
    with pytest.raises(PlanRejected, match=r"^runtime\.kv_dtype: 'int8' is not one of float32, float16$"):
        build_plan(r, node_id=5, role_id=3)


def mutate(fn: Callable[[stage_pb2.ProvisionStageRequest], None]) -> stage_pb2.ProvisionStageRequest:
    r = ok()
    fn(r)
    return r


@pytest.mark.parametrize(("fn", "field"), [
    (lambda r: setattr(r, "run_id", 0), "run_id"),
    (lambda r: setattr(r, "node_id", 6), "node_id"),
    (lambda r: setattr(r, "stage_index", 2), "stage_index"),
    (lambda r: setattr(r, "layer_end_exclusive", 31), "layer_start/layer_end_exclusive"),
    (lambda r: setattr(r, "layer_start", 0), "layer_start"),
    (lambda r: setattr(r, "layer_end_exclusive", 29), "layer_end_exclusive"),
    (lambda r: setattr(r.gguf_source, "path", "relative.gguf"), "gguf_source.path"),
    (lambda r: setattr(r.gguf_source, "sha256", "XYZ"), "gguf_source.sha256"),
    (lambda r: setattr(r.outbound, "edge_id", r.inbound.edge_id), "inbound/outbound.edge_id"),
    (lambda r: setattr(r.inbound, "kind", common_pb2.EDGE_KIND_TOKEN_IN), "inbound.kind"),
    (lambda r: setattr(r.outbound, "kind", common_pb2.EDGE_KIND_ACTIVATION), "outbound.kind"),
    (lambda r: setattr(r.outbound, "consumer_node_id", 0), "outbound.consumer_node_id"),
    (lambda r: setattr(r.inbound.object_spec, "row_elements", 575), "inbound.object_spec"),
    (lambda r: setattr(r.inbound.object_spec, "max_extent", 10 ** 9), "inbound.object_spec.max_extent"),
    (lambda r: setattr(r.outbound.object_spec, "dtype_width_bytes", 8), "outbound.object_spec"),
    (lambda r: setattr(r.inbound.ring_spec, "direction", common_pb2.RING_DIRECTION_EGRESS),
     "inbound.ring_spec.direction"),
    (lambda r: setattr(r.outbound.ring_spec, "data_capacity", 0), "outbound.ring_spec.data_capacity"),
    (lambda r: setattr(r.runtime.sampling, "top_p", 2.0), "runtime.sampling"),
    (lambda r: setattr(r.model, "dtype_width_bytes", 2), "model.dtype"),
    (lambda r: setattr(r.runtime, "kv_dtype", "bfloat16"), "runtime.kv_dtype"),
])
def test_rejections_name_the_field(fn: Callable[[stage_pb2.ProvisionStageRequest], None], field: str) -> None:
    with pytest.raises(PlanRejected) as info:
        build_plan(mutate(fn), node_id=5, role_id=3)
    assert info.value.field == field


def test_only_last_stage_samples() -> None:
    r = provision(node_id=5, orchestrator=1, stage_index=0, layers=(0, 15))
    r.runtime.sampling.CopyFrom(stage_pb2.StageSampling(temperature=1.0))
    with pytest.raises(PlanRejected, match=r"runtime\.sampling"):
        build_plan(r, node_id=5, role_id=3)


def with_url(**kw: object) -> stage_pb2.ProvisionStageRequest:
    r = ok()
    src = {"url": "https://10.0.0.1:7442/v1/files/" + "a" * 64, "sha256": "a" * 64, "manifest_sha256": "b" * 64,
           "size": 1000, **kw}
    r.gguf_source.CopyFrom(stage_pb2.GgufSource(**src))  # type: ignore[arg-type]
    return r


def test_a_url_source_becomes_a_fetch_of_the_stage_range() -> None:
    p = build_plan(with_url(), node_id=5, role_id=3)
    assert p.fetch is not None and (p.fetch.layer_start, p.fetch.layer_end, p.fetch.num_layers) == (15, 30, 30)
    assert p.fetch.tls_name == "orchestrator-1.swactor" and p.role_config["gguf_sha256"] == ""
    assert build_plan(ok(), node_id=5, role_id=3).fetch is None
    assert p.fetch.source_url == ""
    direct = build_plan(with_url(source_url="https://hub.example/m.gguf"), node_id=5, role_id=3).fetch
    assert direct is not None and direct.source_url == "https://hub.example/m.gguf"
    for bad, field in [({"manifest_sha256": ""}, "gguf_source.manifest_sha256"), ({"size": 0}, "gguf_source.size"),
                       ({"url": "http://x/y"}, "gguf_source.url"), ({"path": "/m.gguf"}, "gguf_source"),
                       ({"sha256": "A" * 64}, "gguf_source.sha256"), ({"source_url": "ftp://hub/m.gguf"},
                                                                      "gguf_source.source_url")]:
        with pytest.raises(PlanRejected) as e:
            build_plan(with_url(**bad), node_id=5, role_id=3)
        assert e.value.field == field, (bad, e.value)
