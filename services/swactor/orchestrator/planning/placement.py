"""Where a run's stages go (spec §11): which stage devices, which contiguous block range each, and whether it fits.

Pure functions over the membership view, the measured network and the model's memory profile
(swactor.modelfile.memory). Stages are placed on units: a node with several stage devices (NodeInfo.devices) is that
many units, each with the node's per-device memory, so it can carry as many stages of one run; a node's units are
interchangeable, and a plan takes them in device order (the first of its stages on device 0, the next on device 1).
- units: the `--node` pins in their order (a node pinned twice: its devices 0 and 1); else, with a `Network` (the
  orchestrator's node and the RTTs members measured), the units and stage order whose ring orchestrator -> stage 0
  -> ... -> last stage -> orchestrator costs the least: the sum of its hops' RTTs (in whole milliseconds: a LAN's
  differences are noise; 0 between two devices of one node), then the fewest hops between hosts (the orchestrator's
  own node takes stage 0, so the tokens' first hop stays on its host), then the fewest stage-to-stage hops between
  hosts (activations are larger than tokens: a multi-device host takes consecutive stages before the ring crosses the
  network), then the most memory; when that choice does not fit, the units with the most memory in their best
  order. Without a Network: the provisionable units with the most advertised memory when the model's memory is
  known (node-id order otherwise), stages then in node-id and device order. With a Network, the fastest measured units
  (NodeInfo.ms_per_layer) in their cheapest order replace that choice when a token is predicted to take at most
  QUICKER_SHARE of its time on them (Placement.predicted_ms_per_token: the stages' compute one after another plus the
  hops one way): a GPU host beside the CPU box the orchestrator runs on;
- stage count (a run that leaves it open, `stage_count`): the fewest whose placement fits the pool's memory, or a few
  more when their placement is predicted QUICKER_SHARE as long per token (the fast hosts hold the model only together);
- blocks: in inverse proportion to the chosen nodes' measured compute speeds (NodeInfo.ms_per_layer) when that
  shortens the slowest stage by SPEED_GAIN against the memory split (and against the last run's blocks on these
  units, which otherwise stay: split "kept"), unless [orchestrator].split_by_speed is off. A host twice as slow per
  layer gets about half the blocks, so the stages take about as long (the slowest stage bounds the tokens of runs in
  flight, and a run alone spends less on the slow host); a node not measured yet takes the balanced share and the
  measured ones split the rest; a stage whose share does not fit its device's memory keeps what fits and the others
  take the rest (memory wins over speed). Else every stage at least one, the rest in proportion to
  each unit's advertised memory (largest remainder, ties to earlier stages: equal memory gives the balanced split,
  30 / 4 = 8, 8, 7, 7); balanced when a node did not advertise memory or the model's is unknown;
- fit: each stage's estimated bytes (weights, KV cache for max_seq_len, scratch, runtime) within its device's memory.
  When the proportional split does not fit, the split that minimises the largest share of a device's memory used is
  tried; when that does not fit either, `Shortfall` names every stage over its device's memory;
- run slots: how many runs' KV caches a stage holds beside its weights (at most max_slots_per_stage), for the
  admission of several runs at once; a stage fits when it holds at least one. A slot is counted in the run's KV dtype
  ([orchestrator].kv_dtype): float16 costs half of float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from swactor.common.reasons import ReasonError
from swactor.modelfile.memory import (
    DEFAULT_KV_DTYPE,
    KV_DTYPE_BYTES,
    MAX_RUN_SLOTS,
    MemoryProfile,
    StageBytes,
)
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.v1 import common_pb2

BISECT_STEPS = 40
# [orchestrator].max_slots_per_stage: its default, and the largest value taken (a bound on what one stage is asked to
# decode at once, whatever its memory).
DEFAULT_MAX_SLOTS_PER_STAGE = 8
MAX_SLOTS_PER_STAGE = MAX_RUN_SLOTS


class PlanError(ReasonError, ValueError):
    """The request cannot become a valid plan on this pool; `reason` is a RunFaultReason value."""

    def __init__(self, message: str, reason: int = common_pb2.RUN_FAULT_NODE_UNAVAILABLE) -> None:
        super().__init__(reason, message)


# Orders tried exhaustively up to this many (sequences of the candidate nodes, each at most as often as it has units:
# orders that only swap two devices of one node are one plan); beyond, nearest-neighbour from the orchestrator's node.
MAX_ORDERS_TRIED = 5040
# The last run's ring stays while no other is cheaper by more than this share of its RTT plus WARM_MARGIN_MS: its nodes
# hold those layers' weights (and compiled graphs) already, and a few ms of measured RTT is not worth reloading them.
WARM_MARGIN_SHARE = 0.1
# Blocks follow measured speed only when that shortens the slowest stage's predicted decode step by this share, against
# the split memory gives and against the last run's split on the same units (Network.warm_blocks): a split that moves
# costs each moved stage a reload of its weights, and hosts of one kind measure apart by noise (one host here measured
# 0.87 and 1.76 ms/layer in two runs of a busy 2-core box), so a small predicted gain is not worth a move.
SPEED_GAIN = 0.2
WARM_MARGIN_MS = 2.0
# The fastest measured units (and more stages than the fewest that fit) replace the ring's choice only when a token is
# predicted to take at most this share of its time there. A one-stage run moved to a host twice as fast is predicted
# at half its time, so the 2x apart that hosts of one kind measured on a busy box (above) never moves a run; a GPU host
# beside a CPU box (10x and more) does. Between, fewer hops and warm weights are worth more than a prediction.
QUICKER_SHARE = 1 / 3
# Stage counts above the fewest that fit that stage_count tries: a faster set of hosts that holds the model only
# together is a few hosts, and each count tried is a placement search.
MORE_STAGES_TRIED = 2


@dataclass(frozen=True)
class Network:
    """Where a run's tokens start and end (the orchestrator's node) and the round trips members measured, in ms
    ((from, to) -> RTT; membership/rtt.py)."""

    origin: int
    rtt_ms: Mapping[tuple[int, int], float] = field(default_factory=dict)
    # stage count -> the units ((node id, device): NodeInfo.unit) the last run with that many stages was placed on,
    # in stage order (its weights are warm there)
    warm: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # those units -> the blocks that run took on them, in stage order: a new split must beat it by SPEED_GAIN
    warm_blocks: Mapping[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # [orchestrator].split_by_speed: False keeps the memory split whatever the hosts measured
    by_speed: bool = True

    def hop_ms(self, a: int, b: int) -> float | None:
        """One hop's RTT: 0 on one node, the mean of what either end measured, None when neither has."""
        if a == b:
            return 0.0
        seen = [r for r in (self.rtt_ms.get((a, b)), self.rtt_ms.get((b, a))) if r is not None]
        return sum(seen) / len(seen) if seen else None

    def hops(self, node_ids: Sequence[int]) -> list[tuple[int, int]]:
        """A token's ring over these stages: orchestrator -> stage 0, ..., last stage -> orchestrator."""
        return list(itertools.pairwise([self.origin, *node_ids, self.origin]))

    def ring(self, node_ids: Sequence[int]) -> list[float | None]:
        """Each hop's RTT (None: not measured)."""
        return [self.hop_ms(a, b) for a, b in self.hops(node_ids)]

    def one_way_ms(self, node_ids: Sequence[int]) -> float | None:
        """What the hops add to a token, one way each (half the RTTs); None when a hop was not measured."""
        hops = self.ring(node_ids)
        return None if any(h is None for h in hops) else sum(h for h in hops if h is not None) / 2

    @functools.cached_property
    def _unmeasured_ms(self) -> float:
        known = [r for (a, b), r in self.rtt_ms.items() if a != b]
        return sum(known) / len(known) if known else 0.0

    def hop_cost_ms(self, a: int, b: int) -> float:
        """A hop's RTT for ordering: an unmeasured one counts as the mean of the measured ones (0 with none)."""
        h = self.hop_ms(a, b)
        return self._unmeasured_ms if h is None else h

    def ring_ms(self, nodes: Sequence[NodeInfo]) -> float:
        return sum(self.hop_cost_ms(a, b) for a, b in self.hops([n.node_id for n in nodes]))

    def cost(self, nodes: Sequence[NodeInfo]) -> tuple[int, int, int, int]:
        """What ordering minimises: the ring's RTT in whole ms, its hops between hosts, its stage-to-stage hops
        between hosts (activation edges; the others carry tokens), then less memory (ties go to more)."""
        ids = [n.node_id for n in nodes]
        between_hosts = sum(a != b for a, b in self.hops(ids))
        activations_between = sum(a != b for a, b in itertools.pairwise(ids))
        return (math.floor(self.ring_ms(nodes)), between_hosts, activations_between,
                -sum(n.memory_bytes for n in nodes))


