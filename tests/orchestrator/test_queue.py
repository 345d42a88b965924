"""The run queue core (FIFO, bounded, positions) and the retention core, pure: scripted times, no I/O."""

from __future__ import annotations

import pytest

from swactor.orchestrator.runs.queue import Moved, QueueFull, RunQueue
from swactor.orchestrator.runs.retention import DAY_S, RetentionPolicy, RetentionSchedule


def test_runs_leave_in_submission_order_and_the_rest_move_up() -> None:
    q = RunQueue(depth=3)
    assert [q.push(rid, now) for rid, now in ((10, 0.0), (11, 1.0), (12, 2.0))] == [1, 2, 3]
    assert (len(q), 11 in q, 99 in q, q.position(12)) == (3, True, False, 3)
    assert q.pop(now=5.0) == (10, 5.0, [Moved(11, 1), Moved(12, 2)])
    assert q.pop(now=5.5) == (11, 4.5, [Moved(12, 1)])
    assert q.pop(now=6.0) == (12, 4.0, [])
    assert q.pop(now=7.0) is None and len(q) == 0


def test_a_full_queue_refuses_and_room_comes_back() -> None:
    q = RunQueue(depth=2)
    q.push(1, 0.0)
    q.push(2, 0.0)
    with pytest.raises(QueueFull, match=r"full \(2 of 2 runs waiting\)"):
        q.push(3, 0.0)
    q.pop(1.0)
    assert q.push(3, 1.0) == 2
    roomy = RunQueue(depth=5)
    roomy.push(3, 1.0)
    with pytest.raises(ValueError, match="already queued"):
        roomy.push(3, 1.0)
    with pytest.raises(QueueFull):
        RunQueue(depth=0).push(1, 0.0)  # depth 0: no queue, a second run is always refused


def test_removing_a_run_moves_only_those_behind_it() -> None:
    q = RunQueue(depth=5)
    for rid in (1, 2, 3, 4):
        q.push(rid, 0.0)
    assert q.remove(2) == [Moved(3, 2), Moved(4, 3)]
    assert q.remove(4) == []
    assert q.remove(1) == [Moved(3, 1)]
    assert q.pop(2.0) == (3, 2.0, [])
    with pytest.raises(ValueError):
        q.remove(3)


def test_a_resumed_request_goes_first_past_the_depth_and_the_others_move_back() -> None:
    q = RunQueue(depth=2)
    q.push(1, 0.0)
    q.push(2, 0.0)
    assert q.push_first(9, 1.0) == [Moved(1, 2), Moved(2, 3)]  # already accepted: never refused for room
    assert q.pop(3.0) == (9, 2.0, [Moved(1, 1), Moved(2, 2)])
    with pytest.raises(ValueError, match="already queued"):
        q.push_first(1, 3.0)


NOW_US = 100 * int(DAY_S * 1e6)


def finished(*ages_s: float) -> list[tuple[int, int]]:
    """(run_id, created_us) newest first; run k was created ages_s[k] seconds before NOW_US."""
    return [(k + 1, NOW_US - round(age * 1e6)) for k, age in enumerate(ages_s)]


def test_retention_keeps_the_newest_max_runs_and_nothing_older_than_max_age() -> None:
    runs = finished(1, 2, 3, 4, 5)
    assert RetentionPolicy(max_runs=3, max_age_s=0).victims(runs, NOW_US) == [5, 4]  # oldest first
    assert RetentionPolicy(max_runs=0, max_age_s=2.5).victims(runs, NOW_US) == [5, 4, 3]
    assert RetentionPolicy(max_runs=4, max_age_s=2.5).victims(runs, NOW_US) == [5, 4, 3]
    assert RetentionPolicy(max_runs=0, max_age_s=0).victims(runs, NOW_US) == []
    assert RetentionPolicy(max_runs=10, max_age_s=DAY_S).victims(runs, NOW_US) == []
    assert RetentionPolicy(max_runs=0, max_age_s=0).victims([], NOW_US) == []


def test_a_pass_deletes_at_most_a_batch_oldest_first() -> None:
    runs = finished(*range(1, 11))
    assert RetentionPolicy(max_runs=2, max_age_s=0, batch=3).victims(runs, NOW_US) == [10, 9, 8]
    with pytest.raises(ValueError, match="max_runs -1"):
        RetentionPolicy(max_runs=-1)
    with pytest.raises(ValueError, match="batch"):
        RetentionPolicy(batch=0)


def test_retention_schedule_interval_run_finished_and_full_batches() -> None:
    policy = RetentionPolicy(batch=5, interval_s=60.0)
    sched = RetentionSchedule(policy, now=0.0)
    assert sched.due(0.0)  # a first pass at start
    sched.passed(0.0, deleted=0)
    assert not sched.due(59.9) and sched.due(60.0)
    sched.run_finished(10.0)  # a run finished: look at once
    assert sched.due(10.0)
    sched.passed(10.0, deleted=5)  # a full batch: more may be waiting
    assert sched.due(10.0)
    sched.passed(10.0, deleted=2)
    assert not sched.due(69.9) and sched.due(70.0)
