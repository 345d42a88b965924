"""How long a run's readiness barrier waits for its stages (docs/orchestrator.md "Readiness budget").

One fixed limit cannot fit both a 100 MB model on a LAN and a 40 GB one behind a 50 MB/s uplink: it either fails the
big fetch that is doing fine or waits for hours on a stage that hung. So the barrier follows what the stages report.
Each sign of progress from a stage that is not ready yet (its fetch starting, moving or done, its load or compile
moving, its weights loaded, an edge ready) moves the run's deadline to at least `base_s` (readiness_timeout_s) after
that moment. A fetch that reports its measured rate is given what that rate says it still needs, FETCH_MARGIN times
over, when that is longer, as long as it moves at `min_rate_bps` or more (slower than that it is a fetch that will not
end in useful time). When the stages not yet ready report nothing for `base_s`, the wait ends, and the fault says what
each of them last did. (One deadline per run, not per stage: a stage that waits on another, as a compute process waits
for a graph another stage of its host is capturing, is not faulted while that one moves.)

Pure: the run FSM passes every relayed stage event and the time in, and reads `deadline` back."""
from __future__ import annotations

from dataclasses import dataclass

from swactor.v1 import common_pb2 as pb

FETCH_MARGIN = 1.5  # a measured rate wanders: the fetch's estimate is given half again
MIB = 1 << 20

_PROGRESS = {
    pb.WEIGHTS_DOWNLOAD_STARTED: "started its weights fetch",
    pb.WEIGHTS_DOWNLOAD_PROGRESS: "was fetching weights",
    pb.WEIGHTS_DOWNLOADED: "had fetched its weights",
    pb.WEIGHTS_LOAD_PROGRESS: "was loading weights",
    pb.COMPILE_PROGRESS: "was compiling",
    pb.WEIGHTS_LOADED: "had loaded its weights",
    pb.EDGE_READY: "had an edge ready",
}


@dataclass(frozen=True)
class _LastSeen:
    what: str
    at: float


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def _progress_text(ev: pb.LifecycleEvent) -> str:
    c, what = ev.counters, _PROGRESS[ev.kind]
    if ev.kind == pb.WEIGHTS_DOWNLOAD_PROGRESS:
        return f"{what}: {_mib(c.get('bytes_done', 0))} of {_mib(c.get('bytes_total', 0))} at {_mib(c.get('rate_bps', 0))}/s"
    if ev.kind == pb.WEIGHTS_LOAD_PROGRESS:
        return f"{what}: layer {c.get('layers_loaded', 0)} of {c.get('layers_total', 0)}"
    if ev.kind == pb.COMPILE_PROGRESS:
        return f"{what}: {c.get('units_done', 0)} of {c.get('units_total', 0)}"
    return what


class ReadinessBudget:
    """The barrier's deadline for one run, from `begin` (its stages asked to provision) to the barrier passing."""

    def __init__(self, base_s: float, min_rate_bps: int, now: float) -> None:
        self.base_s, self.min_rate_bps = base_s, min_rate_bps
        self.deadline = now + base_s
        self._began = now
        self._last: dict[int, _LastSeen] = {}

    def observe(self, ev: pb.LifecycleEvent, now: float) -> None:
        """A stage's relayed event: progress moves the deadline on; anything else is ignored."""
        if ev.kind not in _PROGRESS or not ev.HasField("stage_index"):
            return
        need = self.base_s
        if ev.kind == pb.WEIGHTS_DOWNLOAD_PROGRESS:
            c = ev.counters
            rate, left = c.get("rate_bps", 0), max(0, c.get("bytes_total", 0) - c.get("bytes_done", 0))
            if rate > 0 and rate >= self.min_rate_bps:
                need = max(need, FETCH_MARGIN * left / rate)
        self.deadline = max(self.deadline, now + need)
        self._last[ev.stage_index] = _LastSeen(_progress_text(ev), now)

    def describe(self, waiting: list[int], now: float) -> str:
        """What each stage still waited for last did, for the fault's detail."""
        parts = []
        for i in waiting:
            seen = self._last.get(i)
            parts.append(f"stage {i} reported no progress in {now - self._began:.0f}s" if seen is None
                         else f"stage {i} {seen.what} {now - seen.at:.0f}s ago")
        return "; ".join(parts)
