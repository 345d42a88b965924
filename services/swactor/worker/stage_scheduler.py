"""Which runs' steps the compute process runs next, and as how many ExecuteSteps: the stage's step scheduler.

An I/O-free core beside the StageControllers (stage_fsm.py). Each run's StageController asks for one step at a
time (its ExecuteStep: one input object, one output, one run's rows); the compute process runs one step at a time.
The scheduler stands between them (docs/runs-in-flight.md):

- Steps of one row (a decode step, or a prompt sent row by row) of several runs go through the stage as *one*
  batched ExecuteStep (inputs and outputs in the runs' order, runtime {"rows": [{slot, start_pos, sample, rewind}, ...]}):
  the stage's weights are read once for every run waiting.
- A prompt chunk (more than one row) runs alone. When chunks and rows both wait, they alternate: a decode row waits
  at most one other run's chunk, and a new run's prompt is not stalled behind an endless stream of decode batches.
- A run joins or leaves between steps: the next dispatch takes whatever waits then.
- Gathering: a decode row comes back to a stage only after its run's token went round (the other stages, the
  orchestrator), so rows of runs in flight arrive spread out, and a scheduler that sent whatever waits would send one
  row at a time for ever (measured: 34 of 40 steps of four runs in flight went alone). While fewer rows wait than runs
  are decoding here (`expected`), the rows wait up to `gather_s` from the first one's arrival for the others; once
  batched, the runs' rows come back close together and stay batched.
- Merging groups: runs that joined at different times can settle into groups that go round the pipeline out of step
  (at S=3, three runs at one stage while the fourth is at the next, for ever), and each group's step waits its gather
  window in vain. The stage where rows enter the pipeline again (`merge`: the first) knows when each run's row went
  out and how long its last trip round took, so it holds a group's rows until the rows of the runs still out are due
  back (never longer than the waiting rows' own trip round): the groups become one, once, and stay one. Only that
  stage holds past the gather window, so two stages never wait on each other.

- Step grants: a run alone on the stage, decoding, gets a standing grant of its next one-row steps (wire.GrantSteps),
  so its decode step starts as its input loads, without a round trip through this process (docs/worker.md "Step
  grants"). While a grant stands nothing else is sent; a step of another run (or any other step) waiting revokes it
  first. A granted step the worker started is adopted as the one in flight.

Step ids: the compute process sees the scheduler's own ids (runs' StageControllers count theirs from 1 each); a
completion or failure is answered to each run in the step with its own step id (`Dispatch.members`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from swactor.worker.process import wire
from swactor.worker.stage_messages import GrantTerms


@dataclass(frozen=True)
class Asked:
    """One run's step as its StageController asked for it (`at`: when, on the caller's clock)."""

    run_id: int
    slot: int
    rows: int
    step: wire.ExecuteStep
    at: float = 0.0


@dataclass(frozen=True)
class Dispatch:
    """One ExecuteStep sent to the compute process and the runs' steps it carries."""

    step: wire.ExecuteStep
    members: tuple[Asked, ...]
    sent_at: float = 0.0  # when `next` sent it (the caller's clock): its completion tells the step's duration

    @property
    def batched(self) -> bool:
        return len(self.members) > 1


@dataclass
class StandingGrant:
    """A GrantSteps sent to the compute process and not yet ended (GrantEnded)."""

    run_id: int
    grant: wire.GrantSteps
    revoking: bool = False  # RevokeGrant sent: nothing more to do but wait for GrantEnded


