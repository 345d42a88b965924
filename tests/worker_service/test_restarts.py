"""When the node starts a new worker generation and when it gives up (worker/restarts.py): a table of
(ctl state, stage state, restarts so far) and a crash loop. No processes, no sleeps."""

from __future__ import annotations

import pytest

from swactor.worker.ctl_fsm import CtlState as C
from swactor.worker.restarts import MAX_WORKER_RESTARTS, GiveUp, Restart, WorkerRestarts
from swactor.worker.stage_fsm import StageState as S

TABLE = [
    # ctl state, stage state, restarts so far -> decision, restarts after
    (C.FAILED, None, 0, Restart(1), 1),
    (C.STOPPED, None, 0, Restart(1), 1),
    (C.FAILED, S.STOPPED, 2, Restart(3), 3),
    (C.FAILED, None, 3, GiveUp(3), 3),
    (C.FAILED, S.STOPPED, 5, GiveUp(5), 5),
    # a stage that is not Stopped still depends on the old generation
    *[(C.FAILED, s, 0, None, 0) for s in (S.UNPROVISIONED, S.PREPARING, S.READY, S.EXECUTING, S.FAULTED, S.STOPPING)],
    (C.FAILED, S.FAULTED, 3, None, 3),  # not even the give-up: the stage tears down first
    # a worker process is there (or coming): nothing to restart
    *[(c, None, 0, None, 0) for c in (C.NOT_STARTED, C.SPAWNING, C.INITIALIZING, C.RUNNING, C.STOPPING, C.KILLING,
                                      C.CRASHED)],
]


@pytest.mark.parametrize(("ctl", "stage", "before", "want", "after"), TABLE)
def test_decide(ctl: C, stage: S | None, before: int, want: object, after: int) -> None:
    policy = WorkerRestarts(node_id=5, restarts=before)
    assert policy.decide(ctl, stage) == want
    assert policy.restarts == after


def test_a_crash_loop_gives_up_after_the_limit_and_a_proved_generation_starts_the_count_again() -> None:
    policy = WorkerRestarts(node_id=5)
    assert [policy.decide(C.FAILED, None) for _ in range(MAX_WORKER_RESTARTS + 2)] == \
        [Restart(1), Restart(2), Restart(3), GiveUp(3), GiveUp(3)]
    policy.worker_proved()  # RoleConfigured or StepCompleted
    assert policy.decide(C.FAILED, S.STOPPED) == Restart(1)


def test_the_limit_is_three_in_a_row() -> None:
    assert MAX_WORKER_RESTARTS == 3 and WorkerRestarts(node_id=5).limit == MAX_WORKER_RESTARTS
