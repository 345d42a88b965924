"""Run admission on a stage node (worker/admission.py): every refusal with its gRPC code and text, in
the order the checks take; the bounded history of finished runs; who may stop or follow a run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from swactor.worker.admission import KEEP_FINISHED_RUNS, Admitted, Ask, Refused, RunAdmission, Slot
from swactor.worker.stage_fsm import StageState as S

NODE, ORCH = 5, 1
ASK = Ask(run_id=77, node_id=NODE, orchestrator_node_id=ORCH, caller=ORCH)
FREE: dict[str, object] = {"slot": None, "worker_ready": True, "arena_gone": None}


def denied(detail: str) -> Refused:
    return Refused("PERMISSION_DENIED", detail)


CHECKS = {
    # name: (pinned orchestrator, ask, node facts, known runs, refusal)
    "a free node admits": (None, ASK, {}, [], None),
    "the pinned orchestrator is admitted": (ORCH, ASK, {}, [], None),
    "a stopped stage frees the slot": (None, ASK, {"slot": Slot(70, S.STOPPED)}, [70], None),
    "no orchestrator certificate": (None, replace(ASK, caller=None), {}, [],
                                    denied("the caller's certificate names no orchestrator")),
    "not the pinned orchestrator": (2, ASK, {}, [], denied("orchestrator 1 is not the authorised orchestrator 2")),
    "a plan in another orchestrator's name": (None, replace(ASK, orchestrator_node_id=3), {}, [],
                                              denied("orchestrator_node_id 3 is not the caller (1)")),
    "a plan for another node": (None, replace(ASK, node_id=6), {}, [],
                                denied("plan is addressed to node 6, this is node 5")),
    "a run id seen before": (None, ASK, {}, [77],
                             Refused("ALREADY_EXISTS", "run 77 is already provisioned on this node")),
    **{f"a {s.value} run holds the slot": (None, ASK, {"slot": Slot(70, s)}, [70],
                                           Refused("FAILED_PRECONDITION", "run 70 is still active here"))
       for s in (S.UNPROVISIONED, S.PREPARING, S.READY, S.EXECUTING)},
    **{f"a {s.value} run is tearing down: try again": (None, ASK, {"slot": Slot(70, s)}, [70],
                                                       Refused("ABORTED", "run 70 is still tearing down here"))
       for s in (S.FAULTED, S.STOPPING)},
    "no WorkerReady": (None, ASK, {"worker_ready": False}, [],
                       Refused("FAILED_PRECONDITION", "the GPU worker is not ready (WorkerReady not seen)")),
    "the arena-manager is gone": (None, ASK, {"arena_gone": "pid 9 exited"}, [],
                                  Refused("FAILED_PRECONDITION", "the node's arena-manager is gone: pid 9 exited")),
    # the order: the first that applies answers
    "identity before everything": (None, replace(ASK, caller=None),
                                   {"slot": Slot(70, S.READY), "worker_ready": False}, [77],
                                   denied("the caller's certificate names no orchestrator")),
    "a known run before a busy slot": (None, ASK, {"slot": Slot(77, S.READY)}, [77],
                                       Refused("ALREADY_EXISTS", "run 77 is already provisioned on this node")),
    "a busy slot before the worker": (None, ASK, {"slot": Slot(70, S.READY), "worker_ready": False,
                                                  "arena_gone": "x"}, [70],
                                      Refused("FAILED_PRECONDITION", "run 70 is still active here")),
    "the worker before the arena": (None, ASK, {"worker_ready": False, "arena_gone": "x"}, [],
                                    Refused("FAILED_PRECONDITION", "the GPU worker is not ready (WorkerReady not seen)")),
}


@pytest.mark.parametrize(("pinned", "ask", "facts", "known", "want"), CHECKS.values(), ids=CHECKS.keys())
def test_check(pinned: int | None, ask: Ask, facts: dict[str, object], known: list[int], want: Refused | None) -> None:
    admission = RunAdmission(NODE, pinned)
    for run in known:
        admission.admit(replace(ASK, run_id=run))
    assert admission.check(ask, **{**FREE, **facts}) == want  # type: ignore[arg-type]


def test_admit_records_the_run_and_its_provisioner() -> None:
    admission = RunAdmission(NODE)
    assert admission.admit(ASK) == Admitted(77, ())
    assert admission.authorize(77, ORCH) is None
    assert admission.check(ASK, None, worker_ready=True, arena_gone=None) == \
        Refused("ALREADY_EXISTS", "run 77 is already provisioned on this node")


def test_only_the_newest_finished_runs_are_kept_and_running_ones_never_forgotten() -> None:
    admission = RunAdmission(NODE, keep_finished=2)
    for run in (1, 2, 3, 4):
        assert admission.admit(replace(ASK, run_id=run)).forget == ()
    for run in (1, 3, 4):  # 2 still runs
        admission.finished(run)
    assert admission.admit(replace(ASK, run_id=5)).forget == (1,)  # 3 and 4 are the newest two finished
    assert list(admission.runs) == [2, 3, 4, 5]
    admission.finished(2)
    assert admission.admit(replace(ASK, run_id=6)).forget == (2,)  # 2 finished last but was provisioned first
    assert admission.admit(replace(ASK, run_id=1)).forget == ()  # a forgotten run id may come again
    admission.finished(99)  # unknown: ignored


def test_the_history_holds_sixteen_finished_runs() -> None:
    admission = RunAdmission(NODE)
    forgotten: list[int] = []
    for run in range(1, KEEP_FINISHED_RUNS + 4):  # each run ends before the next is provisioned
        forgotten += admission.admit(replace(ASK, run_id=run)).forget
        admission.finished(run)
    assert KEEP_FINISHED_RUNS == 16
    assert forgotten == [1, 2] and len(admission.runs) == KEEP_FINISHED_RUNS + 1  # 16 kept, and the run that just ended


AUTHORIZE = {
    "the provisioner": (77, ORCH, None),
    "an unknown run passes (the call answers known=false / NOT_FOUND)": (78, 2, None),
    "no orchestrator certificate, even for an unknown run": (78, None,
                                                             denied("the caller's certificate names no orchestrator")),
    "another orchestrator": (77, 2, denied("run 77 was provisioned by orchestrator 1, not 2")),
}


@pytest.mark.parametrize(("run", "caller", "want"), AUTHORIZE.values(), ids=AUTHORIZE.keys())
def test_authorize(run: int, caller: int | None, want: Refused | None) -> None:
    admission = RunAdmission(NODE)
    admission.admit(ASK)
    assert admission.authorize(run, caller) == want
