"""ProvisionStage requests for tests: a linear plan over the default model's 30 layers."""

from __future__ import annotations

from swactor.v1 import common_pb2, stage_pb2

MODEL = "/work/main/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
HIDDEN = 576
LAYERS = 30


def token_spec(max_tokens: int = 64) -> common_pb2.ObjectSpec:
    return common_pb2.ObjectSpec(kind=common_pb2.OBJECT_KIND_TOKENS, max_extent=max_tokens * 4,
                                 dtype_family=common_pb2.DTYPE_FAMILY_INT, dtype_width_bytes=4, row_elements=1,
                                 alignment=4, sequence_policy=common_pb2.SEQUENCE_POLICY_STRICTLY_CONSECUTIVE)


def act_spec(max_seq: int, hidden: int = HIDDEN) -> common_pb2.ObjectSpec:
    return common_pb2.ObjectSpec(kind=common_pb2.OBJECT_KIND_ACTIVATIONS, max_extent=max_seq * hidden * 4,
                                 dtype_family=common_pb2.DTYPE_FAMILY_FLOAT, dtype_width_bytes=4,
                                 row_elements=hidden, alignment=4,
                                 sequence_policy=common_pb2.SEQUENCE_POLICY_STRICTLY_CONSECUTIVE)


def ring(direction: int, capacity: int = 1 << 16) -> common_pb2.RingSpec:
    return common_pb2.RingSpec(data_capacity=capacity, alignment=64, direction=direction)  # type: ignore[arg-type]


def provision(*, node_id: int, orchestrator: int, run_id: int = 77, stage_index: int = 1, stage_count: int = 2,
              layers: tuple[int, int] = (15, 30), in_edge: int = 101, out_edge: int = 102, max_seq: int = 64,
              path: str = MODEL, sha256: str = "", peer: int | None = None, prefill_chunk: int = 0,
              trace: bool = False, role_id: int = 9, run_slots: int = 0) -> stage_pb2.ProvisionStageRequest:
    """`peer`: the node on the other end of both edges (default: the orchestrator for token edges, 500/600)."""
    first, last = stage_index == 0, stage_index == stage_count - 1
    req = stage_pb2.ProvisionStageRequest(
        run_id=run_id, node_id=node_id, orchestrator_node_id=orchestrator, stage_index=stage_index,
        stage_count=stage_count, gguf_source=stage_pb2.GgufSource(path=path, sha256=sha256),
        layer_start=layers[0], layer_end_exclusive=layers[1],
        inbound=stage_pb2.InboundEdgeProvision(
            edge_id=in_edge, kind=common_pb2.EDGE_KIND_TOKEN_IN if first else common_pb2.EDGE_KIND_ACTIVATION,
            producer_node_id=peer or (orchestrator if first else 500),
            object_spec=token_spec() if first else act_spec(max_seq),
            ring_spec=ring(common_pb2.RING_DIRECTION_INGRESS)),
        outbound=stage_pb2.OutboundEdgeProvision(
            edge_id=out_edge, kind=common_pb2.EDGE_KIND_TOKEN_OUT if last else common_pb2.EDGE_KIND_ACTIVATION,
            consumer_node_id=peer or (orchestrator if last else 600),
            object_spec=token_spec() if last else act_spec(max_seq),
            ring_spec=ring(common_pb2.RING_DIRECTION_EGRESS)),
        model=stage_pb2.StageModelFacts(model_id="smollm2-135m", num_layers=LAYERS, hidden_dim=HIDDEN,
                                        dtype_family=common_pb2.DTYPE_FAMILY_FLOAT, dtype_width_bytes=4,
                                        max_seq_len=max_seq),
        runtime=stage_pb2.StageRuntimeFacts(role_id=role_id, input_port=0, output_port=1, prefill_chunk=prefill_chunk,
                                            trace_objects=trace, run_slots=run_slots))
    if last:
        req.runtime.sampling.CopyFrom(stage_pb2.StageSampling(temperature=0.0))
    return req
