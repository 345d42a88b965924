"""When the node starts a new generation of its compute process (§31 Crashed -> Restarting): an I/O-free core.

A worker generation that crashed, never became ready, or was stopped is replaced, but only once no
stage still depends on it: a stage that is not Stopped holds the old generation's rings and device
handles, and tears down first. Restarts are counted in a row: a generation that loaded a role or
completed a step has proved itself, and the count starts again. After MAX_WORKER_RESTARTS restarts in
a row the node gives up: the worker stays down (and a crashed worker's node withdrawn) until the
service itself is restarted.

    worker_proved()                        RoleConfigured / StepCompleted: the count starts again
    decide(ctl_state, stage_state)  ->  None | Restart(attempt) | GiveUp(restarts)
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.common.events import get_logger
from swactor.worker.ctl_fsm import CtlState
from swactor.worker.stage_fsm import StageState

MAX_WORKER_RESTARTS = 3

# the ctl states with no live worker process, from which the ctl starts a new generation
_DOWN = frozenset({CtlState.FAILED, CtlState.STOPPED})


@dataclass(frozen=True)
class Restart:
    """Start worker generation + 1 (GpuWorkerCtl.start); `attempt` counts the restarts in a row."""

    attempt: int


@dataclass(frozen=True)
class GiveUp:
    """The worker is down and `restarts` restarts in a row did not bring up a working generation."""

    restarts: int


@dataclass
class WorkerRestarts:
    node_id: int
    limit: int = MAX_WORKER_RESTARTS
    restarts: int = 0  # restarts since the last generation that loaded a role or completed a step

    def worker_proved(self) -> None:
        self.restarts = 0

    def decide(self, ctl_state: CtlState, stage_state: StageState | None) -> Restart | GiveUp | None:
        """Asked whenever the worker went down or the node's stage stopped."""
        if stage_state is not None and stage_state is not StageState.STOPPED:
            return None  # the stage still depends on the old generation: it tears down first
        if ctl_state not in _DOWN:
            return None
        log = get_logger(node_id=self.node_id, component="stage_node")
        if self.restarts >= self.limit:
            log.error("worker_restart_limit", restarts=self.restarts)
            return GiveUp(self.restarts)
        self.restarts += 1
        log.info("worker_restarting", attempt=self.restarts)
        return Restart(self.restarts)