@dataclass
class StepScheduler:
    max_batch: int = 1  # the most runs' rows one step carries (the stage's KV slots)
    gather_s: float = 0.0  # how long rows wait for the other decoding runs' rows (0: never)
    expected: int = 0  # runs decoding here, whose rows may come (the caller keeps it current)
    merge: bool = False  # rows enter the pipeline here: a group of rows waits for the others due back
    hold_until: float | None = None  # rows are being gathered: `next` has nothing to send before this
    waiting: dict[int, Asked] = field(default_factory=dict)  # run_id -> its step, in the order they asked
    in_flight: Dispatch | None = None
    chunk_last: bool = False  # the last dispatch was a prompt chunk: rows go next if any wait
    widths: Counter[int] = field(default_factory=Counter)  # steps sent, by how many runs they carried
    grant: StandingGrant | None = None
    sent_at: dict[int, float] = field(default_factory=dict)  # run_id -> when its last step went out
    trip_s: dict[int, float] = field(default_factory=dict)  # run_id -> how long its last row took to come back
    _next_step_id: int = 0
    _next_grant_id: int = 0

    def ask(self, asked: Asked) -> None:
        """A run's StageController asked for a step; it goes out with a later `next`."""
        if asked.run_id in self.waiting:
            raise ValueError(f"run {asked.run_id} asked for a second step before its first ran")
        self.waiting[asked.run_id] = asked
        if asked.run_id in self.sent_at:
            self.trip_s[asked.run_id] = asked.at - self.sent_at[asked.run_id]

    def finished(self, step_id: int) -> Dispatch | None:
        """The compute process completed or failed step `step_id`: the dispatch that ended (None: not the one in
        flight). The caller answers its runs before it asks for `next`, so the runs that ask again join it."""
        if self.in_flight is None or self.in_flight.step.step_id != step_id:
            return None
        ended, self.in_flight = self.in_flight, None
        return ended

    def withdraw(self, run_id: int) -> Asked | None:
        """A run left (stopped, faulted): its step that has not been sent, whose input the caller releases."""
        self.sent_at.pop(run_id, None)
        self.trip_s.pop(run_id, None)
        return self.waiting.pop(run_id, None)

    def reset(self) -> list[Asked]:
        """The compute process is gone: every step waiting or in flight ends with it, and its grant."""
        lost = list(self.waiting.values()) + (list(self.in_flight.members) if self.in_flight else [])
        self.waiting.clear()
        self.sent_at.clear()
        self.trip_s.clear()
        self.in_flight = None
        self.grant = None
        return lost

    # ---- step grants ----

    def grant_after(self, dispatch: Dispatch, alone: bool, terms: GrantTerms | None) -> wire.GrantSteps | None:
        """The grant to send after `dispatch`, or None: a decode row of a run alone here (`alone`: no other run
        active on the stage) whose controller can name the next step (`terms`)."""
        if self.grant is not None or terms is None or not alone or dispatch.batched or dispatch.members[0].rows != 1 \
                or self.waiting:
            return None
        asked = dispatch.members[0]
        self._next_grant_id += 1
        cmd = wire.GrantSteps(asked.step.role_id, dispatch.step.step_id + 1, self._next_grant_id, terms.ring_id,
                              terms.sequence, terms.row_bytes, terms.output, {"start_pos": terms.start_pos, "slot": asked.slot})
        self.grant = StandingGrant(asked.run_id, cmd)
        return cmd

    def to_revoke(self, alone: bool, active: bool) -> wire.RevokeGrant | None:
        """RevokeGrant when the standing grant must end: another step waits, another run is here (`alone` False),
        or its run is leaving (`active` False). Once per grant."""
        g = self.grant
        if g is None or g.revoking or (alone and active and not self.waiting):
            return None
        g.revoking = True
        return wire.RevokeGrant(g.grant.role_id, g.grant.grant_id)

    def grant_ended(self, grant_id: int) -> bool:
        """GrantEnded: True when it was the standing grant (dispatch may go on)."""
        if self.grant is None or self.grant.grant.grant_id != grant_id:
            return False
        self.grant = None
        return True

    def adopt(self, worker_step_id: int, members: tuple[Asked, ...], now: float = 0.0) -> None:
        """The compute process started step `worker_step_id` under the grant (its ObjectLoaded said so): it is the
        step in flight, answered to `members` (none: its run had left) when it ends."""
        first = members[0].step if members else None
        step = wire.ExecuteStep(first.role_id if first else 0, worker_step_id, first.inputs if first else [],
                                first.outputs if first else [], first.runtime if first else {})
        self._next_step_id = max(self._next_step_id, worker_step_id)
        self.in_flight = Dispatch(step, members, now)
        self.sent_at.update((a.run_id, now) for a in members)

    # ---- policy ----

    def next(self, now: float = 0.0) -> Dispatch | None:
        """The step to send now (one run's, or several runs' rows as one), when the compute process is idle; None
        also while rows are gathered (`hold_until` says till when)."""
        self.hold_until = None
        if self.in_flight is not None or not self.waiting or self.grant is not None:
            return None
        rows = [a for a in self.waiting.values() if a.rows == 1]
        chunks = [a for a in self.waiting.values() if a.rows > 1]
        if chunks and (not rows or not self.chunk_last):
            self.chunk_last = True
            return self._send((chunks[0],), now)
        deadline = rows[0].at + self.gather_s
        if self.merge and self.gather_s > 0:  # no gathering (0): no merging either
            deadline = max(deadline, self._others_due(rows[0].at))
        if not chunks and len(rows) < min(self.expected, self.max_batch) and now < deadline:  # never idle past a chunk
            self.hold_until = deadline
            return None
        self.chunk_last = False
        return self._send(tuple(rows[:self.max_batch]), now)

    def _others_due(self, first_at: float) -> float:
        """When the rows of the runs out round the pipeline are due back here: each went out at `sent_at` and takes
        about its last trip, give or take a gather window and a tenth of the trip. A row later than that, or a run
        never seen round, is not waited for; nor longer than the waiting rows' own trip from the first of them (by
        then they could have gone round once more: the others are a different round's)."""
        out = [(self.sent_at[r], trip) for r, trip in self.trip_s.items() if r not in self.waiting]
        if not out:
            return first_at
        due = max(sent + trip * 1.1 + self.gather_s for sent, trip in out)
        own = [self.trip_s[r] for r in self.waiting if r in self.trip_s]
        return min(due, first_at + max(own or [trip for _, trip in out]))

    def _send(self, members: tuple[Asked, ...], now: float) -> Dispatch:
        for a in members:
            del self.waiting[a.run_id]
            self.sent_at[a.run_id] = now
        self._next_step_id += 1
        self.widths[len(members)] += 1
        self.in_flight = Dispatch(self._compose(self._next_step_id, members), members, now)
        return self.in_flight

    @staticmethod
    def _compose(step_id: int, members: tuple[Asked, ...]) -> wire.ExecuteStep:
        first = members[0].step
        if len(members) == 1:
            return wire.ExecuteStep(first.role_id, step_id, first.inputs, first.outputs,
                                    {**first.runtime, "slot": members[0].slot}, first.release_inputs_after)
        rows: list[dict[str, Any]] = [{"slot": a.slot, "start_pos": a.step.runtime["start_pos"],
                                       "sample": a.step.runtime.get("sample", True)}
                                      | ({"rewind": a.step.runtime["rewind"]} if "rewind" in a.step.runtime else {})
                                      for a in members]
        return wire.ExecuteStep(first.role_id, step_id, [b for a in members for b in a.step.inputs],
                                [b for a in members for b in a.step.outputs], {"rows": rows}, True)
