"""What the StageController (stage_fsm.py) takes and gives: the validated stage plan, its inputs (events from
the worker ctl, the establisher and the orchestrator) and its actions. Plain frozen values, so the FSM stays I/O-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swactor.common.msgbase import Failure
from swactor.distribution.request import FetchProgress, FetchRequest, FetchStarted
from swactor.edgeend.establisher import EdgeFailed, EdgeProvision, EdgeReady, EdgeStopped, StopEdge
from swactor.v1 import common_pb2
from swactor.worker.process import wire


@dataclass(frozen=True)
class StagePlan:
    """What one ProvisionStage (§12) assigns to this node, validated."""

    run_id: int
    stage_index: int
    stage_count: int
    role_id: int
    inbound: EdgeProvision
    outbound: EdgeProvision
    outbound_kind: int  # common_pb2.EdgeKind
    role_config: dict[str, Any]  # ConfigureRole.config (weights, layer range, sampling)
    in_row_bytes: int
    out_row_bytes: int
    # Set when the weights come from the orchestrator's model server (docs/distribution.md): fetched
    # into the weights cache before ConfigureRole; None = role_config names a file the node holds.
    fetch: FetchRequest | None = None
    trace: bool = False  # runtime.trace_objects: report the per-object events


# ---- inputs (events from the worker ctl, the establisher and the orchestrator) ----


@dataclass(frozen=True)
class Provision:
    plan: StagePlan


@dataclass(frozen=True)
class StopRun:
    pass


@dataclass(frozen=True)
class WeightsFetched:
    path: str
    bytes_total: int
    bytes_fetched: int
    seconds: float


@dataclass(frozen=True)
class WeightsFetchFailed:
    reason: str  # stagefetch / fetcher reason: ChecksumMismatch, DiskFull, Unreachable, ...
    detail: str


@dataclass(frozen=True)
class WorkerGone(Failure):
    """WorkerCrashed / WorkerFailed / WorkerFatal from the ctl: RUN_FAULT_WORKER_CRASHED | RUN_FAULT_WORKER_FATAL."""


@dataclass(frozen=True)
class ControlLost:
    """The orchestrator's hold on the run expired (stage_lease.py): fault fail-stop; StopRun follows."""

    detail: str


@dataclass(frozen=True)
class ArenaLost:
    """The host's arena-manager is gone (its hand-out connection ended): every ring of the run lives in
    a memfd nobody manages any more. Fault fail-stop; StopRun follows."""

    detail: str


# The weights fetch's own reports (FetchStarted, FetchProgress) are inputs as they are.
Input = (Provision | StopRun | ControlLost | ArenaLost | EdgeReady | EdgeFailed | EdgeStopped | WorkerGone
         | FetchStarted | FetchProgress | WeightsFetched | WeightsFetchFailed | wire.RoleProgress
         | wire.RoleConfigured | wire.RoleFailed | wire.ObjectLoaded | wire.ObjectFailed | wire.ObjectProduced
         | wire.StepCompleted | wire.StepFailed)

# ---- actions ----
# (StopEdge: the establisher's own input, swactor.edgeend.establisher.StopEdge)


@dataclass(frozen=True)
class ProvisionEdge:
    edge: EdgeProvision


@dataclass(frozen=True)
class FetchWeights:
    """Fetch the plan's ranges into the weights cache; report WeightsFetch* inputs."""

    request: FetchRequest


@dataclass(frozen=True)
class CancelFetch:
    pass


@dataclass(frozen=True)
class ToWorker:
    command: wire.Command


@dataclass(frozen=True)
class GrantTerms:
    """What a run's StageController says its next decode step will be (StageController.grant_terms)."""

    ring_id: int  # its ingress ring
    sequence: int  # the next object's
    row_bytes: int  # one input row's bytes
    start_pos: int  # its position
    output: wire.OutputBinding  # port, ring and extent of its output (object id, sequence, flags: the input's)


@dataclass(frozen=True)
class StepAdopted:
    """The compute process started this step under the node's standing grant (ObjectLoaded.granted_step): the
    controller's own ExecuteStep for it, never sent; `worker_step_id` is the id the worker gave it."""
    step: wire.ExecuteStep
    worker_step_id: int


@dataclass(frozen=True)
class Report:
    """A §40 lifecycle event of this stage (time is stamped by the shell)."""

    event: common_pb2.LifecycleEvent
    cause: str = ""  # for STAGE_FAULTED: the name of the §37 detail reason ("OBJECT_FAILURE_EOF_MID_OBJECT")
    detail: str = ""


Action = ProvisionEdge | StopEdge | FetchWeights | CancelFetch | ToWorker | StepAdopted | Report
