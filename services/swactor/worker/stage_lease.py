"""The stage's hold on its run: a lease from the orchestrator, kept alive by its control stream (issue 12).

A node serves a provisioned run only while the orchestrator that provisioned it follows it
(WatchStage). Without that, a stage whose orchestrator crashed, was partitioned away, or restarted
and never came back would stay Ready or Faulted forever, its rings leased and every new run refused
("run ... is still active here"). So: while no WatchStage stream of the run is open for `window_s`
(counted from provisioning until the first stream opens, and from the last stream's end after
that), the lease expires and the node faults the stage fail-stop and tears it down (§14 Faulted ->
Stopping -> Stopped: edges stopped, rings quiesced, leases released), after which it is Available
for the next run. gRPC keepalive on the control listener (control_tls.KEEPALIVE) ends a stream
whose orchestrator is dead or unreachable within seconds, so the lease also covers a partition.

    Unwatched --watch opens--> Watched --last watch ends--> Unwatched --window passes--> Expired
    any --the run stopped here--> Ended

An I/O-free core: `now` is passed in; the node shell arms one timer at `deadline()` and feeds `tick`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from swactor.common.events import get_logger

DEFAULT_WINDOW_S = 5.0


class LeaseState(enum.Enum):
    UNWATCHED = "Unwatched"  # no control stream open: expires at `since + window_s`
    WATCHED = "Watched"      # at least one WatchStage stream of the run is open
    EXPIRED = "Expired"      # terminal: the node tears the stage down
    ENDED = "Ended"          # terminal: the run stopped here anyway


@dataclass(frozen=True)
class LeaseExpired:
    """The action of an expiry: fault the stage (fail-stop) and stop it."""

    run_id: int
    unwatched_s: float
    detail: str


@dataclass
class StageLease:
    run_id: int
    window_s: float
    since: float  # when the lease was granted or the last stream ended
    state: LeaseState = LeaseState.UNWATCHED
    watchers: int = 0
    watched_ever: bool = False

    @classmethod
    def grant(cls, run_id: int, window_s: float, now: float) -> StageLease:
        lease = cls(run_id, window_s, now)
        lease._log("stage_lease_granted", window_s=window_s)
        return lease

    def _log(self, event: str, **facts: object) -> None:
        get_logger(run_id=self.run_id, component="stage_lease").info(event, state=self.state.value, **facts)

    def _transition(self, new: LeaseState, **facts: object) -> None:
        old, self.state = self.state, new
        get_logger(run_id=self.run_id, component="stage_lease").info("stage_lease_state", old=old.value,
                                                                      new=new.value, **facts)

    @property
    def live(self) -> bool:
        return self.state in (LeaseState.UNWATCHED, LeaseState.WATCHED)

    def attach(self, now: float) -> None:
        """A WatchStage stream of the run opened."""
        if not self.live:
            return
        self.watchers += 1
        self.watched_ever = True
        if self.state is LeaseState.UNWATCHED:
            self._transition(LeaseState.WATCHED, unwatched_s=round(now - self.since, 3))

    def detach(self, now: float) -> None:
        """A WatchStage stream of the run ended (the client went away, or the run stopped)."""
        if not self.live or self.watchers == 0:
            return
        self.watchers -= 1
        if self.watchers == 0:
            self.since = now
            self._transition(LeaseState.UNWATCHED, expires_in_s=self.window_s)

    def end(self) -> None:
        """The run reached StageStopped here: nothing left to reclaim."""
        if self.live:
            self._transition(LeaseState.ENDED)

    def deadline(self) -> float | None:
        return self.since + self.window_s if self.state is LeaseState.UNWATCHED else None

    def tick(self, now: float) -> list[LeaseExpired]:
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return []
        unwatched = now - self.since
        what = "since its last control stream ended" if self.watched_ever else "since provisioning, never watched"
        detail = (f"no WatchStage stream from the orchestrator for {unwatched:.1f}s {what} "
                  f"(window {self.window_s:g}s): the orchestrator is gone or unreachable")
        self._transition(LeaseState.EXPIRED, unwatched_s=round(unwatched, 3))
        return [LeaseExpired(self.run_id, unwatched, detail)]
