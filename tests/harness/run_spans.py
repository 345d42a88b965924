"""How many runs were in the pipeline at once, from their lifecycle events (runs-in-flight tests)."""

from __future__ import annotations

from collections.abc import Iterable

from swactor.v1 import common_pb2 as pb

OUTCOMES = (pb.RUN_COMPLETED, pb.RUN_FAULTED, pb.RUN_STOPPED)


def run_span(events: Iterable[pb.LifecycleEvent]) -> tuple[int, int]:
    """[prompt injected, outcome] of one run, in wall-clock µs."""
    times = {e.kind: e.time_us for e in events}
    return times[pb.PROMPT_INJECTED], min(t for k, t in times.items() if k in OUTCOMES)


def most_at_once(spans: list[tuple[int, int]]) -> int:
    """The most spans that overlap at one instant (the start of one of them)."""
    return max(sum(a <= t <= b for a, b in spans) for t, _ in spans)
