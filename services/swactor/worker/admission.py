"""Run admission on a stage node: which ProvisionStage may take the node's stage now, who may stop or
follow a run, and which runs the node remembers. An I/O-free core.

The policy today is one stage slot per node, so one run at a time (§43 defers several runs on one
stage chain):

- only an orchestrator may provision (the caller's certificate names one), only the pinned one when
  the node is pinned, only in its own name, and only a plan addressed to this node: PERMISSION_DENIED;
- a run id is provisioned here once: ALREADY_EXISTS;
- the slot is free once its run's stage Stopped. While that stage is Faulted or Stopping the refusal is
  ABORTED (the teardown is bounded: the caller may try again); while it is active, FAILED_PRECONDITION;
- the compute process must have said WorkerReady, and the arena-manager must still be there:
  FAILED_PRECONDITION.

A later run takes the slot like any other. Whether it finds its weights resident (a warm
ConfigureRole) is the compute process's answer (process/roleslot.py), which the run's StageReady
carries as `warm_weights`.

StopRun and WatchStage of a run come only from the orchestrator that provisioned it (spec §4). A run
stays known after its stage stopped, so that WatchStage can replay it; of the finished runs only the
newest KEEP_FINISHED_RUNS are kept, and admitting a run names the older ones to forget.

`check` runs before the plan is built, so a refused request costs nothing; `admit` records the run once
its plan proved valid. Several runs in flight, each with its own KV slot, replace this one class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swactor.common.events import get_logger
from swactor.v1 import stage_pb2
from swactor.worker.stage_fsm import StageState

KEEP_FINISHED_RUNS = 16

_TEARING_DOWN = frozenset({StageState.FAULTED, StageState.STOPPING})


@dataclass(frozen=True)
class Ask:
    """A ProvisionStage, as admission sees it."""

    run_id: int
    node_id: int  # the node the plan is addressed to
    orchestrator_node_id: int  # the orchestrator the plan names
    caller: int | None  # the orchestrator the caller's certificate names, None when it names none

    @classmethod
    def of(cls, req: stage_pb2.ProvisionStageRequest, caller: int | None) -> Ask:
        return cls(req.run_id, req.node_id, req.orchestrator_node_id, caller)


@dataclass(frozen=True)
class Slot:
    """The node's stage: the run on it (0 before its plan) and its StageController state."""

    run_id: int
    state: StageState


@dataclass(frozen=True)
class Refused:
    """`code` is the gRPC status name the servicer answers with."""

    code: str
    detail: str


@dataclass(frozen=True)
class Admitted:
    run_id: int
    forget: tuple[int, ...]  # finished runs now dropped from the history, oldest first


@dataclass
class _Run:
    orchestrator_node_id: int  # who provisioned it: the only caller of StopRun / WatchStage for it
    finished: bool = False


_NO_ORCHESTRATOR = Refused("PERMISSION_DENIED", "the caller's certificate names no orchestrator")


@dataclass
class RunAdmission:
    node_id: int
    orchestrator_node_id: int | None = None  # the pinned orchestrator; None: any
    keep_finished: int = KEEP_FINISHED_RUNS
    runs: dict[int, _Run] = field(default_factory=dict)  # every run remembered, in provisioning order

    def check(self, ask: Ask, slot: Slot | None, *, worker_ready: bool, arena_gone: str | None) -> Refused | None:
        """Whether `ask` may take the node's stage now (None) or why not, in the order the answers take."""
        caller = ask.caller
        if caller is None:
            return _NO_ORCHESTRATOR
        if self.orchestrator_node_id is not None and caller != self.orchestrator_node_id:
            return Refused("PERMISSION_DENIED", f"orchestrator {caller} is not the authorised "
                                                f"orchestrator {self.orchestrator_node_id}")
        if ask.orchestrator_node_id != caller:
            return Refused("PERMISSION_DENIED", f"orchestrator_node_id {ask.orchestrator_node_id} is not the "
                                                f"caller ({caller})")
        if ask.node_id != self.node_id:
            return Refused("PERMISSION_DENIED", f"plan is addressed to node {ask.node_id}, this is node {self.node_id}")
        if ask.run_id in self.runs:
            return Refused("ALREADY_EXISTS", f"run {ask.run_id} is already provisioned on this node")
        if slot is not None and slot.state is not StageState.STOPPED:
            if slot.state in _TEARING_DOWN:
                return Refused("ABORTED", f"run {slot.run_id} is still tearing down here")
            return Refused("FAILED_PRECONDITION", f"run {slot.run_id} is still active here")
        if not worker_ready:
            return Refused("FAILED_PRECONDITION", "the GPU worker is not ready (WorkerReady not seen)")
        if arena_gone is not None:
            return Refused("FAILED_PRECONDITION", f"the node's arena-manager is gone: {arena_gone}")
        return None

    def admit(self, ask: Ask) -> Admitted:
        """Record `ask` (checked, its plan valid) as the run on the node's stage."""
        assert ask.caller is not None and ask.run_id not in self.runs
        finished = [r for r, run in self.runs.items() if run.finished]
        forget = tuple(finished[:-self.keep_finished or None])  # bounded history: only recent finished runs
        for old in forget:
            del self.runs[old]
        self.runs[ask.run_id] = _Run(ask.caller)
        return Admitted(ask.run_id, forget)

    def finished(self, run_id: int) -> None:
        """The run's stage stopped here (its history may now be forgotten in turn)."""
        run = self.runs.get(run_id)
        if run is not None:
            run.finished = True

    def authorize(self, run_id: int, caller: int | None) -> Refused | None:
        """StopRun / WatchStage of `run_id` by `caller`: refused unless the caller provisioned it. An
        unknown run passes (the call itself answers known=false / NOT_FOUND)."""
        if caller is None:
            return _NO_ORCHESTRATOR
        run = self.runs.get(run_id)
        if run is not None and run.orchestrator_node_id != caller:
            get_logger(node_id=self.node_id, component="stage_node").warning(
                "run_call_refused", run_id=run_id, caller=caller, provisioned_by=run.orchestrator_node_id)
            return Refused("PERMISSION_DENIED", f"run {run_id} was provisioned by orchestrator "
                                                f"{run.orchestrator_node_id}, not {caller}")
        return None
