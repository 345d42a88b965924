"""Placement by measured compute speed: a host slower per layer gets fewer blocks, in inverse proportion, within its
memory; a host not measured takes the balanced share. Pure: tables of nodes, no sockets."""

from __future__ import annotations

import dataclasses

import pytest

from swactor.cli.render import plan_lines
from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.planning.dry_run import plan_response
from swactor.orchestrator.planning.placement import (
    MemoryNeed,
    Network,
    PlanError,
    Shortfall,
    balanced_ranges,
    place,
    slowest_blocks_ms,
    speed_counts,
)
from swactor.orchestrator.planning.planner import plan_run
from swactor.orchestrator.planning.pool import Demand, PoolStatus

from .helpers import model_facts, node
from .test_placement import LLAMA8B, SMOL, GiB


def hosts(*speeds: float, memory: int = 64 * GiB) -> tuple[NodeInfo, ...]:
    """Nodes 1, 2, ... with these measured ms per layer (0: not measured) and equal memory."""
    return tuple(dataclasses.replace(node(1 + i), memory_bytes=memory, ms_per_layer=ms) for i, ms in enumerate(speeds))


def blocks(p) -> list[int]:
    return [hi - lo for lo, hi in p.ranges]


@pytest.mark.parametrize(("speeds", "want"), [
    ((1.0, 2.0), [20, 10]),  # twice as slow: half the blocks
    ((2.0, 1.0), [10, 20]),
    ((1.0, 3.0), [23, 7]),  # 22.5 and 7.5: the remainders tie, the earlier stage takes the block
    ((1.0, 100.0), [29, 1]),  # every stage at least one block
    ((0.5, 0.5, 1.5), [13, 13, 4]),
])
def test_a_slower_host_gets_fewer_blocks_in_inverse_proportion(speeds: tuple[float, ...], want: list[int]) -> None:
    p = place(hosts(*speeds), len(speeds), 30, memory=MemoryNeed(SMOL, 4096))
    assert blocks(p) == want and p.split == "speed" and not p.over()


@pytest.mark.parametrize("speeds", [(1.0, 1.0), (1.0, 1.2), (1.0, 1.4), (1.0, 1.0, 1.3), (0.0, 3.0), (1.0, 0.0, 0.0)])
def test_a_small_gain_or_one_host_measured_keeps_the_memory_split(speeds: tuple[float, ...]) -> None:
    """Moving blocks costs a reload: a split by speed that shortens the slowest stage by less than SPEED_GAIN (1.4x
    apart: 21 ms against 17.5), which noise between hosts of one kind gives, or one host's figure with nothing to
    compare it with, leaves the split as it was."""
    p = place(hosts(*speeds), len(speeds), 30, memory=MemoryNeed(SMOL, 4096))
    assert list(p.ranges) == balanced_ranges(30, len(speeds)) and p.split == "memory"


def warm(pool: tuple[NodeInfo, ...], ranges: list[tuple[int, int]], **kw: object) -> Network:
    """The network after a run whose stages took `ranges` on `pool`'s units."""
    units = tuple(n.unit for n in pool)
    return Network(pool[0].node_id, warm={len(pool): units}, warm_blocks={units: tuple(ranges)}, **kw)


def test_the_last_run_s_split_stays_until_a_new_one_gains_speed_gain() -> None:
    """A speed split, once made, stays while the figures move by noise: host 2 measured twice as slow, the last run
    took 20 + 10; now the two measure 1.0 and 1.1 (balanced would be 16.5 ms against 20: under SPEED_GAIN), so the
    blocks stay where their weights are. Host 2 measured twice as fast moves them (10 ms against 20)."""
    need = MemoryNeed(SMOL, 4096)
    first = place(hosts(1.0, 2.0), 2, 30, memory=need)
    assert blocks(first) == [20, 10] and first.split == "speed"
    network = warm(first.nodes, list(first.ranges))
    noise = place(hosts(1.0, 1.1), 2, 30, memory=need, network=network)
    assert list(noise.ranges) == [(0, 20), (20, 30)] and noise.split == "kept" and not noise.over()
    assert place(hosts(1.0, 1.1), 2, 30, memory=need).split == "memory"  # without that run: the balanced split
    moved = place(hosts(1.0, 0.5), 2, 30, memory=need, network=network)
    assert blocks(moved) == [10, 20] and moved.split == "speed"
    assert slowest_blocks_ms(moved) == pytest.approx(10.0) and slowest_blocks_ms(noise) == pytest.approx(20.0)


