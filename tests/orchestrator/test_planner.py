"""Planner (spec §11): ranges, edges, sizing, and refusals with reasons."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swactor.common.objflags import MAX_DRAFT
from swactor.orchestrator.fleet.nodes import NodeState
from swactor.orchestrator.planning.placement import balanced_ranges
from swactor.orchestrator.planning.planner import (
    PlanError,
    SamplingPolicy,
    plan_run,
    validate_plan,
)
from swactor.v1 import common_pb2 as pb

from .helpers import model_facts, node, pool


def make_plan(stages: int = 3, nodes: tuple = (1, 2, 3), **kw):
    args = dict(run_id=9, model=model_facts(), pool=pool(*nodes), stages=stages, max_tokens=16, prompt_tokens=10,
                sampling=SamplingPolicy(), orchestrator_node_id=100)
    args.update(kw)
    return plan_run(**args)


@given(st.integers(1, 200), st.integers(1, 64))
def test_balanced_ranges_are_contiguous_and_cover(layers: int, stages: int) -> None:
    if stages > layers:
        with pytest.raises(PlanError, match="only"):
            balanced_ranges(layers, stages)
        return
    r = balanced_ranges(layers, stages)
    assert r[0][0] == 0 and r[-1][1] == layers and len(r) == stages
    assert all(a[1] == b[0] for a, b in itertools.pairwise(r))
    sizes = [hi - lo for lo, hi in r]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_three_stage_plan_edges_and_specs() -> None:
    plan = make_plan()
    assert [(s.layer_start, s.layer_end_exclusive) for s in plan.stages] == [(0, 10), (10, 20), (20, 30)]
    assert [e.kind for e in plan.edges] == [pb.EDGE_KIND_TOKEN_IN, pb.EDGE_KIND_ACTIVATION, pb.EDGE_KIND_ACTIVATION,
                                            pb.EDGE_KIND_TOKEN_OUT]
    tin, a0, _a1, tout = plan.edges
    assert tin.producer.stage_index is None and tin.producer.node_id == 100 and tin.consumer.stage_index == 0
    assert (a0.producer.stage_index, a0.consumer.stage_index) == (0, 1)
    assert tout.consumer.node_id == 100 and tout.producer.node_id == 3
    assert len({e.edge_id for e in plan.edges}) == 4 and all(e.edge_id for e in plan.edges)
    # activations: max_seq_len x hidden x float32 (context capped at 4096 by default)
    assert a0.object_spec.max_extent == 4096 * 576 * 4
    assert a0.object_spec.row_elements == 576 and a0.object_spec.dtype_family == pb.DTYPE_FAMILY_FLOAT
    assert tin.object_spec.kind == pb.OBJECT_KIND_TOKENS and tin.object_spec.dtype_family == pb.DTYPE_FAMILY_INT
    assert tin.object_spec.max_extent == 4096 * 4 and tout.object_spec.max_extent == 4 * (1 + MAX_DRAFT)
    assert a0.ring_spec(pb.RING_DIRECTION_EGRESS).direction == pb.RING_DIRECTION_EGRESS
    assert a0.ring_data_capacity == 4 << 20 and tout.ring_data_capacity == 65536
    assert plan.token_in is tin and plan.token_out is tout
    validate_plan(plan)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(stages=4), r"4 stage\(s\) need 4 stage device\(s\), the pool has 3 on 3 Available node\(s\)"),
        (dict(stages=31, nodes=tuple(range(1, 40))), "only 30 blocks"),
        (dict(stages=0), "at least 1"),
        (dict(max_tokens=0), "max_tokens must be positive"),
        (dict(prompt_tokens=0), "no tokens"),
        (dict(prompt_tokens=5000), "context holds 4096"),
        (dict(node_ids=(1, 2, 7)), r"requested node\(s\) \[7\]"),
    ],
)
def test_refusals_name_the_problem(kw: dict, needle: str) -> None:
    with pytest.raises(PlanError, match=needle):
        make_plan(**kw)


def test_only_provisionable_nodes_are_placed() -> None:
    members = (node(1), node(2, NodeState.BOOTING), node(3), dataclasses.replace(node(4), edge_endpoint=""))
    plan = plan_run(run_id=1, model=model_facts(), pool=members, stages=2, max_tokens=1, prompt_tokens=1,
                    sampling=SamplingPolicy(), orchestrator_node_id=100)
    assert [s.node_id for s in plan.stages] == [1, 3]
    with pytest.raises(PlanError, match="the pool has 2"):
        plan_run(run_id=1, model=model_facts(), pool=members, stages=3, max_tokens=1, prompt_tokens=1,
                 sampling=SamplingPolicy(), orchestrator_node_id=100)


def test_explicit_placement_order() -> None:
    plan = make_plan(node_ids=(3, 1, 2))
    assert [s.node_id for s in plan.stages] == [3, 1, 2]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda p: dataclasses.replace(p, stages=(dataclasses.replace(p.stages[0], layer_end_exclusive=9), *p.stages[1:])),
         "gap or overlap"),
        (lambda p: dataclasses.replace(p, stages=(*p.stages[:2], dataclasses.replace(p.stages[2], layer_end_exclusive=29))),
         "end at 29"),
        (lambda p: dataclasses.replace(p, edges=(p.edges[0], dataclasses.replace(p.edges[1], edge_id=p.edges[0].edge_id),
                                                  *p.edges[2:])), "not unique"),
        (lambda p: dataclasses.replace(p, edges=(p.edges[1], p.edges[0], *p.edges[2:])), "wrong kind or endpoints"),
        (lambda p: dataclasses.replace(p, stages=(p.stages[0], dataclasses.replace(p.stages[1], node=node(1)), p.stages[2])),
         "more than one stage"),
    ],
)
def test_validate_catches_broken_plans(mutate, needle: str) -> None:
    with pytest.raises(PlanError, match=needle):
        validate_plan(mutate(make_plan()))
