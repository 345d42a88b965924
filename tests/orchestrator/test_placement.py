"""Memory-aware placement (issue 15 item 6): tables of memberships and models, pure, no sockets."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swactor.cli.render import plan_lines
from swactor.common.sampling import SamplingPolicy
from swactor.modelfile.memory import RUNTIME_BYTES, MemoryProfile
from swactor.modelfile.params import read_params
from swactor.orchestrator.config import OrchestratorConfig
from swactor.orchestrator.fleet.nodes import NodeState
from swactor.orchestrator.models.models import load_model
from swactor.orchestrator.models.sources import ModelSource
from swactor.orchestrator.planning.dry_run import plan_response
from swactor.orchestrator.planning.placement import (
    MemoryNeed,
    PlanError,
    Shortfall,
    balanced_ranges,
    fitted_ranges,
    place,
    proportional_ranges,
)
from swactor.orchestrator.planning.planner import memory_need, plan_run
from swactor.orchestrator.planning.pool import Demand, PoolStatus
from swactor.v1 import common_pb2 as pb

from .helpers import MODEL_PATH, model_facts, node

GiB = 1 << 30
# SmolLM2-135M Q4_1 as modelfile.memory reads its header; an 8B Q4_K_M-shaped model (Llama 3.1: 32 blocks, GQA 8x128,
# Q4_K embedding, Q6_K head)
SMOL = MemoryProfile(layer_weights=(2658816,) * 30, embedding=30081024, head=31852800, kv_width=384, hidden=576,
                     q_width=576, ffn=1536, n_heads=9, rope_dim=64, vocab=49152)
LLAMA8B = MemoryProfile(layer_weights=(142_000_000,) * 32, embedding=288_000_000, head=431_000_000, kv_width=2048,
                        hidden=4096, q_width=4096, ffn=14336, n_heads=32, rope_dim=128, vocab=128256)


def nodes(*memory: int, first_id: int = 1):
    return tuple(dataclasses.replace(node(first_id + i), memory_bytes=m) for i, m in enumerate(memory))


def need(profile: MemoryProfile = LLAMA8B, max_seq_len: int = 4096) -> MemoryNeed:
    return MemoryNeed(profile, max_seq_len)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("profile", [SMOL, LLAMA8B], ids=["smol", "8b"])
def test_equal_memory_gets_the_balanced_split(profile: MemoryProfile, stages: int) -> None:
    p = place(nodes(*[64 * GiB] * stages), stages, profile.num_layers, memory=need(profile))
    assert list(p.ranges) == balanced_ranges(profile.num_layers, stages) and p.split == "memory"
    assert [n.node_id for n in p.nodes] == list(range(1, stages + 1)) and not p.over()
    assert p.needs[0].weights > p.needs[-1].weights - LLAMA8B.head  # the first stage holds the embedding


def test_layers_follow_memory() -> None:
    p = place(nodes(8 * GiB, 24 * GiB), 2, 32, memory=need())
    assert p.ranges == ((0, 9), (9, 32)) and p.split == "memory"  # 1 + 30/4 rounded, 1 + 3 x 30/4
    p = place(nodes(40 * GiB, 20 * GiB, 20 * GiB), 3, 32, memory=need())
    assert p.ranges == ((0, 16), (16, 24), (24, 32))
    assert all(n.total <= m.memory_bytes for n, m in zip(p.needs, p.nodes, strict=True))


def test_a_node_too_small_is_refused_naming_the_shortfall() -> None:
    with pytest.raises(Shortfall) as e:
        place(nodes(24 * GiB, GiB // 2), 2, 32, memory=need())
    assert e.value.reason == pb.RUN_FAULT_DEVICE_OUT_OF_MEMORY
    msg = str(e.value)
    over = e.value.placement
    assert over.over() == [1] and over.ranges[1] == (31, 32)  # even one block and the head do not fit
    assert "stage 1 (blocks 31..32) on node 2 needs" in msg and "the node offers 512.0 MiB" in msg
    assert f"runtime {RUNTIME_BYTES / 2**20:.1f} MiB" in msg and "stage 0" not in msg


def test_too_little_memory_altogether_names_every_stage_over() -> None:
    with pytest.raises(Shortfall) as e:
        place(nodes(2 * GiB, 2 * GiB), 2, 32, memory=need())
    assert e.value.placement.over() == [0, 1] and "stage 0" in str(e.value) and "stage 1" in str(e.value)


def test_when_the_proportional_split_does_not_fit_the_fitted_one_is_used() -> None:
    # Equal memory, but the last stage also holds a big head: the balanced split overflows it by a little.
    profile = dataclasses.replace(SMOL, head=100 << 20)
    m = need(profile, 1024)
    even = [m.stage(lo, hi).total for lo, hi in balanced_ranges(30, 2)]
    block = m.stage(0, 2).total - m.stage(0, 1).total
    budget = (even[0] + even[1]) // 2 + block  # a block above the mean, well below the last stage's balanced need
    assert even[1] > budget
    p = place(nodes(budget, budget), 2, 30, memory=m)
    assert p.split == "fitted" and not p.over() and p.ranges[1][1] - p.ranges[1][0] < 15


def test_pins_are_honoured_in_their_order() -> None:
    pool = nodes(8 * GiB, 80 * GiB, 24 * GiB)
    p = place(pool, 2, 32, node_ids=(3, 1), memory=need())
    assert [n.node_id for n in p.nodes] == [3, 1] and p.ranges == ((0, 24), (24, 32))
    with pytest.raises(PlanError, match=r"requested node\(s\) \[9\]"):
        place(pool, 2, 32, node_ids=(3, 9), memory=need())


def test_the_nodes_with_the_most_memory_are_chosen_in_node_id_order() -> None:
    pool = nodes(8 * GiB, 80 * GiB, 24 * GiB, 80 * GiB)
    assert [n.node_id for n in place(pool, 2, 32, memory=need()).nodes] == [2, 4]
    assert [n.node_id for n in place(pool, 3, 32, memory=need()).nodes] == [2, 3, 4]
    # without the model's memory: node-id order, as before memory was known
    assert [n.node_id for n in place(pool, 2, 32).nodes] == [1, 2]


def test_a_node_without_advertised_memory_gets_the_balanced_split_and_the_others_are_still_checked() -> None:
    p = place(nodes(0, 24 * GiB), 2, 32, memory=need())
    assert p.ranges == ((0, 16), (16, 32)) and p.split == "balanced" and not p.over()
    with pytest.raises(Shortfall, match="stage 1"):
        place(nodes(0, 2 * GiB), 2, 32, memory=need())


def test_only_provisionable_nodes_are_candidates() -> None:
    pool = (*nodes(80 * GiB), dataclasses.replace(node(2, NodeState.BOOTING), memory_bytes=200 * GiB),
            dataclasses.replace(node(3, NodeState.SUSPECT), memory_bytes=200 * GiB), *nodes(8 * GiB, first_id=4))
    assert [n.node_id for n in place(pool, 2, 32, memory=need()).nodes] == [1, 4]
    with pytest.raises(PlanError, match=r"3 stage\(s\) need 3 stage device\(s\), the pool has 2 on 2 Available node\(s\)"):
        place(pool, 3, 32, memory=need())


def test_stage_bytes_parts() -> None:
    m = need(SMOL, 4096)
    first, last = m.stage(0, 15), m.stage(15, 30)
    assert first.kv_cache == last.kv_cache == 15 * 384 * (4096 + 64) * 4
    assert first.weights == 15 * 2658816 + SMOL.embedding and last.weights == 15 * 2658816 + SMOL.head
    assert last.scratch - first.scratch == SMOL.vocab * 4 and first.runtime == RUNTIME_BYTES


@given(st.integers(1, 80), st.lists(st.integers(1, 1 << 40), min_size=1, max_size=8))
def test_proportional_ranges_are_contiguous_cover_and_follow_memory(layers: int, memory: list[int]) -> None:
    if len(memory) > layers:
        with pytest.raises(PlanError, match="only"):
            proportional_ranges(layers, memory)
        return
    r = proportional_ranges(layers, memory)
    assert r[0][0] == 0 and r[-1][1] == layers and all(a[1] == b[0] for a, b in itertools.pairwise(r))
    sizes = [hi - lo for lo, hi in r]
    assert min(sizes) >= 1
    for (sa, ma), (sb, mb) in itertools.combinations(zip(sizes, memory, strict=True), 2):
        if ma > mb:
            assert sa >= sb - 1  # more memory, never fewer blocks (but for the one a larger remainder may give)


@given(st.integers(2, 9), st.lists(st.integers(1, 12), min_size=1, max_size=3), st.integers(0, 6))
def test_fitted_ranges_minimise_the_largest_share(layers: int, memory_gib: list[int], head_blocks: int) -> None:
    stages = len(memory_gib)
    if stages > layers:
        return
    profile = dataclasses.replace(LLAMA8B, layer_weights=(LLAMA8B.layer_weights[0],) * layers,
                                  head=head_blocks * LLAMA8B.layer_weights[0])
    pool, m = nodes(*(g * GiB for g in memory_gib)), need(profile, 2048)

    def worst(ranges) -> float:
        return max(m.stage(lo, hi).total / n.memory_bytes for (lo, hi), n in zip(ranges, pool, strict=True))

    best = min(worst(list(itertools.pairwise((0, *cuts, layers))))
               for cuts in itertools.combinations(range(1, layers), stages - 1))
    assert worst(fitted_ranges(pool, layers, m)) <= best * (1 + 1e-9)


# ---- run slots: one KV cache per run a stage decodes at once, over one copy of its weights ----

MiB = 1 << 20


@pytest.mark.skipif(not MODEL_PATH.exists(), reason=f"{MODEL_PATH} missing: run `make model`")
def test_a_run_slot_of_the_default_model_costs_its_kv_cache_by_hand() -> None:
    model = load_model(ModelSource.parse("smol", str(MODEL_PATH)))
    params = read_params(model.header)
    assert (params.n_layers, params.n_kv_heads, params.head_dim) == (30, 3, 64)
    need = memory_need(model.facts, OrchestratorConfig.max_seq_len)
    assert need is not None and need.max_seq_len == 4096  # the model's 8192 capped by the default context
    # positions (context + the 64-row prefill chunk the worker pads into) x blocks x K,V x kv heads x head dim x float32
    per_block = (4096 + 64) * 2 * 3 * 64 * 4
    assert need.profile.kv_slot_bytes(0, 30, 4096) == 30 * per_block == 191_692_800
    thirds = [need.stage(lo, hi) for lo, hi in balanced_ranges(30, 3)]
    assert [s.kv_cache for s in thirds] == [10 * per_block] * 3 == [63_897_600] * 3


def test_run_slots_fill_the_memory_after_the_weights_up_to_the_cap() -> None:
    m = need(SMOL, 4096)
    stage = m.stage(0, 30)
    assert stage.shared == stage.weights + stage.scratch + stage.runtime and stage.total == stage.shared + stage.kv_cache
    room_for = lambda slots: stage.shared + slots * stage.kv_cache  # noqa: E731
    p = place(nodes(room_for(3) + stage.kv_cache - 1), 1, 30, memory=m)
    assert p.slots == (3,) and not p.over()
    assert place(nodes(room_for(100)), 1, 30, memory=m).slots == (8,)  # the default cap
    assert place(nodes(room_for(100)), 1, 30, memory=dataclasses.replace(m, max_slots=64)).slots == (64,)
    assert place(nodes(room_for(5)), 1, 30, memory=dataclasses.replace(m, max_slots=2)).slots == (2,)
    assert place(nodes(0), 1, 30, memory=m).slots == (None,)  # memory not advertised: unknown, not refused


def test_a_node_with_room_for_the_weights_but_not_one_run_slot_is_refused() -> None:
    m = need(SMOL, 4096)
    stage = m.stage(0, 30)
    assert place(nodes(stage.shared + stage.kv_cache), 1, 30, memory=m).slots == (1,)
    with pytest.raises(Shortfall) as e:
        place(nodes(stage.shared + stage.kv_cache - 1), 1, 30, memory=m)
    assert e.value.reason == pb.RUN_FAULT_DEVICE_OUT_OF_MEMORY and e.value.placement.slots == (0,)
    assert str(e.value) == (
        "the model does not fit the nodes' memory: stage 0 (blocks 0..30) on node 1 needs 595.7 MiB for one run slot "
        "(weights 135.1 MiB, KV cache 182.8 MiB, scratch 21.7 MiB, runtime 256.0 MiB); the node offers 595.7 MiB")


def test_the_stage_plan_carries_its_run_slots() -> None:
    facts = dataclasses.replace(model_facts(), memory=SMOL)
    middle = need(SMOL, 4096).stage(10, 20)
    # equal memory, the balanced split; the first and last stages' embedding and head cost less than 3/4 of a slot
    memory = middle.shared + 3 * middle.kv_cache + middle.kv_cache * 3 // 4
    plan = plan_run(run_id=9, model=facts, pool=nodes(memory, memory, memory), stages=3, max_tokens=16,
                    prompt_tokens=10, sampling=SamplingPolicy(), orchestrator_node_id=100)
    assert [(s.layer_start, s.run_slots) for s in plan.stages] == [(0, 3), (10, 3), (20, 3)]
    plan = plan_run(run_id=9, model=facts, pool=nodes(64 * GiB), stages=1, max_tokens=16, prompt_tokens=10,
                    sampling=SamplingPolicy(), orchestrator_node_id=100, max_slots_per_stage=20)
    assert plan.stages[0].run_slots == 20


def test_the_dry_run_shows_each_stage_s_kv_cache_per_run_slot_and_its_run_slots() -> None:
    m = need(SMOL, 4096)
    middle = m.stage(10, 20)
    members = nodes(2 * GiB, middle.shared + 3 * middle.kv_cache, 0)
    answer = plan_response("smol", members, Demand(3, (1, 2, 3), 30, m), PoolStatus(True, "ok"),
                           prompt_tokens=5, max_seq_len=4096)
    assert [s.run_slots if s.HasField("run_slots") else None for s in answer.placement] == [8, 3, None]
    assert answer.max_slots_per_stage == 8 and {s.kv_cache_bytes for s in answer.placement} == {63_897_600}
    lines = plan_lines(answer)
    assert lines[1].startswith("  stage 0: node 1 blocks 0..10 needs ") and "KV cache 60.9 MiB per run slot" in lines[1]
    assert lines[1].endswith("of 2.00 GiB; holds 8 run slots (max_slots_per_stage 8)")
    assert lines[2].endswith("; holds 3 run slots") and lines[3].endswith("of memory not advertised; run slots ?")
    one_block = m.stage(10, 11)  # room for one block's weights, not for its KV cache: no split fits
    short = plan_response("smol", nodes(GiB, one_block.shared + one_block.kv_cache - 1, GiB),
                          Demand(3, (1, 2, 3), 30, m), PoolStatus(True, "ok"), prompt_tokens=5, max_seq_len=4096)
    assert plan_lines(short)[2].endswith("; holds no run slot  DOES NOT FIT")
    assert "stage 1 (blocks " in short.refusal and " on node 2 needs " in short.refusal and "stage 0" not in short.refusal


# ---- the KV dtype: [orchestrator].kv_dtype float16 keeps a run slot's KV cache at half the bytes of float32 ----


def test_a_float16_kv_cache_counts_a_run_slot_at_half() -> None:
    f32 = need(SMOL, 4096)
    f16 = dataclasses.replace(f32, kv_dtype="float16")
    assert SMOL.kv_slot_bytes(0, 30, 4096, kv_bytes=2) * 2 == SMOL.kv_slot_bytes(0, 30, 4096) == 191_692_800
    for lo, hi in balanced_ranges(30, 3):
        full, half = f32.stage(lo, hi), f16.stage(lo, hi)
        assert half.kv_cache * 2 == full.kv_cache == 63_897_600 and half.shared == full.shared  # only the KV halves
    whole = f32.stage(0, 30)
    room = whole.shared + 3 * whole.kv_cache
    assert place(nodes(room), 1, 30, memory=f32).slots == (3,) and place(nodes(room), 1, 30, memory=f16).slots == (6,)
    tight = whole.shared + whole.kv_cache // 2  # the weights and half a float32 slot: one float16 slot
    with pytest.raises(Shortfall):
        place(nodes(tight), 1, 30, memory=f32)
    assert place(nodes(tight), 1, 30, memory=f16).slots == (1,)
    with pytest.raises(ValueError, match=r"kv_bytes must be one of \[2, 4\], got 8"):
        SMOL.kv_slot_bytes(0, 30, 4096, kv_bytes=8)


def test_the_plan_carries_the_kv_dtype_placement_counted() -> None:
    facts = dataclasses.replace(model_facts(), memory=SMOL)
    plan = plan_run(run_id=9, model=facts, pool=nodes(GiB, GiB), stages=2, max_tokens=16, prompt_tokens=10,
                    sampling=SamplingPolicy(), orchestrator_node_id=100, kv_dtype="float16")
    assert plan.kv_dtype == "float16"
    assert [s.memory.kv_cache for s in plan.stages if s.memory] == [15 * 4160 * 384 * 2] * 2
    default = plan_run(run_id=9, model=facts, pool=nodes(GiB, GiB), stages=2, max_tokens=16, prompt_tokens=10,
                       sampling=SamplingPolicy(), orchestrator_node_id=100)
    assert default.kv_dtype == "float32" and [s.memory.kv_cache for s in default.stages if s.memory] == [15 * 4160 * 384 * 4] * 2
    assert memory_need(facts, 4096, kv_dtype="float16") == MemoryNeed(SMOL, 4096, kv_dtype="float16")


def test_the_dry_run_says_which_kv_dtype_it_counted() -> None:
    for dtype, per_slot, shown in (("float32", 63_897_600, "60.9 MiB"), ("float16", 31_948_800, "30.5 MiB")):
        m = dataclasses.replace(need(SMOL, 4096), kv_dtype=dtype)
        answer = plan_response("smol", nodes(2 * GiB, 2 * GiB, 2 * GiB), Demand(3, (1, 2, 3), 30, m),
                               PoolStatus(True, "ok"), prompt_tokens=5, max_seq_len=4096)
        assert answer.kv_dtype == dtype and {s.kv_cache_bytes for s in answer.placement} == {per_slot}
        lines = plan_lines(answer)
        assert lines[0].startswith(f"model smol: 3 stage(s), 5 prompt tokens, context 4096, KV cache {dtype}; "), lines[0]
        assert f"KV cache {shown} per run slot" in lines[1]
    unknown = plan_response("smol", nodes(GiB), Demand(1, (), 30, None), PoolStatus(True, "ok"), prompt_tokens=5,
                            max_seq_len=4096)
    assert unknown.kv_dtype == "" and "KV cache" not in plan_lines(unknown)[0]  # nothing was counted


# ---- a run that joins the runs in flight is pinned to their nodes: it must get the same seats ----


def _seats(p) -> list[tuple[int, tuple[int, int], int | None]]:
    return [(n.node_id, r, s) for n, r, s in zip(p.nodes, p.ranges, p.slots, strict=True)]


def _fitted_pool():
    """Equal memory, but the last stage also holds a big head: the proportional split overflows it (as above)."""
    m = need(dataclasses.replace(SMOL, head=100 << 20), 1024)
    even = [m.stage(lo, hi).total for lo, hi in balanced_ranges(30, 2)]
    budget = (even[0] + even[1]) // 2 + m.stage(0, 2).total - m.stage(0, 1).total
    return nodes(budget, budget), m


@pytest.mark.parametrize(("case", "split"), [
    (lambda: (nodes(64 * GiB, 64 * GiB, 64 * GiB), need(SMOL, 4096)), "memory"),  # equal: the balanced split
    (lambda: (nodes(8 * GiB, 24 * GiB, 80 * GiB, 12 * GiB), need(SMOL, 4096)), "memory"),  # the three largest
    (lambda: (nodes(0, 24 * GiB, 24 * GiB), need(SMOL, 4096)), "balanced"),  # one node's memory unknown
    (_fitted_pool, "fitted"),
], ids=["equal", "proportional", "unknown", "fitted"])
def test_pinning_a_placement_s_own_nodes_gives_the_same_blocks_and_run_slots(case, split: str) -> None:
    pool, m = case()
    stages = min(3, len(pool))
    first = place(pool, stages, 30, memory=m)
    assert first.split == split
    joined = place(pool, stages, 30, node_ids=tuple(n.node_id for n in first.nodes), memory=m)
    assert _seats(joined) == _seats(first) and joined.split == first.split
    # a group founded on pins in another order keeps that order
    pinned = place(pool, stages, 30, node_ids=tuple(n.node_id for n in reversed(first.nodes)), memory=m)
    again = place(pool, stages, 30, node_ids=tuple(n.node_id for n in pinned.nodes), memory=m)
    assert _seats(again) == _seats(pinned)


def test_a_stage_of_unknown_memory_holds_max_slots_per_stage_in_the_plan_and_in_provisioning() -> None:
    from pathlib import Path

    from swactor.orchestrator.fleet.stage_fleet import provision_request
    from swactor.orchestrator.planning.planner import Seat

    facts = dataclasses.replace(model_facts(), memory=SMOL)
    middle = need(SMOL, 4096).stage(15, 30)
    plan = plan_run(run_id=9, model=facts, pool=nodes(0, middle.shared + 2 * middle.kv_cache), stages=2,
                    max_tokens=16, prompt_tokens=10, sampling=SamplingPolicy(), orchestrator_node_id=100,
                    max_slots_per_stage=5)
    assert [s.run_slots for s in plan.stages] == [None, 2]
    assert plan.seats() == (Seat(1, 0, 15, 5), Seat(2, 15, 30, 2))
    sent = [provision_request(plan, s, Path("/m.gguf")).runtime.run_slots for s in plan.stages]
    assert sent == [5, 2]