def test_the_last_run_s_split_is_not_kept_where_it_no_longer_fits() -> None:
    """Host 1 now offers memory for 12 blocks only: the 20 it held last time do not fit, so the split that fits wins."""
    need = MemoryNeed(LLAMA8B, 4096)
    pool = (dataclasses.replace(node(1), memory_bytes=need.stage(0, 12).total + 1, ms_per_layer=1.0),
            dataclasses.replace(node(2), memory_bytes=64 * GiB, ms_per_layer=1.1))
    p = place(pool, 2, 32, memory=need, network=warm(pool, [(0, 20), (20, 32)]))
    assert not p.over() and p.split != "kept" and p.ranges[0][1] <= 12


def test_split_by_speed_off_keeps_the_memory_split() -> None:
    """[orchestrator].split_by_speed = false: an operator whose hosts are of one kind never moves blocks for speed."""
    pool = hosts(1.0, 4.0)
    p = place(pool, 2, 30, memory=MemoryNeed(SMOL, 4096), network=Network(1, by_speed=False))
    assert list(p.ranges) == balanced_ranges(30, 2) and p.split == "memory"
    assert place(pool, 2, 30, memory=MemoryNeed(SMOL, 4096), network=Network(1)).split == "speed"


def test_twice_as_slow_gets_about_half_the_blocks_on_a_large_model() -> None:
    p = place(hosts(4.0, 8.0, 4.0), 3, 32, memory=MemoryNeed(LLAMA8B, 4096))
    fast, slow, fast2 = blocks(p)
    assert (fast, slow, fast2) == (13, 6, 13)
    assert abs(slow / fast - 0.5) <= 1 / fast  # within one block of half


def test_no_host_measured_keeps_the_memory_split() -> None:
    p = place(hosts(0.0, 0.0, 0.0), 3, 30, memory=MemoryNeed(SMOL, 4096))
    assert list(p.ranges) == balanced_ranges(30, 3) and p.split == "memory"
    assert p.compute_ms(0) is None and p.compute_ms_per_token() is None


def test_a_host_not_measured_takes_the_balanced_share_and_the_measured_split_the_rest() -> None:
    assert speed_counts(30, [0.0, 1.0, 2.0]) == [10, 13, 7]  # 20 left: 2/3 and 1/3
    p = place(hosts(0.0, 1.0, 2.0), 3, 30, memory=MemoryNeed(SMOL, 4096))
    assert blocks(p) == [10, 13, 7] and p.split == "speed"
    assert p.compute_ms(0) is None and p.compute_ms(1) is not None and p.compute_ms_per_token() is None


def test_memory_wins_over_speed() -> None:
    """Host 1 is 4x as fast but offers memory for only 12 blocks: it keeps the most that fit, host 2 the rest."""
    need = MemoryNeed(LLAMA8B, 4096)
    small = need.stage(0, 12).total + 1  # the first stage's 12 blocks (with the embedding) fit, a 13th not
    pool = (dataclasses.replace(node(1), memory_bytes=small, ms_per_layer=1.0),
            dataclasses.replace(node(2), memory_bytes=64 * GiB, ms_per_layer=4.0))
    p = place(pool, 2, 32, memory=need)
    assert list(p.ranges) == [(0, 12), (12, 32)] and p.split == "speed" and not p.over()
    by_speed = speed_counts(32, [1.0, 4.0])
    assert by_speed[0] > 12  # what speed alone would give did not fit


def test_when_no_split_fits_the_shortfall_still_names_it() -> None:
    need = MemoryNeed(LLAMA8B, 4096)
    pool = hosts(1.0, 2.0, memory=2 * GiB)
    with pytest.raises(Shortfall) as e:
        place(pool, 2, 32, memory=need)
    assert "does not fit the nodes' memory" in str(e.value)


def test_speed_counts_refuses_a_negative_or_non_finite_speed() -> None:
    with pytest.raises(ValueError, match=r"ms_per_layer must be finite and >= 0 .*-1\.0"):
        speed_counts(30, [1.0, -1.0])
    with pytest.raises(ValueError, match="ms_per_layer must be finite"):
        speed_counts(30, [float("nan"), 1.0])


def test_the_last_stage_s_work_counts_the_head_and_the_prediction_follows() -> None:
    need = MemoryNeed(SMOL, 4096)
    p = place(hosts(0.5, 1.0), 2, 30, memory=need)
    assert blocks(p) == [20, 10]
    head_blocks = SMOL.head / SMOL.layer_weights[0]  # 31852800 / 2658816: the head weighs ~12 blocks
    assert p.work[0] == pytest.approx(20) and p.work[1] == pytest.approx(10 + head_blocks)
    assert p.compute_ms(0) == pytest.approx(0.5 * 20) and p.compute_ms(1) == pytest.approx(1.0 * (10 + head_blocks))
    assert p.compute_ms_per_token() == pytest.approx(10 + 10 + head_blocks)


def test_without_the_model_s_memory_the_split_still_follows_speed_and_work_is_the_blocks() -> None:
    p = place(hosts(1.0, 2.0), 2, 30)
    assert blocks(p) == [20, 10] and p.split == "speed" and p.work == (20.0, 10.0)