def ring_order(candidates: Sequence[NodeInfo], stages: int, network: Network) -> tuple[NodeInfo, ...]:
    """`stages` of the candidate units in the order whose ring costs the least (`Network.cost`; equal costs: the
    orchestrator's node first, then (node id, device) in ascending order), unless the last run's ring (`Network.warm`)
    is within the warm margin of it. Exhaustive up to MAX_ORDERS_TRIED orders, else nearest neighbour from the
    orchestrator. A node's units are taken in device order."""
    best = _cheapest(sorted(candidates, key=lambda n: n.unit), stages, network)
    by_unit = {n.unit: n for n in candidates}
    warm = network.warm.get(stages, ())
    if warm and all(u in by_unit for u in warm):
        kept = tuple(by_unit[u] for u in warm)
        if network.ring_ms(kept) <= network.ring_ms(best) * (1 + WARM_MARGIN_SHARE) + WARM_MARGIN_MS:
            return kept
    return best


def unit_orders(pool: Sequence[NodeInfo], stages: int) -> Iterator[tuple[NodeInfo, ...]]:
    """Every order of `stages` of the pool's units up to the interchange of one node's units: sequences of node ids,
    each at most as often as the pool has units of it, the k-th occurrence of a node taking its k-th unit (`pool`
    in (node id, device) order). One node per unit: the permutations of the pool."""
    by_node: dict[int, list[NodeInfo]] = {}
    for n in pool:
        by_node.setdefault(n.node_id, []).append(n)
    used = dict.fromkeys(by_node, 0)
    order: list[NodeInfo] = []

    def extend() -> Iterator[tuple[NodeInfo, ...]]:
        if len(order) == stages:
            yield tuple(order)
            return
        for node_id, units in by_node.items():
            k = used[node_id]
            if k < len(units):
                used[node_id] = k + 1
                order.append(units[k])
                yield from extend()
                used[node_id] = k
                order.pop()

    yield from extend()


