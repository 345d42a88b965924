"""Run store retention: which finished runs to delete, and when to look (docs/orchestrator.md#run-store).

Pure: the finished runs and the current times are passed in. A run is deleted once `max_runs`
newer finished runs exist, or once it was created more than `max_age_s` ago (0 turns either limit
off). Runs not finished (queued, active) are never candidates. One pass deletes at most `batch` runs
(oldest first) so that a pass after the limits were lowered never holds the event loop long; a full
pass asks for the next one at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DAY_S = 86400.0


@dataclass(frozen=True)
class RetentionPolicy:
    max_runs: int = 1000
    max_age_s: float = 30 * DAY_S
    batch: int = 200
    interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_runs < 0 or self.max_age_s < 0:
            raise ValueError(f"retention limits must be >= 0 (0 = off), got max_runs {self.max_runs}, "
                             f"max_age_s {self.max_age_s}")
        if self.batch <= 0:
            raise ValueError(f"retention batch must be positive, got {self.batch}")

    def victims(self, finished: Sequence[tuple[int, int]], now_us: int) -> list[int]:
        """Run ids to delete from `finished` ((run_id, created_us), newest first), oldest first."""
        cutoff = now_us - round(self.max_age_s * 1e6) if self.max_age_s else None
        out = [run_id for i, (run_id, created_us) in enumerate(finished)
               if (self.max_runs and i >= self.max_runs) or (cutoff is not None and created_us < cutoff)]
        out.reverse()
        return out[:self.batch]


class RetentionSchedule:
    """When the next pass is due: every `interval_s`, at once after a run finished or a full pass."""

    def __init__(self, policy: RetentionPolicy, now: float) -> None:
        self.policy = policy
        self.next_at = now

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def run_finished(self, now: float) -> None:
        self.next_at = min(self.next_at, now)

    def passed(self, now: float, deleted: int) -> None:
        self.next_at = now if deleted >= self.policy.batch else now + self.policy.interval_s