def test_the_plan_tells_each_stage_its_work_and_the_provisioning_event_carries_the_speed() -> None:
    facts = dataclasses.replace(model_facts(30), memory=SMOL)

    def plan(pool: tuple[NodeInfo, ...]):
        return plan_run(run_id=9, model=facts, pool=pool, stages=2, max_tokens=4, prompt_tokens=2,
                        sampling=SamplingPolicy(), orchestrator_node_id=100)

    s0, s1 = plan(hosts(0.5, 1.0)).stages
    assert (s0.layer_end_exclusive, s1.layer_start) == (20, 20)
    assert (s0.compute_layers, s1.compute_layers) == (pytest.approx(20), pytest.approx(10 + SMOL.head / SMOL.layer_weights[0]))
    assert s1.counters()["step_us_per_layer"] == 1000 and s1.counters()["compute_us"] == round(1000 * s1.compute_layers)
    assert "step_us_per_layer" not in plan(hosts(0.0, 0.0)).stages[0].counters()


def test_the_dry_run_prints_each_stage_s_speed_and_predicted_compute() -> None:
    pool = hosts(0.25, 0.5)
    demand = Demand(stages=2, num_layers=30, memory=MemoryNeed(SMOL, 4096))
    answer = plan_response("smol", pool, demand, PoolStatus(True, "ready"), prompt_tokens=2, max_seq_len=4096)
    assert answer.split == "speed"
    s0, s1 = answer.placement
    assert (s0.ms_per_layer, s1.ms_per_layer) == (0.25, 0.5) and s0.compute_ms == pytest.approx(0.25 * 20)
    assert answer.compute_ms_per_token == pytest.approx(s0.compute_ms + s1.compute_ms)
    assert answer.predicted_ms_per_token == pytest.approx(answer.compute_ms_per_token)  # no network: no hops counted
    lines = plan_lines(answer)
    assert "blocks in inverse proportion to the nodes' measured ms per layer" in lines[0]
    assert lines[1].endswith("; 0.250 ms/layer x 20.0 layers = 5.0 ms a decode step"), lines[1]
    assert "0.500 ms/layer x 22.0 layers = 11.0 ms a decode step" in lines[2], lines[2]
    assert lines[3] == "  compute: the stages add 16.0 ms to each token (one after another)"


def test_the_dry_run_marks_a_host_not_measured() -> None:
    demand = Demand(stages=2, num_layers=30, memory=MemoryNeed(SMOL, 4096))
    answer = plan_response("smol", hosts(0.0, 0.5), demand, PoolStatus(True, "ready"), prompt_tokens=2,
                           max_seq_len=4096)
    lines = plan_lines(answer)
    assert lines[1].endswith("; speed not measured") and "0.500 ms/layer" in lines[2]
    assert not answer.HasField("compute_ms_per_token") and not answer.HasField("predicted_ms_per_token")


def test_a_run_joining_the_runs_in_flight_keeps_their_blocks_whatever_the_speeds_now() -> None:
    """The runs in flight were placed 15 + 15 before the hosts were measured; a run joining them shares their
    resident weights, so it takes their blocks, not the split the speeds would give now."""
    pool = hosts(1.0, 3.0)
    need = MemoryNeed(SMOL, 4096)
    assert blocks(place(pool, 2, 30, memory=need)) == [23, 7]
    p = place(pool, 2, 30, (1, 2), memory=need, ranges=((0, 15), (15, 30)))
    assert list(p.ranges) == [(0, 15), (15, 30)] and p.split == "joined" and not p.over()
    assert p.compute_ms(1) == pytest.approx(3.0 * (15 + SMOL.head / SMOL.layer_weights[0]))
    with pytest.raises(PlanError, match=r"needs their nodes pinned and one block range per stage; got 0 pin\(s\)"):
        place(pool, 2, 30, memory=need, ranges=((0, 15), (15, 30)))
    with pytest.raises(Shortfall):  # a node advertising less memory now: still checked
        place(hosts(1.0, 3.0, memory=GiB // 4), 2, 30, (1, 2), memory=need, ranges=((0, 15), (15, 30)))


def test_a_measured_host_whose_one_block_does_not_fit_is_named_in_the_shortfall() -> None:
    need = MemoryNeed(LLAMA8B, 4096)
    pool = (dataclasses.replace(node(1), memory_bytes=64 * GiB, ms_per_layer=1.0),
            dataclasses.replace(node(2), memory_bytes=GiB // 8, ms_per_layer=50.0))  # less than any stage needs
    with pytest.raises(Shortfall) as e:
        place(pool, 2, 32, memory=need)
    assert e.value.placement.over() == [1] and "on node 2 needs" in str(e.value)