def _cheapest(pool: Sequence[NodeInfo], stages: int, network: Network) -> tuple[NodeInfo, ...]:
    orders = list(itertools.islice(unit_orders(pool, stages), MAX_ORDERS_TRIED + 1))
    if len(orders) <= MAX_ORDERS_TRIED:
        return min(orders, key=lambda o: (network.cost(o), o[0].node_id != network.origin, [n.unit for n in o]))
    order: list[NodeInfo] = []
    at = network.origin
    for _ in range(stages):
        nxt = min((n for n in pool if n not in order),
                  key=lambda n: (network.hop_cost_ms(at, n.node_id), -n.memory_bytes, n.unit))
        order.append(nxt)
        at = nxt.node_id
    return tuple(order)


@dataclass(frozen=True)
class MemoryNeed:
    """The model's memory as the planner knows it: its profile, the run's context length, the most run slots a stage
    is given, the dtype the stages keep their KV cache in (KV_DTYPE_BYTES)."""

    profile: MemoryProfile
    max_seq_len: int
    max_slots: int = DEFAULT_MAX_SLOTS_PER_STAGE
    kv_dtype: str = DEFAULT_KV_DTYPE

    def stage(self, start: int, end: int) -> StageBytes:
        return self.profile.stage(start, end, self.max_seq_len, kv_bytes=KV_DTYPE_BYTES[self.kv_dtype])

    def compute_layers(self, start: int, end: int) -> float:
        """A stage's decode work in layers: its blocks' weight bytes, plus the head's on the last stage, over a mean
        block's. A one-row decode step reads each weight once, so its time goes with them; the token embedding is a
        lookup of one row, not counted. (A Mixture-of-Experts block reads only the experts a token routes to, but
        its bytes count every expert: every block is overstated alike, so only the head counts for less than it
        costs there, and the last stage's host measures a little slower than it is.)"""
        weights = self.profile.layer_weights
        mean = sum(weights) / len(weights)
        head = self.profile.head if end == len(weights) else 0
        return (sum(weights[start:end]) + head) / mean


