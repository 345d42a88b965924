"""Whether the node is offered to the orchestrator (NodeAvailable, §8), and when it retires: an I/O-free core.

The node is Available when three things hold: the arena is mapped (at boot, before this core exists,
and for as long as the arena-manager keeps the hand-out connection), the compute process said
WorkerReady, and the edge-driver answers. It is withdrawn (membership FAULTED, with
RUN_FAULT_WORKER_CRASHED when the worker is the reason, RUN_FAULT_NODE_UNAVAILABLE otherwise) when
one of them goes, and offered again when it comes back.

The arena-manager's death is final for this process: its memfd is gone, and the new arena-manager
hands out another one nobody here has mapped. Then the running stage must fault (fail-stop, naming
the arena) and tear down; meanwhile the node's membership state is held as it is, so that membership
does not report the node lost before the stage reported its own fault. Once no run is left the node
retires (the service exits for its manager to restart it on the new arena) and is withdrawn for good.

    inputs:  Worker(ready)  Driver(up)  ArenaGone(detail)  StageSettled(state)
    actions: Offer  Withdraw(reason)  FailStopRun(detail)  Retire(detail)

The shell adds the worker generation to what it reports and performs the actions in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.common.events import get_logger
from swactor.v1 import common_pb2
from swactor.worker.stage_fsm import StageState

# ---- inputs ----


@dataclass(frozen=True)
class Worker:
    """The compute process said WorkerReady (`ready`), or crashed or never became ready."""

    ready: bool


@dataclass(frozen=True)
class Driver:
    """The edge-driver answered (its status or an event), or its event stream ended."""

    up: bool


@dataclass(frozen=True)
class ArenaGone:
    """The arena-manager's hand-out connection ended."""

    detail: str


@dataclass(frozen=True)
class StageSettled:
    """The node's stage is now in `state` (None: never provisioned): the node may retire once idle."""

    state: StageState | None


Input = Worker | Driver | ArenaGone | StageSettled

# ---- actions ----


@dataclass(frozen=True)
class Offer:
    """Report the node Available (membership SetLocalState AVAILABLE with the control endpoint)."""


@dataclass(frozen=True)
class Withdraw:
    """Report the node FAULTED for `reason` (a RunFaultReason)."""

    reason: int


@dataclass(frozen=True)
class FailStopRun:
    """Fault the run on this node (RUN_FAULT_NODE_UNAVAILABLE by COMPONENT_ARENA) and stop it."""

    detail: str


@dataclass(frozen=True)
class Retire:
    """No run is left on a node whose arena is gone: the service should exit."""

    detail: str


Action = Offer | Withdraw | FailStopRun | Retire

# states in which no run is left on the node's stage
_IDLE = frozenset({None, StageState.STOPPED, StageState.UNPROVISIONED})


@dataclass
class NodeAvailability:
    node_id: int
    worker_ready: bool = False
    driver_up: bool = False
    arena_gone: str | None = None  # why, once the arena-manager's hand-out connection ended
    retired: bool = False
    available: bool = False  # what membership was last told

    def handle(self, inp: Input) -> list[Action]:
        match inp:
            case Worker(ready):
                if ready == self.worker_ready:
                    return []
                self.worker_ready = ready
                return self._recheck()
            case Driver(up):
                if up == self.driver_up:
                    return []
                self.driver_up = up
                return self._recheck()
            case ArenaGone(detail):
                if self.arena_gone is not None:
                    return []
                self.arena_gone = detail
                return [FailStopRun(detail)]
            case StageSettled(state):
                if self.arena_gone is None or self.retired or state not in _IDLE:
                    return []
                get_logger(node_id=self.node_id, component="stage_node").info("node_retiring", detail=self.arena_gone)
                self.retired = True
                return [Retire(self.arena_gone), *self._recheck()]
        raise TypeError(f"unknown availability input {inp!r}")  # pragma: no cover

    def _recheck(self) -> list[Action]:
        if self.arena_gone is not None and not self.retired:
            return []  # held until retired: membership must not beat the stage's own fault report
        now = self.worker_ready and self.driver_up and self.arena_gone is None
        if now == self.available:
            return []
        self.available = now
        get_logger(node_id=self.node_id, component="stage_node").info(
            "node_available" if now else "node_unavailable", worker_ready=self.worker_ready,
            driver_up=self.driver_up, arena_up=self.arena_gone is None)
        if now:
            return [Offer()]
        reason = common_pb2.RUN_FAULT_WORKER_CRASHED if not self.worker_ready else common_pb2.RUN_FAULT_NODE_UNAVAILABLE
        return [Withdraw(reason)]
