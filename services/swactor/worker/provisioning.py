"""Which ProvisionStage requests the node takes, and the KV slot a taken run gets: pure checks over the request,
its caller and the runs active here. The node (node.py) performs what they allow.

Runs in flight share the one resident role (docs/runs-in-flight.md), so a new run is taken only on the weights
of the runs already active and only into a slot none of them holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from swactor.v1 import stage_pb2
from swactor.worker.process.roles import weights_key


class ProvisionError(Exception):
    """ProvisionStage refused: `code` is the gRPC status name the servicer answers with."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class WeightsIdentity:
    """What runs in flight on this node must agree on to share its resident role: the compute process's
    weights key (layer range, context, chunk, slots, KV dtype) and where the weights come from."""

    key: tuple[Any, ...]
    source: tuple[str, str, int]  # gguf_source url, sha256, model id: a fetched file's path is known only later

    @classmethod
    def of(cls, req: stage_pb2.ProvisionStageRequest, config: dict[str, Any]) -> WeightsIdentity:
        return cls(weights_key(config), (req.gguf_source.url, req.gguf_source.sha256, req.model.model_id))


class ActiveRun(Protocol):
    """What slot assignment needs of a run active here."""

    run_id: int
    slot: int
    weights: WeightsIdentity

    @property
    def leaving(self) -> bool: ...  # faulted or stopping: its slot frees once it stopped


def check_caller(req: stage_pb2.ProvisionStageRequest, caller: int | None, *, node_id: int,
                 orchestrator_node_id: int | None) -> None:
    """The request comes from the orchestrator this node serves (its certificate's), is its own, and is for us."""
    if caller is None:
        raise ProvisionError("PERMISSION_DENIED", "the caller's certificate names no orchestrator")
    if orchestrator_node_id is not None and caller != orchestrator_node_id:
        raise ProvisionError("PERMISSION_DENIED", f"orchestrator {caller} is not the authorised "
                                                  f"orchestrator {orchestrator_node_id}")
    if req.orchestrator_node_id != caller:
        raise ProvisionError("PERMISSION_DENIED", f"orchestrator_node_id {req.orchestrator_node_id} is not the "
                                                  f"caller ({caller})")
    if req.node_id != node_id:
        raise ProvisionError("PERMISSION_DENIED", f"plan is addressed to node {req.node_id}, this is node {node_id}")


def free_slot(active: Sequence[ActiveRun], identity: WeightsIdentity, slots: int) -> int:
    """The KV slot a new run of `identity` takes here (the lowest free); ProvisionError when none can be given:
    other weights are resident for runs still active (FAILED_PRECONDITION), or every slot is held, ABORTED (the
    caller may try again) while one of them is tearing down."""
    for run in active:
        if run.weights != identity:
            if run.leaving:
                raise ProvisionError("ABORTED", f"run {run.run_id} is still tearing down here")
            raise ProvisionError("FAILED_PRECONDITION", f"run {run.run_id} is still active here on other weights "
                                                        f"(runs in flight share one role: same model, layers, slots)")
    taken = {run.slot for run in active}
    free = [k for k in range(slots) if k not in taken]
    if free:
        return free[0]
    if any(run.leaving for run in active):
        raise ProvisionError("ABORTED", f"all {slots} run slot(s) are held; run(s) "
                                        f"{sorted(run.run_id for run in active if run.leaving)} are tearing down")
    raise ProvisionError("FAILED_PRECONDITION", f"all {slots} run slot(s) are held by active runs "
                                                f"{sorted(run.run_id for run in active)}")
