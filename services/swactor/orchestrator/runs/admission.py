"""Which waiting run starts now (docs/runs-in-flight.md "Admission"): the core, pure, no I/O.

The active runs form one group: they decode through the same stages at once, each in its own KV cache slot over
the stages' one copy of the weights. The lobby's head (first in, first out: only the head is ever considered)
starts when no run is active (placed on its own), or when it can join the group: the same model and stage count,
no pins or the group's nodes exactly, the group's nodes all still Available with the memory and stage devices they
were placed with, and a free slot (`Group.slots`). A joining run is pinned to the group's nodes and takes the group's
blocks (Demand.ranges: not a split by host speeds measured since), and its slots follow from its nodes' memory, so its
stages share the resident weights. A head that cannot join waits until the group drains, and every run behind it waits too: nothing
overtakes it, so no run starves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.planning.planner import RunPlan, Seat


@dataclass(frozen=True)
class Group:
    """What the active runs share: the model and the seats of its stages (the first active run's plan)."""

    model: str
    seats: tuple[Seat, ...]
    # Each seat's node memory as it was placed with: the blocks and slots a pinned run gets follow from it.
    node_memory: tuple[int, ...]

    @classmethod
    def of(cls, model: str, plan: RunPlan) -> Group:
        return cls(model, plan.seats(), tuple(s.node.memory_bytes for s in plan.stages))

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(s.node_id for s in self.seats)

    def slots(self, max_slots: int) -> int:
        """Runs the group holds at once: the fewest slots of any of its stages, at most `max_slots`."""
        return min(max_slots, *(s.run_slots for s in self.seats))


@dataclass(frozen=True)
class Candidate:
    """The lobby's head as admission sees it."""

    model: str
    stages: int
    node_ids: tuple[int, ...] = ()
    # A resumed request's run: it never joins the runs in flight, whose placement holds the part its run lost.
    joins_group: bool = True


@dataclass(frozen=True)
class Start:
    """Start the head now; `joins` is the group it joins (pin it there), None when it is placed on its own."""

    joins: Group | None = None


@dataclass(frozen=True)
class Wait:
    """The head (and every run behind it) waits; `why` says for what."""

    why: str


def admit(head: Candidate, active: int, group: Group | None, members: Sequence[NodeInfo], max_slots: int) -> Start | Wait:
    """Whether the head starts beside `active` runs whose shared placement is `group` (None: not placed yet)."""
    if active == 0:
        return Start()
    if group is None:
        return Wait("the runs in flight to be placed")
    if not head.joins_group:
        return Wait("the runs in flight on the placement its request lost a part of to finish (a resumed run is placed anew)")
    if head.model != group.model:
        return Wait(f"the runs of model {group.model!r} in flight to finish")
    if head.stages != len(group.seats):
        return Wait(f"the runs in flight on {len(group.seats)} stage(s) to finish")
    if head.node_ids and head.node_ids != group.node_ids:
        return Wait(f"the runs in flight on node(s) {_ids(group.node_ids)} to finish")
    view = {m.node_id: m for m in members}
    for seat, memory in zip(group.seats, group.node_memory, strict=True):
        m = view.get(seat.node_id)
        if m is None or not m.provisionable:
            return Wait(f"node {seat.node_id} of the runs in flight to be Available, or those runs to finish")
        if m.memory_bytes != memory:
            # its pinned placement would differ from the group's: the run would not share their weights
            return Wait(f"the runs in flight to finish (node {seat.node_id} advertises other memory now)")
        if seat.device >= m.devices:
            # pinned there, the run could not have this stage's device
            return Wait(f"the runs in flight to finish (node {seat.node_id} advertises {m.devices} stage device(s) now)")
    slots = group.slots(max_slots)
    if active >= slots:
        return Wait(f"a free run slot ({active} of {slots} in use)")
    return Start(group)


def _ids(ids: Sequence[int]) -> str:
    """Node ids for people, each once (a node may carry several stages, on several devices)."""
    return ", ".join(str(i) for i in dict.fromkeys(ids))
