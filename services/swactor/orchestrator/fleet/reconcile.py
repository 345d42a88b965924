"""Restart reconciliation (issue 12): what a previous orchestrator process left in flight is torn down.

The store marks every run the previous process left unfinished as faulted
(RUN_FAULT_ORCHESTRATOR_RESTARTED, store.recover). Those runs may still hold stages on the pool
(Ready, Executing or Faulted: a stage leaves them only on StopRun or when its lease expires) and
token edges on this host's edge-driver, whose pumps keep the dead process's ring leases attached.
This core drives their §38 teardown to the end:

- every placed stage of such a run gets StopRun, retried (with backoff) until the node answers or
  it is gone from the pool (Dead/Left in the view, or absent from it for `absent_grace_s`); a node
  that still knew the run is followed (WatchStage) until StageStopped or `confirm_timeout_s`;
- the run's token edges (and any arena lease of a dead orchestrator holder) are stopped on the
  local edge-driver, so the driver detaches and the arena reclaims the ranges (their owner, the
  previous process, is gone: the arena ended its owner holds when its pid exited);
- the run's events get stop_run_sent / stage_stopped per stage and one run_torn_down, carrying
  RUN_FAULT_TEARDOWN_TIMEOUT and naming what was left when not everything was confirmed.

While a node still holds such a run it is masked as Booting in the orchestrator's view
(`mask_view`), so new runs wait for it instead of being refused ("run ... is still active here").

An I/O-free core: `handle(input, now) -> actions`, `deadline()`; reconcile_shell.py is the I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from swactor.common.events import get_logger
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

K = pb.LifecycleEventKind
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0


@dataclass(frozen=True)
class Leftover:
    """One run the previous process left unfinished: where its stages were placed, its token edges."""

    run_id: int
    stages: tuple[tuple[int, int], ...]  # (stage_index, node_id)
    token_edges: tuple[int, ...]

    @classmethod
    def of(cls, run: opb.Run) -> Leftover:
        placed = sorted(run.placement, key=lambda p: p.stage_index)
        edges = (placed[0].inbound_edge_id, placed[-1].outbound_edge_id) if placed else ()
        return cls(run.run_id, tuple((p.stage_index, p.node_id) for p in placed), tuple(e for e in edges if e))


class TargetState(enum.Enum):
    WAITING_NODE = "WaitingNode"  # not (yet) in the view with a control endpoint
    STOPPING = "Stopping"         # StopRun in flight
    RETRY = "Retry"               # StopRun failed: again at retry_at
    CONFIRMING = "Confirming"     # the node knew the run: WatchStage until StageStopped
    STOPPED = "Stopped"           # terminal: confirmed, or the node no longer held the run
    GONE = "Gone"                 # terminal: the node left the pool (its run state died with it)
    UNCONFIRMED = "Unconfirmed"   # terminal: acknowledged, but no StageStopped within confirm_timeout_s


TERMINAL = (TargetState.STOPPED, TargetState.GONE, TargetState.UNCONFIRMED)


@dataclass
class Target:
    run_id: int
    stage_index: int
    node_id: int
    state: TargetState = TargetState.WAITING_NODE
    attempts: int = 0
    since: float = 0.0      # entered the current state
    retry_at: float = 0.0
    last_error: str = ""
    sent: bool = False      # stop_run_sent emitted


@dataclass(frozen=True)
class _Stage:
    """Messages about one leftover stage list its run and index first."""

    run_id: int
    stage_index: int


# ---- inputs ----


@dataclass(frozen=True)
class View:
    members: tuple[NodeInfo, ...]


@dataclass(frozen=True)
class StopAnswered(_Stage):
    known: bool  # the node held the run (it now stops it); False: nothing to stop


@dataclass(frozen=True)
class StopFailed(_Stage):
    """The StopRun call failed."""

    detail: str


@dataclass(frozen=True)
class StageStoppedSeen(_Stage):
    """The node reported the stage's StageStopped."""


@dataclass(frozen=True)
class ConfirmLost(_Stage):
    """The WatchStage that follows a stopping stage broke before StageStopped."""

    detail: str


@dataclass(frozen=True)
class LocalReleased:
    """The run's local token edges were stopped; `left` names what is still leased ("" = nothing)."""

    run_id: int
    left: str = ""


@dataclass(frozen=True)
class Tick:
    pass


Input = View | StopAnswered | StopFailed | StageStoppedSeen | ConfirmLost | LocalReleased | Tick

# ---- actions ----


@dataclass(frozen=True)
class SendStopRun(_Stage):
    node: NodeInfo


