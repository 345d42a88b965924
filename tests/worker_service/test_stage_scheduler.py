"""The stage's step scheduler (worker/stage_scheduler.py): which runs' steps go next, batched or alone."""

from __future__ import annotations

import pytest

from swactor.worker.process import wire
from swactor.worker.stage_messages import GrantTerms
from swactor.worker.stage_scheduler import Asked, StepScheduler


def asked(run_id: int, rows: int = 1, start_pos: int = 0, own_step: int = 1, **runtime: object) -> Asked:
    handle = wire.DeviceHandle(1, run_id * 10 + own_step)
    return Asked(run_id, slot=run_id % 10, rows=rows, step=wire.ExecuteStep(
        run_id, own_step, [wire.InputBinding(0, run_id, own_step, handle)],
        [wire.OutputBinding(1, run_id + 1000, run_id, own_step, 4)], {"start_pos": start_pos, **runtime}, True))


def test_rows_of_waiting_runs_go_as_one_step_up_to_the_batch_width() -> None:
    s = StepScheduler(max_batch=2)
    for run_id in (1, 2, 3):
        s.ask(asked(run_id, start_pos=run_id))
    d = s.next()
    assert d is not None and [a.run_id for a in d.members] == [1, 2] and d.batched
    assert d.step.runtime == {"rows": [{"slot": 1, "start_pos": 1, "sample": True},
                                       {"slot": 2, "start_pos": 2, "sample": True}]}
    assert [o.ring_id for o in d.step.outputs] == [1001, 1002] and d.step.step_id == 1
    assert s.next() is None  # one step in flight at a time
    assert s.finished(99) is None  # not the step in flight
    assert s.finished(1) is d
    d = s.next()
    assert d is not None and [a.run_id for a in d.members] == [3] and not d.batched
    assert d.step.runtime == {"start_pos": 3, "slot": 3} and d.step.step_id == 2


def test_a_batched_row_keeps_its_rewind() -> None:
    """A speculating run's row after rejected drafts (runtime rewind) batched with another run's: the rewind goes with
    its row only."""
    s = StepScheduler(max_batch=2)
    s.ask(asked(1, start_pos=9, rewind=2))
    s.ask(asked(2, start_pos=4))
    d = s.next()
    assert d is not None and d.step.runtime == {"rows": [{"slot": 1, "start_pos": 9, "sample": True, "rewind": 2},
                                                         {"slot": 2, "start_pos": 4, "sample": True}]}


def test_prompt_chunks_and_decode_rows_alternate() -> None:
    """A decode row waits at most one other run's chunk; a chunk waits at most one batch of rows."""
    s = StepScheduler(max_batch=4)
    s.ask(asked(1))
    s.ask(asked(2, rows=64, sample=False))
    s.ask(asked(3, rows=64))
    order = []
    while (d := s.next()) is not None:
        order.append([a.run_id for a in d.members])
        s.finished(d.step.step_id)
        for a in d.members:  # each run asks again: run 1 decodes on, the chunked runs finish their prompts
            if a.run_id == 1 and len(order) < 6:
                s.ask(asked(1, own_step=len(order) + 1))
    assert order[:4] == [[2], [1], [3], [1]]


def test_a_run_that_leaves_withdraws_its_unsent_step_and_a_crash_loses_all() -> None:
    s = StepScheduler(max_batch=4)
    s.ask(asked(1, rows=8))
    s.ask(asked(2))
    d = s.next()
    assert d is not None and [a.run_id for a in d.members] == [1]
    s.ask(asked(3))
    gone = s.withdraw(2)
    assert gone is not None and gone.run_id == 2 and s.withdraw(2) is None
    assert sorted(a.run_id for a in s.reset()) == [1, 3]
    assert s.next() is None and s.in_flight is None


def test_a_second_step_of_one_run_before_its_first_ran_is_a_bug() -> None:
    s = StepScheduler()
    s.ask(asked(1))
    with pytest.raises(ValueError, match="second step"):
        s.ask(asked(1, own_step=2))


def test_rows_wait_a_little_for_the_other_decoding_runs() -> None:
    s = StepScheduler(max_batch=4, gather_s=0.010, expected=3)
    s.ask(Asked(1, 1, 1, asked(1).step, at=5.000))
    assert s.next(now=5.002) is None and s.hold_until == pytest.approx(5.010)  # two more runs decode here
    s.ask(Asked(2, 2, 1, asked(2).step, at=5.004))
    assert s.next(now=5.004) is None
    s.ask(Asked(3, 3, 1, asked(3).step, at=5.006))
    d = s.next(now=5.006)  # every decoding run's row is here: no more waiting
    assert d is not None and [a.run_id for a in d.members] == [1, 2, 3] and s.hold_until is None
    s.finished(d.step.step_id)
    s.ask(Asked(1, 1, 1, asked(1, own_step=2).step, at=6.0))
    assert s.next(now=6.005) is None
    d = s.next(now=6.010)  # the window is over: the row goes with what is there
    assert d is not None and [a.run_id for a in d.members] == [1]
    s.finished(d.step.step_id)
    s.ask(asked(4, rows=16))  # a prompt chunk never waits
    d = s.next(now=7.0)
    assert d is not None and d.members[0].rows == 16


def _round(s: StepScheduler, runs: tuple[int, ...], at: float, own_step: int) -> None:
    for r in runs:
        s.ask(Asked(r, r, 1, asked(r, own_step=own_step).step, at=at))


