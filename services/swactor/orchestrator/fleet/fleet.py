"""What the orchestrator needs from the node services: the StageFleet and TokenEndpoints Protocols.

Integration implements these over node control gRPC (stage.proto: ProvisionStage / StopRun /
WatchStage) and the local token-in producer / token-out consumer rings. Everything a fleet learns
is reported as run-FSM inputs through `report` (thread-safe to call from the event loop only):

- per stage: StageReady, StageFault, StageStopped, and Relay(LifecycleEvent) for node events
  (weights_loaded, edge_ready, ...), until that stage's StageStopped;
- for the endpoints: EndpointsReady once both token endpoints are established, TokenReceived for
  every token-out object (sequence, sampled token id) in arrival order, EndpointFault on failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from swactor.common.reasons import ReasonError
from swactor.orchestrator.planning.planner import RunPlan, StagePlan
from swactor.orchestrator.runs.fsm import Input

Report = Callable[[Input], None]


class FleetError(ReasonError):
    """A fleet call failed; `reason` is the RunFaultReason value the run records."""


class TokenEndpoints(Protocol):
    async def inject(self, sequence: int, token_ids: Sequence[int], flags: int = 0) -> None:
        """Write one token object (int32 ids) with `sequence` and header `flags` to the token-in edge."""
        ...

    async def close(self) -> None:
        """Tear down both local token endpoints (idempotent)."""
        ...


class StageFleet(Protocol):
    async def provision(self, plan: RunPlan, stage: StagePlan, report: Report) -> None:
        """Send ProvisionStage to `stage.node` and start reporting that stage's events.

        Returns once the node accepted the request; raises FleetError when it refused or could
        not be reached (the run then faults with that reason)."""
        ...

    async def stop_stage(self, plan: RunPlan, stage: StagePlan) -> None:
        """Send StopRun for this run to the stage's node (best effort; StageStopped is reported)."""
        ...

    async def open_endpoints(self, plan: RunPlan, report: Report) -> TokenEndpoints:
        """Create the local token-in producer (edge plan.token_in) and token-out consumer
        (edge plan.token_out); report EndpointsReady when both are established."""
        ...