@dataclass(frozen=True)
class WatchUntilStopped(_Stage):
    """Follow the stage's WatchStage until StageStopped (StageStoppedSeen | ConfirmLost)."""

    node: NodeInfo


@dataclass(frozen=True)
class ReleaseLocal:
    run_id: int
    edge_ids: tuple[int, ...]


@dataclass(frozen=True)
class Emit:
    event: pb.LifecycleEvent


@dataclass(frozen=True)
class ViewChanged:
    """Which nodes are masked changed: re-publish the view (mask_view)."""


Action = SendStopRun | WatchUntilStopped | ReleaseLocal | Emit | ViewChanged


@dataclass
class Reconciler:
    leftovers: tuple[Leftover, ...]
    absent_grace_s: float = 10.0
    confirm_timeout_s: float = 30.0
    targets: dict[tuple[int, int], Target] = field(default_factory=dict)
    local_left: dict[int, str | None] = field(default_factory=dict)  # run_id -> None while releasing
    finished: set[int] = field(default_factory=set)
    members: dict[int, NodeInfo] = field(default_factory=dict)
    first_view_at: float | None = None
    started: bool = False

    def __post_init__(self) -> None:
        for run in self.leftovers:
            for index, node_id in run.stages:
                self.targets[(run.run_id, index)] = Target(run.run_id, index, node_id)

    # ---- queries ----

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.leftovers)

    def busy_nodes(self) -> dict[int, tuple[int, ...]]:
        """node_id -> the leftover runs the node may still hold (several: runs in flight shared its stage)."""
        busy: dict[int, set[int]] = {}
        for t in self.targets.values():
            if t.state not in TERMINAL:
                busy.setdefault(t.node_id, set()).add(t.run_id)
        return {node_id: tuple(sorted(runs)) for node_id, runs in busy.items()}

    def mask_view(self, members: tuple[NodeInfo, ...]) -> tuple[NodeInfo, ...]:
        busy = self.busy_nodes()
        return tuple(dataclasses.replace(m, state=NodeState.BOOTING, reason=_tearing_down(busy[m.node_id]))
                     if m.node_id in busy and m.state is NodeState.AVAILABLE else m for m in members)

    def deadline(self) -> float | None:
        times = []
        for t in self.targets.values():
            if t.state is TargetState.RETRY:
                times.append(t.retry_at)
            elif t.state is TargetState.CONFIRMING:
                times.append(t.since + self.confirm_timeout_s)
            elif t.state is TargetState.WAITING_NODE and self.first_view_at is not None and t.node_id not in self.members:
                times.append(max(t.since, self.first_view_at) + self.absent_grace_s)
        return min(times, default=None)

    # ---- the one entry point ----

    def handle(self, inp: Input, now: float) -> list[Action]:
        out: list[Action] = []
        busy = set(self.busy_nodes())
        if not self.started:
            self.started = True
            self._start(now, out)
        match inp:
            case View(members):
                self.members = {m.node_id: m for m in members}
                if self.first_view_at is None:
                    self.first_view_at = now
            case StopAnswered(run_id, index, known):
                t = self.targets.get((run_id, index))
                if t is not None and t.state is TargetState.STOPPING:
                    if known:
                        self._set(t, TargetState.CONFIRMING, now)
                        out.append(WatchUntilStopped(run_id, index, self.members.get(t.node_id) or _unknown(t)))
                    else:
                        self._stopped(t, now, out, "the node no longer held the run")
            case StopFailed(run_id, index, detail) | ConfirmLost(run_id, index, detail):
                t = self.targets.get((run_id, index))
                if t is not None and t.state in (TargetState.STOPPING, TargetState.CONFIRMING):
                    t.last_error = detail
                    t.retry_at = now + min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, t.attempts - 1))
                    self._set(t, TargetState.RETRY, now, error=detail)
            case StageStoppedSeen(run_id, index):
                t = self.targets.get((run_id, index))
                if t is not None and t.state in (TargetState.CONFIRMING, TargetState.RETRY, TargetState.STOPPING):
                    self._stopped(t, now, out, "")
            case LocalReleased(run_id, left):
                if run_id in self.local_left:
                    self.local_left[run_id] = left
        self._advance(now, out)
        if set(self.busy_nodes()) != busy:
            out.append(ViewChanged())
        return out

    # ---- transitions ----

    def _set(self, t: Target, new: TargetState, now: float, **facts: object) -> None:
        old, t.state, t.since = t.state, new, now
        get_logger(run_id=t.run_id, component="reconcile").info(
            "reconcile_stage_state", stage_index=t.stage_index, node_id=t.node_id, old=old.value, new=new.value,
            **facts)

    def _start(self, now: float, out: list[Action]) -> None:
        for t in self.targets.values():
            t.since = now
        for run in self.leftovers:
            self.local_left[run.run_id] = None
            out.append(ReleaseLocal(run.run_id, run.token_edges))

    def _stopped(self, t: Target, now: float, out: list[Action], detail: str) -> None:
        self._set(t, TargetState.STOPPED, now)
        out.append(Emit(_ev(K.STAGE_STOPPED, t, component=pb.COMPONENT_ORCHESTRATOR, detail=detail)))

    def _gone(self, t: Target, node: NodeInfo | None, now: float) -> bool:
        """Dead or Left in the view, or absent from it for absent_grace_s since it could have appeared."""
        if node is not None:
            return node.state is NodeState.LEFT
        if t.state is not TargetState.WAITING_NODE or self.first_view_at is None:
            return False
        return now >= max(t.since, self.first_view_at) + self.absent_grace_s

    def _advance(self, now: float, out: list[Action]) -> None:
        for t in self.targets.values():
            if t.state in TERMINAL:
                continue
            node = self.members.get(t.node_id)
            if self._gone(t, node, now):
                self._set(t, TargetState.GONE, now)
                out.append(Emit(_ev(K.STAGE_STOPPED, t, reason=pb.RunFaultReason.Name(pb.RUN_FAULT_MEMBERSHIP_LOST),
                                    component=pb.COMPONENT_MEMBERSHIP, detail="the node is gone from the pool")))
                continue
            due = t.state is TargetState.WAITING_NODE or (t.state is TargetState.RETRY and now >= t.retry_at)
            reachable = node is not None and bool(node.control_endpoint)
            if due and not reachable and t.state is TargetState.RETRY:
                self._set(t, TargetState.WAITING_NODE, now)  # until the view shows it reachable, or it is gone
            elif due and reachable:
                assert node is not None
                t.attempts += 1
                self._set(t, TargetState.STOPPING, now, attempt=t.attempts)
                out.append(SendStopRun(t.run_id, t.stage_index, node))
                if not t.sent:
                    t.sent = True
                    out.append(Emit(_ev(K.STOP_RUN_SENT, t, component=pb.COMPONENT_ORCHESTRATOR,
                                        detail="reconciling after an orchestrator restart")))
            elif t.state is TargetState.CONFIRMING and now >= t.since + self.confirm_timeout_s:
                self._set(t, TargetState.UNCONFIRMED, now)
        for run in self.leftovers:
            if run.run_id not in self.finished:
                self._maybe_finished(run, out)

    def _maybe_finished(self, run: Leftover, out: list[Action]) -> None:
        targets = [self.targets[(run.run_id, i)] for i, _ in run.stages]
        left = self.local_left.get(run.run_id)
        if any(t.state not in TERMINAL for t in targets) or left is None:
            return
        self.finished.add(run.run_id)
        unconfirmed = [t for t in targets if t.state is TargetState.UNCONFIRMED]
        counters = {"stages_stopped": sum(t.state is not TargetState.UNCONFIRMED for t in targets),
                    "stages_unconfirmed": len(unconfirmed)}
        what = [f"no StageStopped from stage {t.stage_index} on node {t.node_id} within {self.confirm_timeout_s:g}s"
                for t in unconfirmed] + ([f"local token edges: {left}"] if left else [])
        ev = pb.LifecycleEvent(kind=K.RUN_TORN_DOWN, run_id=run.run_id, component=pb.COMPONENT_ORCHESTRATOR,
                               detail="reconciled after an orchestrator restart" + (": " + "; ".join(what) if what else ""))
        ev.counters.update(counters)
        if what:
            ev.reason = pb.RunFaultReason.Name(pb.RUN_FAULT_TEARDOWN_TIMEOUT)
        out.append(Emit(ev))
        get_logger(run_id=run.run_id, component="reconcile").info("reconcile_run_done", left="; ".join(what) or None,
                                                                  **counters)


def _tearing_down(runs: tuple[int, ...]) -> str:
    which = f"run {runs[0]}" if len(runs) == 1 else f"runs {', '.join(str(r) for r in runs)}"
    return f"tearing down {which} left by the previous orchestrator"


def _unknown(t: Target) -> NodeInfo:
    return NodeInfo(t.node_id, NodeState.LEFT)


def _ev(kind: int, t: Target, **fields: object) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(kind=kind, run_id=t.run_id, node_id=t.node_id, stage_index=t.stage_index,  # type: ignore[arg-type]
                             **fields)
