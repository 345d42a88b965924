"""The teardown of a run whose FSM raised, as an I/O-free core beside fsm.py.

A RunFsm whose handle() raised can no longer be trusted to tear its own run down, so the runner hands the run
to this smaller machine: StopRun to every stage whose provisioning was sent, the token endpoints closed if
they were being opened, then a wait of at most the teardown timeout for StageStopped and EndpointsClosed.
RUN_TORN_DOWN names what was not confirmed, with RUN_FAULT_TEARDOWN_TIMEOUT (§38: a teardown always ends).

  Waiting -> Done    (everything confirmed, or the deadline passed)

It takes the run FSM's own inputs and gives its own actions (Emit, StopStage, CloseEndpoints), so the
runner performs both the same way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from swactor.orchestrator.planning.planner import StagePlan
from swactor.orchestrator.runs.run_messages import (
    Action,
    CloseEndpoints,
    Emit,
    EndpointsClosed,
    Input,
    StageStopped,
    StopStage,
)
from swactor.v1 import common_pb2 as pb


class FailureTeardownState(enum.Enum):
    WAITING = "Waiting"
    DONE = "Done"


@dataclass
class FailureTeardown:
    deadline_at: float
    unconfirmed: dict[int, StagePlan]  # stages sent StopRun, by stage index, whose StageStopped has not come
    closing: bool                      # token endpoints being closed, EndpointsClosed not come
    state: FailureTeardownState = FailureTeardownState.WAITING
    left: list[str] = field(default_factory=list)  # what a confirmation said it left behind

    @classmethod
    def begin(cls, provisioned: list[StagePlan], endpoints_opened: bool, now: float, teardown_s: float,
              fault: pb.LifecycleEvent | None = None) -> tuple[FailureTeardown, list[Action]]:
        """Start tearing down: `fault` (the run's RUN_FAULTED, when it had no outcome yet) is emitted first."""
        core = cls(now + teardown_s, {s.stage_index: s for s in provisioned}, endpoints_opened)
        actions: list[Action] = [Emit(fault)] if fault is not None else []
        for s in provisioned:
            actions += [StopStage(s), Emit(pb.LifecycleEvent(kind=pb.STOP_RUN_SENT, node_id=s.node_id,
                                                             stage_index=s.stage_index, component=pb.COMPONENT_ORCHESTRATOR))]
        if endpoints_opened:
            actions.append(CloseEndpoints())
        return core, actions + core._maybe_done(now)

    def deadline(self) -> float | None:
        return self.deadline_at if self.state is FailureTeardownState.WAITING else None

    def handle(self, inp: Input, now: float) -> list[Action]:
        if self.state is FailureTeardownState.DONE:
            return []
        actions: list[Action] = []
        match inp:
            case StageStopped(stage_index=i) if i in self.unconfirmed:
                del self.unconfirmed[i]
                actions.append(Emit(pb.LifecycleEvent(kind=pb.STAGE_STOPPED, stage_index=i)))
            case EndpointsClosed(left=left) if self.closing:
                self.closing = False
                if left:
                    self.left.append(f"token endpoints: {left}")
        return actions + self._maybe_done(now)

    def _maybe_done(self, now: float) -> list[Action]:
        if (self.unconfirmed or self.closing) and now < self.deadline_at:
            return []
        left = [*self.left, *(f"no StageStopped from stage {i} on node {s.node_id}" for i, s in sorted(self.unconfirmed.items()))]
        left += ["token endpoints not closed"] if self.closing else []
        torn = pb.LifecycleEvent(kind=pb.RUN_TORN_DOWN, component=pb.COMPONENT_ORCHESTRATOR, detail="; ".join(left))
        if left:
            torn.reason = pb.RunFaultReason.Name(pb.RUN_FAULT_TEARDOWN_TIMEOUT)
        self.state = FailureTeardownState.DONE
        return [Emit(torn)]
