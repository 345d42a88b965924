"""provisioning.py: who may provision this node, and the KV slot a new run takes beside the runs in flight."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from swactor.v1 import stage_pb2
from swactor.worker.provisioning import ProvisionError, WeightsIdentity, check_caller, free_slot

A = WeightsIdentity(("blk", 0, 15, 8), ("https://o/m", "a" * 64, 1))
B = WeightsIdentity(("blk", 15, 30, 8), ("https://o/m", "a" * 64, 1))


@dataclass
class Run:
    run_id: int
    slot: int
    weights: WeightsIdentity = A
    leaving: bool = False


def refused(active: list[Run], identity: WeightsIdentity = A, slots: int = 2) -> tuple[str, str]:
    with pytest.raises(ProvisionError) as e:
        free_slot(active, identity, slots)
    return e.value.code, e.value.detail


def test_the_lowest_free_slot_of_the_same_weights() -> None:
    assert free_slot([], A, 1) == 0
    assert free_slot([Run(1, 0), Run(2, 2)], A, 4) == 1
    assert free_slot([Run(1, 1, leaving=True)], A, 2) == 0  # a leaving run keeps its slot until it stopped


def test_full_slots_or_other_weights_are_refused_naming_the_runs() -> None:
    assert refused([Run(1, 0), Run(2, 1)]) == ("FAILED_PRECONDITION", "all 2 run slot(s) are held by active runs [1, 2]")
    assert refused([Run(1, 0), Run(2, 1, leaving=True)]) == (
        "ABORTED", "all 2 run slot(s) are held; run(s) [2] are tearing down")
    code, detail = refused([Run(7, 0, weights=B)])
    assert code == "FAILED_PRECONDITION" and detail.startswith("run 7 is still active here on other weights")
    assert refused([Run(7, 0, weights=B, leaving=True)]) == ("ABORTED", "run 7 is still tearing down here")


def test_only_the_authorised_orchestrator_provisions_this_node() -> None:
    req = stage_pb2.ProvisionStageRequest(run_id=1, node_id=4, orchestrator_node_id=9)
    check_caller(req, 9, node_id=4, orchestrator_node_id=9)
    check_caller(req, 9, node_id=4, orchestrator_node_id=None)  # not pinned: the caller's own word
    for caller, node, pinned, words in ((None, 4, 9, "names no orchestrator"), (8, 4, 9, "not the authorised"),
                                        (8, 4, None, "is not the caller"), (9, 5, 9, "addressed to node 4")):
        with pytest.raises(ProvisionError, match=words) as e:
            check_caller(req, caller, node_id=node, orchestrator_node_id=pinned)
        assert e.value.code == "PERMISSION_DENIED"
