"""The stage node's availability and its compute process's restarts (spec §8, §31), as an I/O-free core.

`NodeHealth.handle(input, runs_active=, worker_down=) -> actions`; the node (`node.py`) feeds it what it sees and
performs what it returns. The rules, each in one place:

- NodeAvailable (§8) only while the compute process said WorkerReady, the edge-driver answers and the host's
  arena-manager is there; the node announces each change once (Faulted naming why: the worker gone, or the node).
- Crashed -> Restarting (§31): a lost compute process is replaced by a new generation once no run here depends on
  the old one, at most `max_restarts` times in a row; a step completed or a role configured shows the process works
  and resets the count.
- The arena-manager gone: the node is withdrawn at once (the stages fault fail-stop) and retires once no run is
  left; the service then exits for its manager to restart it on the new arena.
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.v1 import common_pb2

MAX_WORKER_RESTARTS = 3


# ---- inputs ----


@dataclass(frozen=True)
class WorkerReady:
    """The compute process said WorkerReady (a new generation)."""


@dataclass(frozen=True)
class WorkerLost:
    """The compute process crashed or never became ready."""


@dataclass(frozen=True)
class WorkerWorks:
    """A step completed or a role was configured: the process does its work."""


@dataclass(frozen=True)
class DriverSeen:
    up: bool


@dataclass(frozen=True)
class ArenaLost:
    detail: str


@dataclass(frozen=True)
class RunsChanged:
    """A run here stopped (the process may be replaced, the node may retire)."""


NodeHealthInput = WorkerReady | WorkerLost | WorkerWorks | DriverSeen | ArenaLost | RunsChanged


# ---- actions ----


@dataclass(frozen=True)
class Announce:
    """Tell membership: Available, or Faulted with `reason` (a RunFaultReason)."""

    available: bool
    reason: int = common_pb2.RUN_FAULT_REASON_UNSPECIFIED


@dataclass(frozen=True)
class RestartWorker:
    attempt: int


@dataclass(frozen=True)
class RestartsExhausted:
    restarts: int


@dataclass(frozen=True)
class Retire:
    detail: str


Action = Announce | RestartWorker | RestartsExhausted | Retire


@dataclass
class NodeHealth:
    max_restarts: int = MAX_WORKER_RESTARTS
    worker_ready: bool = False
    driver_up: bool = False
    arena_gone: str | None = None  # why, once the arena-manager's hand-out connection ended
    retired: bool = False
    available: bool = False
    restarts: int = 0  # in a row, since the process last did work

    def handle(self, inp: NodeHealthInput, *, runs_active: int, worker_down: bool) -> list[Action]:
        """`runs_active`: runs here not yet stopped; `worker_down`: the ctl is Failed or Stopped (no process)."""
        actions: list[Action] = []
        match inp:
            case WorkerReady():
                self.worker_ready = True
            case WorkerLost():
                self.worker_ready = False
            case WorkerWorks():
                self.restarts = 0
            case DriverSeen(up):
                self.driver_up = up
            case ArenaLost(detail):
                if self.arena_gone is None:
                    self.arena_gone = detail
            case RunsChanged():
                pass
        if isinstance(inp, WorkerLost | RunsChanged) and worker_down and runs_active == 0:
            actions += self._restart()
        if self.arena_gone is not None and runs_active == 0 and not self.retired:
            self.retired = True
            actions.append(Retire(self.arena_gone))
        return actions + self._announce()

    def _restart(self) -> list[Action]:
        if self.restarts >= self.max_restarts:
            return [RestartsExhausted(self.restarts)]
        self.restarts += 1
        return [RestartWorker(self.restarts)]

    def _announce(self) -> list[Action]:
        if self.arena_gone is not None and not self.retired:
            return []  # withdrawn once retired: membership must not beat the stages' own fault reports
        now = self.worker_ready and self.driver_up and self.arena_gone is None
        if now == self.available:
            return []
        self.available = now
        if now:
            return [Announce(True)]
        why = common_pb2.RUN_FAULT_WORKER_CRASHED if not self.worker_ready else common_pb2.RUN_FAULT_NODE_UNAVAILABLE
        return [Announce(False, why)]