@pytest.mark.parametrize("merge", [True, False])
def test_the_first_stage_merges_two_groups_of_runs_out_of_step(merge: bool) -> None:
    """Runs 1-3 and run 4 go round the pipeline out of step (0.1 s a trip). Where rows enter the pipeline (`merge`),
    run 4's row waits until the other three are due back and the four go as one step from then on; a later stage
    holds only its gather window, so the groups stay apart there."""
    s = StepScheduler(max_batch=4, gather_s=0.010, expected=4, merge=merge)
    _round(s, (1, 2, 3), 0.0, 1)
    d = s.next(now=0.010)  # no trip measured yet: the gather window only
    assert d is not None and len(d.members) == 3
    s.finished(d.step.step_id)
    _round(s, (4,), 0.05, 1)
    d = s.next(now=0.065)
    assert d is not None and [a.run_id for a in d.members] == [4]
    s.finished(d.step.step_id)
    _round(s, (1, 2, 3), 0.11, 2)  # their trip: 0.1 s
    assert s.next(now=0.11) is None  # run 4's trip is not known yet: the gather window
    d = s.next(now=0.125)
    assert d is not None and len(d.members) == 3
    s.finished(d.step.step_id)
    _round(s, (4,), 0.16, 2)
    d = s.next(now=0.17)
    if not merge:
        assert d is not None and [a.run_id for a in d.members] == [4]
        return
    # runs 1-3 went out at 0.125 and take 0.1 s: due at 0.125 + 0.11 + 0.01
    assert d is None and s.hold_until == pytest.approx(0.245)
    _round(s, (1, 2, 3), 0.225, 3)
    d = s.next(now=0.225)
    assert d is not None and sorted(a.run_id for a in d.members) == [1, 2, 3, 4]


def test_the_first_stage_waits_no_longer_than_a_trip_nor_for_a_run_that_left() -> None:
    s = StepScheduler(max_batch=4, gather_s=0.010, expected=2, merge=True)
    s.sent_at, s.trip_s = {1: 0.0, 2: 0.5}, {1: 0.1, 2: 2.0}
    _round(s, (1,), 0.1, 2)
    assert s.next(now=0.1) is None and s.hold_until == pytest.approx(0.2)  # run 2 is due at 2.71: one trip at most
    s.withdraw(2)  # run 2 left: nothing more to wait for than the gather window
    assert s.next(now=0.1) is None and s.hold_until == pytest.approx(0.11)
    assert s.next(now=0.115) is not None
    s = StepScheduler(max_batch=4, gather_s=0.0, expected=2, merge=True)  # batch_gather_ms = 0: no merging either
    s.sent_at, s.trip_s = {1: 0.0, 2: 0.05}, {1: 0.1, 2: 0.1}
    _round(s, (1,), 0.1, 2)
    assert s.next(now=0.1) is not None


# ---- step grants ----


def terms(sequence: int = 2, start_pos: int = 5) -> GrantTerms:
    return GrantTerms(ring_id=50, sequence=sequence, row_bytes=4, start_pos=start_pos,
                      output=wire.OutputBinding(1, 1001, 0, 0, 4))


def test_a_run_alone_decoding_gets_a_grant_that_continues_its_step_ids() -> None:
    s = StepScheduler(max_batch=2)
    s.ask(asked(1, start_pos=4))
    d = s.next()
    assert d is not None
    g = s.grant_after(d, alone=True, terms=terms())
    assert g == wire.GrantSteps(1, d.step.step_id + 1, 1, 50, 2, 4, wire.OutputBinding(1, 1001, 0, 0, 4),
                                {"start_pos": 5, "slot": 1})
    assert s.grant_after(d, alone=True, terms=terms()) is None  # one at a time
    assert s.finished(d.step.step_id) is d
    s.adopt(g.step_id, (asked(1, start_pos=5, own_step=2),), 1.0)  # the worker started the next row itself
    assert s.in_flight is not None and s.in_flight.step.step_id == g.step_id
    assert s.finished(g.step_id) is not None and s.next() is None  # nothing else goes out while it stands
    s.ask(asked(2))
    assert s.to_revoke(alone=False, active=True) == wire.RevokeGrant(1, 1)
    assert s.to_revoke(alone=False, active=True) is None  # once
    assert s.next() is None
    assert not s.grant_ended(7) and s.grant_ended(1)
    d2 = s.next()
    assert d2 is not None and d2.step.step_id > g.step_id  # ids never reused


@pytest.mark.parametrize(("rows", "alone", "with_terms", "other_waiting"), [
    (64, True, True, False),  # a prompt chunk
    (1, False, True, False),  # another run is here: its rows batch with this one's
    (1, True, False, False),  # the controller cannot say what comes next
    (1, True, True, True),  # a step already waits
])
def test_no_grant_unless_a_lone_decode_row(rows: int, alone: bool, with_terms: bool, other_waiting: bool) -> None:
    s = StepScheduler(max_batch=2)
    s.ask(asked(1, rows=rows))
    d = s.next()
    assert d is not None
    if other_waiting:
        s.ask(asked(2))
    assert s.grant_after(d, alone=alone, terms=terms() if with_terms else None) is None


def test_a_grant_is_revoked_when_its_run_leaves_and_forgotten_with_the_process() -> None:
    s = StepScheduler()
    s.ask(asked(1))
    d = s.next()
    assert d is not None and s.grant_after(d, alone=True, terms=terms()) is not None
    assert s.to_revoke(alone=True, active=True) is None
    assert s.to_revoke(alone=True, active=False) == wire.RevokeGrant(1, 1)
    s.reset()
    assert s.grant is None