def run_slots(need: StageBytes, memory_bytes: int, max_slots: int) -> int | None:
    """The run slots (one KV cache each) that fit in a node's memory beside what the stage holds once, at most
    `max_slots`; 0: not even one (the stage does not fit). None: the node did not advertise its memory."""
    if not memory_bytes:
        return None
    return min(max_slots, max(0, (memory_bytes - need.shared) // need.kv_cache))


@dataclass(frozen=True)
class Placement:
    nodes: tuple[NodeInfo, ...]
    ranges: tuple[tuple[int, int], ...]  # () when only the nodes were chosen (no model to split)
    needs: tuple[StageBytes, ...] = ()  # per stage, when the model's memory is known
    # "balanced" | "memory" (in proportion) | "fitted" (largest share minimised) | "speed" (inverse to ms per layer)
    # | "kept" (the last run's blocks on these units) | "joined" (the blocks of the runs in flight it joins)
    split: str = "balanced"
    slots: tuple[int | None, ...] = ()  # per stage with `needs`: run_slots (None: its node's memory is unknown)
    # The token ring's round trip over these nodes (Network.ring_ms: unmeasured hops as the mean of the measured
    # ones); 0 when placed without a network or with no RTT measured. The run's step and first-token timeouts grow
    # with it (run_messages.Timeouts.for_ring).
    ring_ms: float = 0.0
    # Per stage with `ranges`: its decode work in layers (MemoryNeed.compute_layers; its block count when the model's
    # memory is unknown). The worker divides its steps' time by it (ProvisionStage runtime.compute_layers).
    work: tuple[float, ...] = ()

    def compute_ms(self, k: int) -> float | None:
        """What a one-row decode step is predicted to take on stage k: its node's measured ms per layer x its work;
        None when its node has not measured its speed."""
        ms = self.nodes[k].ms_per_layer
        return ms * self.work[k] if ms and self.work else None

    def compute_ms_per_token(self) -> float | None:
        """What the stages' compute adds to a token of a run alone (they compute one after another); None unless
        every stage's node was measured."""
        each = [self.compute_ms(k) for k in range(len(self.ranges))]
        return None if not each or any(c is None for c in each) else sum(c for c in each if c is not None)

    def predicted_ms_per_token(self) -> float | None:
        """What a token of a run alone is predicted to take here: the stages' compute one after another plus each
        hop of the ring one way (half its RTT; the orchestrator's own time is the same wherever the stages go); None
        unless every stage's node was measured."""
        compute = self.compute_ms_per_token()
        return None if compute is None else compute + self.ring_ms / 2

    def over(self) -> list[int]:
        """The stages whose node cannot hold even one run slot beside what the stage holds once."""
        return [k for k, s in enumerate(self.slots) if s == 0]

    def describe_stage(self, k: int) -> str:
        (lo, hi), n, need = self.ranges[k], self.nodes[k], self.needs[k]
        offers = "the device offers" if n.devices > 1 else "the node offers"
        return (f"stage {k} (blocks {lo}..{hi}) on {n.where} needs {gib(need.total)} for one run slot "
                f"(weights {gib(need.weights)}, KV cache {gib(need.kv_cache)}, scratch {gib(need.scratch)}, "
                f"runtime {gib(need.runtime)}); {offers} {gib(n.memory_bytes)}")


class Shortfall(PlanError):
    """No split of the blocks over the chosen nodes fits their memory; `placement` is the closest one tried."""

    def __init__(self, placement: Placement) -> None:
        stages = "; ".join(placement.describe_stage(k) for k in placement.over())
        super().__init__(f"the model does not fit the nodes' memory: {stages}", common_pb2.RUN_FAULT_DEVICE_OUT_OF_MEMORY)
        self.placement = placement


def gib(n: int) -> str:
    """A memory size for people: MiB below a GiB (a small model's parts), GiB above."""
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def balanced_ranges(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges covering 0..num_layers; earlier stages take the remainder."""
    return proportional_ranges(num_layers, [1] * stages)


def proportional_ranges(num_layers: int, weights: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous ranges covering 0..num_layers: one block each, the rest in proportion to `weights` (largest
    remainder; ties go to the earlier stage)."""
    stages = len(weights)
    if stages < 1:
        raise PlanError(f"stage count must be at least 1, got {stages}", common_pb2.RUN_FAULT_MODEL_REFUSED)
    if stages > num_layers:
        raise PlanError(f"{stages} stages requested but the model has only {num_layers} blocks",
                        common_pb2.RUN_FAULT_MODEL_REFUSED)
    rest, total = num_layers - stages, sum(weights)
    quotas = [rest * w for w in weights]  # each over `total`: integer arithmetic, so equal weights tie exactly
    counts = [1 + q // total for q in quotas]
    by_remainder = sorted(range(stages), key=lambda k: (-(quotas[k] % total), k))
    for k in by_remainder[:num_layers - sum(counts)]:
        counts[k] += 1
    return _ranges(counts)


def speed_counts(num_layers: int, ms_per_layer: Sequence[float], fixed: Mapping[int, int] | None = None) -> list[int]:
    """Blocks per stage in inverse proportion to its host's measured ms per layer (largest remainder, at least one
    each). A stage whose host is not measured (0) takes its balanced share; one in `fixed` (stage -> blocks: what fits
    its memory) takes that; the measured ones split the rest."""
    stages = len(ms_per_layer)
    if any(ms < 0 or not math.isfinite(ms) for ms in ms_per_layer):
        raise ValueError(f"ms_per_layer must be finite and >= 0 (0: not measured), got {list(ms_per_layer)}")
    balanced = [hi - lo for lo, hi in balanced_ranges(num_layers, stages)]
    fixed = dict(fixed or {})
    for k, ms in enumerate(ms_per_layer):
        if not ms and k not in fixed:
            fixed[k] = balanced[k]
    free = [k for k in range(stages) if k not in fixed]
    counts = [fixed.get(k, 0) for k in range(stages)]
    rest = num_layers - sum(counts)
    if free and rest >= len(free):
        # integer weights so that equal speeds tie exactly: 1e9 / µs per layer
        weights = [max(1, round(1e9 / (ms_per_layer[k] * 1000))) for k in free]
        for k, c in zip(free, _apportion(rest, weights), strict=True):
            counts[k] = c
    elif free:  # what is fixed leaves less than a block each for the others: one each, the fixed ones give way
        for k in free:
            counts[k] = 1
    return counts


def _apportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` in proportion to `weights` (largest remainder, ties to the earlier), at least one each (taken from the
    largest). Unlike proportional_ranges, the whole total is in proportion: one block each first would give a host 4x
    as slow noticeably more than a quarter of a small model."""
    whole = sum(weights)
    quotas = [total * w for w in weights]
    counts = [q // whole for q in quotas]
    for k in sorted(range(len(weights)), key=lambda k: (-(quotas[k] % whole), k))[:total - sum(counts)]:
        counts[k] += 1
    for k, c in enumerate(counts):
        if c == 0:
            counts[k] = 1
            counts[max(range(len(counts)), key=lambda j: (counts[j], -j))] -= 1
    return counts


def _ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def slowest_blocks_ms(placement: Placement) -> float | None:
    """The slowest stage's blocks' predicted time: its node's ms per layer x its block count (what the speed split
    balances; the last stage's head is not split), a node not measured counted as the mean of the measured ones. None
    with fewer than two nodes measured: nothing to compare a host with."""
    measured = [n.ms_per_layer for n in placement.nodes if n.ms_per_layer]
    if len(measured) < 2:
        return None
    mean = sum(measured) / len(measured)
    return max((n.ms_per_layer or mean) * (hi - lo) for n, (lo, hi) in zip(placement.nodes, placement.ranges, strict=True))


def quicker(candidate: Placement, than: Placement) -> bool:
    """Whether `candidate` fits and a token is predicted to take at most QUICKER_SHARE of its time on `than`."""
    new, old = candidate.predicted_ms_per_token(), than.predicted_ms_per_token()
    return not candidate.over() and new is not None and old is not None and new <= QUICKER_SHARE * old


def faster(candidate: Placement, than: Placement) -> bool:
    """Whether `candidate` fits and its slowest stage's blocks are predicted at least SPEED_GAIN faster than `than`'s."""
    new, old = slowest_blocks_ms(candidate), slowest_blocks_ms(than)
    return not candidate.over() and new is not None and old is not None and new <= (1 - SPEED_GAIN) * old


def speed_ranges(nodes: Sequence[NodeInfo], num_layers: int, memory: MemoryNeed | None) -> list[tuple[int, int]]:
    """`speed_counts` over the nodes' measured ms per layer, within their memory: a stage whose share does not fit
    keeps the most blocks that fit at its start and the others split the rest by speed, until every stage fits or no
    stage gives way (the caller then tries the memory-fitted split)."""
    speeds = [n.ms_per_layer for n in nodes]
    fixed: dict[int, int] = {}
    while True:
        counts = speed_counts(num_layers, speeds, fixed)
        if sum(counts) != num_layers:  # the stages held to their memory leave too few blocks for the others
            return balanced_ranges(num_layers, len(nodes))
        ranges = _ranges(counts)
        if memory is None:
            return ranges
        grown = False
        for k, (lo, hi) in enumerate(ranges):
            if k in fixed or not nodes[k].memory_bytes or memory.stage(lo, hi).total <= nodes[k].memory_bytes:
                continue
            fits = max(lo + 1, hi - 1)  # at least one block: a stage whose one block does not fit stays over
            while fits > lo + 1 and memory.stage(lo, fits).total > nodes[k].memory_bytes:
                fits -= 1
            fixed[k] = fits - lo
            grown = True
        if not grown:
            return ranges


def fitted_ranges(nodes: Sequence[NodeInfo], num_layers: int, memory: MemoryNeed) -> list[tuple[int, int]]:
    """The split whose largest share of a node's memory used is smallest (bisection on that share; for a share, each
    stage in turn takes as many blocks as fit, leaving one for every later stage)."""

    def split(share: float) -> list[tuple[int, int]] | None:
        out, start = [], 0
        for k, n in enumerate(nodes):
            last = k == len(nodes) - 1
            end = num_layers if last else start + 1
            if memory.stage(start, end).total > share * n.memory_bytes:
                return None
            while not last and end < num_layers - (len(nodes) - k - 1) and \
                    memory.stage(start, end + 1).total <= share * n.memory_bytes:
                end += 1
            out.append((start, end))
            start = end
        return out

    lo, hi = 0.0, 1.0
    while split(hi) is None:
        lo, hi = hi, hi * 2
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if split(mid) is not None else (mid, hi)
    best = split(hi)
    assert best is not None
    return best


def pool_units(pool: Sequence[NodeInfo]) -> list[NodeInfo]:
    """The provisionable nodes' units (NodeInfo.units), in (node id, device) order."""
    return [u for n in sorted(pool, key=lambda n: n.node_id) if n.provisionable for u in n.units()]


def shortage(stages: int, pool: Sequence[NodeInfo]) -> str:
    """Why the pool cannot take `stages` stages: it has fewer stage devices on its provisionable nodes."""
    ready = [n for n in pool if n.provisionable]
    return (f"{stages} stage(s) need {stages} stage device(s), the pool has {len(pool_units(ready))} on "
            f"{len(ready)} Available node(s)")


def pinned_units(pool: Sequence[NodeInfo], node_ids: Sequence[int]) -> tuple[NodeInfo, ...]:
    """The pins as units, in their order: a node named again takes its next device."""
    ready = {n.node_id: n for n in pool if n.provisionable}
    missing = [n for n in node_ids if n not in ready]
    if missing:
        raise PlanError(f"requested node(s) {missing} are not Available in the pool")
    taken: dict[int, int] = {}
    out = []
    for node_id in node_ids:
        device = taken[node_id] = taken.get(node_id, -1) + 1
        units = ready[node_id].units()
        if device >= len(units):
            raise PlanError(f"node {node_id} is named {node_ids.count(node_id)} times but has "
                            f"{len(units)} stage device(s)")
        out.append(units[device])
    return tuple(out)


def choose_nodes(pool: Sequence[NodeInfo], stages: int, node_ids: Sequence[int] = (),
                 by_memory: bool = False, network: Network | None = None) -> tuple[NodeInfo, ...]:
    """The units of the pinned nodes in their order, else `stages` provisionable units: with a network, the
    cheapest ring among them all (the most memory ones only when `by_memory`: the fallback when that ring does not
    fit); without, the most memory first when `by_memory`, in (node id, device) order."""
    if node_ids:
        return pinned_units(pool, node_ids)
    ready = pool_units(pool)
    if len(ready) < stages:
        raise PlanError(shortage(stages, pool))
    if network is not None and not by_memory:
        return ring_order(ready, stages, network)
    # stable: equal memory keeps (node id, device) order, so a node's units are taken from device 0 up
    order = sorted(ready, key=lambda n: -n.memory_bytes) if by_memory else ready
    if network is not None:
        return ring_order(order[:stages], stages, network)
    return tuple(sorted(order[:stages], key=lambda n: n.unit))


def place(pool: Sequence[NodeInfo], stages: int, num_layers: int, node_ids: Sequence[int] = (),
          memory: MemoryNeed | None = None, network: Network | None = None,
          ranges: Sequence[tuple[int, int]] = ()) -> Placement:
    """Nodes and block ranges for a run; PlanError (Shortfall when it is memory) names why there are none. `ranges`
    (with `node_ids`): the blocks of the runs in flight it joins, taken as they are (split "joined")."""
    if num_layers:
        balanced_ranges(num_layers, stages)  # refuses a stage count the model cannot take, first
    if ranges:
        if not node_ids or len(ranges) != stages:
            raise PlanError(f"joining runs in flight needs their nodes pinned and one block range per stage; got "
                            f"{len(node_ids)} pin(s) and {len(ranges)} range(s) for {stages} stage(s)")
        return _with_ring(_joined(pinned_units(pool, node_ids), ranges, memory), network)
    if network is not None and not node_ids and memory is not None:
        chosen: Placement | None = None
        with contextlib.suppress(Shortfall):  # the cheapest ring first; the units with the most memory when it does not fit
            chosen = _with_ring(_place_on(choose_nodes(pool, stages, network=network), num_layers, memory, network),
                                network)
        if chosen is None:
            chosen = _with_ring(_place_on(choose_nodes(pool, stages, by_memory=True, network=network), num_layers,
                                          memory, network), network)
        quick = _on_fastest(pool, stages, num_layers, memory, network)
        return quick if quick is not None and quicker(quick, than=chosen) else chosen
    return _with_ring(_place_on(choose_nodes(pool, stages, node_ids, by_memory=memory is not None, network=network),
                                num_layers, memory, network), network)


def _on_fastest(pool: Sequence[NodeInfo], stages: int, num_layers: int, memory: MemoryNeed,
                network: Network) -> Placement | None:
    """The `stages` fastest measured units in their cheapest ring order, split as any placement is; None when fewer
    are measured, when it does not fit, or when the operator keeps the memory split ([orchestrator].split_by_speed)."""
    measured = [u for u in pool_units(pool) if u.ms_per_layer]
    if not network.by_speed or len(measured) < stages:
        return None
    fastest = sorted(measured, key=lambda u: (u.ms_per_layer, u.unit))[:stages]
    try:
        return _with_ring(_place_on(ring_order(fastest, stages, network), num_layers, memory, network), network)
    except Shortfall:
        return None


def _with_ring(placement: Placement, network: Network | None) -> Placement:
    if network is None:
        return placement
    return dataclasses.replace(placement, ring_ms=network.ring_ms(placement.nodes))


def fewest_stages(pool: Sequence[NodeInfo], num_layers: int, memory: MemoryNeed | None,
                  network: Network | None = None) -> int:
    """The fewest stages whose placement fits the pool's memory now: each stage more is one hop more per token. 1 when
    the model's memory is unknown; the most the pool can take when none fits (the placement then names the shortfall)."""
    return _fewest(pool, num_layers, memory, network)[0]


def _fewest(pool: Sequence[NodeInfo], num_layers: int, memory: MemoryNeed | None,
            network: Network | None) -> tuple[int, Placement | None]:
    """fewest_stages, with the placement that fits at that count (None when memory is unknown or none fits)."""
    most = min(num_layers, len(pool_units(pool)))
    if memory is None or most < 1:
        return 1, None
    for stages in range(1, most + 1):
        try:
            return stages, place(pool, stages, num_layers, memory=memory, network=network)
        except Shortfall:
            continue
    return most, None


def stage_count(pool: Sequence[NodeInfo], num_layers: int, memory: MemoryNeed | None,
                network: Network | None = None) -> int:
    """The stages of a run that leaves their count open: the fewest that fit (`fewest_stages`: a run alone computes
    its stages one after another, and each stage more is a hop more), unless up to MORE_STAGES_TRIED more are
    predicted `quicker` per token (the fastest measured hosts hold the model only together); the quickest of those."""
    fewest, base = _fewest(pool, num_layers, memory, network)
    if network is None or base is None:
        return fewest
    best, chosen = base, fewest
    for stages in range(fewest + 1, min(num_layers, len(pool_units(pool)), fewest + MORE_STAGES_TRIED) + 1):
        try:
            candidate = place(pool, stages, num_layers, memory=memory, network=network)
        except PlanError:
            continue
        if quicker(candidate, than=base) and _predicted(candidate) < _predicted(best):
            best, chosen = candidate, stages
    return chosen


def _predicted(placement: Placement) -> float:
    ms = placement.predicted_ms_per_token()
    return math.inf if ms is None else ms


def _joined(nodes: tuple[NodeInfo, ...], ranges: Sequence[tuple[int, int]], memory: MemoryNeed | None) -> Placement:
    """The runs in flight's blocks on their nodes: speeds measured since they were placed do not move them (the run
    shares their resident weights); memory is still checked (a node may advertise less now)."""
    placement = _split(nodes, ranges, memory, "joined")
    if placement.over():
        raise Shortfall(placement)
    return placement


def _place_on(nodes: tuple[NodeInfo, ...], num_layers: int, memory: MemoryNeed | None,
              network: Network | None) -> Placement:
    if not num_layers:
        return Placement(nodes, ())
    placement = _by_memory(nodes, num_layers, memory)
    if network is not None and not network.by_speed:
        return placement
    speed = _split(nodes, speed_ranges(nodes, num_layers, memory), memory, "speed")
    if faster(speed, than=placement):
        placement = speed
    kept = network.warm_blocks.get(tuple(n.unit for n in nodes)) if network is not None else None
    if kept and kept != placement.ranges and slowest_blocks_ms(placement) is not None:
        last = _split(nodes, kept, memory, "kept")
        if not last.over() and not faster(placement, than=last):
            placement = last
    return placement


def _by_memory(nodes: tuple[NodeInfo, ...], num_layers: int, memory: MemoryNeed | None) -> Placement:
    """The split without speed: in proportion to memory (balanced when a node's is unknown), else the memory-fitted
    one; Shortfall when neither fits."""
    known = memory is not None and all(n.memory_bytes for n in nodes)
    ranges = proportional_ranges(num_layers, [n.memory_bytes for n in nodes]) if known else \
        balanced_ranges(num_layers, len(nodes))
    placement = _split(nodes, ranges, memory, "memory" if known else "balanced")
    if placement.over() and memory is not None and known:
        placement = _split(nodes, fitted_ranges(nodes, num_layers, memory), memory, "fitted")
    if placement.over():
        raise Shortfall(placement)
    return placement


def _split(nodes: tuple[NodeInfo, ...], ranges: Sequence[tuple[int, int]], memory: MemoryNeed | None,
           split: str) -> Placement:
    if memory is None:
        return Placement(nodes, tuple(ranges), split=split, work=tuple(float(hi - lo) for lo, hi in ranges))
    return _sized(nodes, ranges, memory, split)


def _sized(nodes: tuple[NodeInfo, ...], ranges: Sequence[tuple[int, int]], memory: MemoryNeed, split: str) -> Placement:
    needs = tuple(memory.stage(lo, hi) for lo, hi in ranges)
    slots = tuple(run_slots(need, n.memory_bytes, memory.max_slots) for n, need in zip(nodes, needs, strict=True))
    work = tuple(memory.compute_layers(lo, hi) for lo, hi in ranges)
    return Placement(nodes, tuple(ranges), needs, split, slots, work=work)
