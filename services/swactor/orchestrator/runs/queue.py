"""The run queue: a bounded FIFO of submitted runs waiting to be admitted (admission.py; docs/orchestrator.md#run-queue).

`RunQueue` is the pure core: run ids in submission order, at most `depth` of them, `now` passed in;
every change returns the runs whose position moved. `QueuedRun` is one waiting run as the API sees
it (its record in RUN_STATE_QUEUED, its updates for WatchRun, and the RunHandle once it started).
`RunLobby` is the thin shell over both: it stamps, stores, logs and publishes the queue's lifecycle
events (RUN_QUEUED, RUN_QUEUE_MOVED, RUN_QUEUE_WAITING for the head admission holds back, RUN_DEQUEUED,
RUN_STOPPED for a queued run stopped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.orchestrator.runs.runner import RunUpdates
from swactor.orchestrator.runs.store import RunStore, StoreWriteError
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb


class QueueFull(Exception):
    pass


@dataclass(frozen=True)
class Moved:
    run_id: int
    position: int  # 1 = next


class RunQueue:
    """Run ids waiting to start, first in first out, at most `depth`."""

    def __init__(self, depth: int) -> None:
        if depth < 0:
            raise ValueError(f"queue depth must be >= 0, got {depth}")
        self.depth = depth
        self._ids: list[int] = []
        self._since: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, run_id: int) -> bool:
        return run_id in self._since

    def head(self) -> int | None:
        """The next run to start (the only one admission considers), None when empty."""
        return self._ids[0] if self._ids else None

    def position(self, run_id: int) -> int:
        return self._ids.index(run_id) + 1

    def push(self, run_id: int, now: float) -> int:
        """Append; returns its position. QueueFull when `depth` runs already wait."""
        if len(self._ids) >= self.depth:
            raise QueueFull(f"the run queue is full ({len(self._ids)} of {self.depth} runs waiting)")
        if run_id in self._since:
            raise ValueError(f"run {run_id} is already queued")
        self._ids.append(run_id)
        self._since[run_id] = now
        return len(self._ids)

    def push_first(self, run_id: int, now: float) -> list[Moved]:
        """Put a run at the head, past the depth: a request the orchestrator already accepted continuing after its
        run's fault (never refused, never behind requests that came later). Returns the runs that moved back."""
        if run_id in self._since:
            raise ValueError(f"run {run_id} is already queued")
        self._ids.insert(0, run_id)
        self._since[run_id] = now
        return self._moved_from(1)

    def pop(self, now: float) -> tuple[int, float, list[Moved]] | None:
        """The next run, how long it waited, and the runs that moved up; None when empty."""
        if not self._ids:
            return None
        run_id = self._ids.pop(0)
        waited = now - self._since.pop(run_id)
        return run_id, waited, self._moved_from(0)

    def remove(self, run_id: int) -> list[Moved]:
        """Take a run out wherever it stands; returns the runs behind it, which moved up."""
        index = self._ids.index(run_id)
        del self._ids[index]
        del self._since[run_id]
        return self._moved_from(index)

    def _moved_from(self, index: int) -> list[Moved]:
        return [Moved(rid, i + 1) for i, rid in enumerate(self._ids) if i >= index]


class QueuedRun:
    """One waiting run: its record, what starting it needs, and its updates for WatchRun (its RunHandle
    goes on publishing into the same RunUpdates once it starts, so a watcher follows it through)."""

    def __init__(self, record: opb.Run, start: Any) -> None:
        self.record = record
        self.start = start  # the manager's prepared request, opaque here
        self.updates = RunUpdates()

    def publish(self, update: opb.RunUpdate) -> None:
        self.updates.append(update)

    def watch(self) -> AsyncIterator[opb.RunUpdate]:
        return self.updates.watch()


class RunLobby:
    """The queue shell: the core plus each waiting run, their records and events in the store."""

    def __init__(self, depth: int, store: RunStore, clock: Callable[[], float]) -> None:
        self.core = RunQueue(depth)
        self.store = store
        self.clock = clock
        self.waiting: dict[int, QueuedRun] = {}
        self.log = get_logger()

    def __len__(self) -> int:
        return len(self.core)

    def get(self, run_id: int) -> QueuedRun | None:
        return self.waiting.get(run_id)

    def head(self) -> QueuedRun | None:
        run_id = self.core.head()
        return None if run_id is None else self.waiting[run_id]

    def check_room(self) -> None:
        if len(self.core) >= self.core.depth:
            raise QueueFull(f"the run queue is full ({len(self.core)} of {self.core.depth} runs waiting; "
                            "[orchestrator].queue_depth)")

    def enqueue(self, record: opb.Run, start: Any, *, first: bool = False) -> int:
        """Queue a run (`first`: at the head, whatever the depth: a resumed request); returns its position.
        QueueFull when full; StoreWriteError when its record cannot be stored (then nothing is queued)."""
        if not first:
            self.check_room()
        position = 1 if first else len(self.core) + 1
        record.state, record.queue_position = opb.RUN_STATE_QUEUED, position
        ev = self._event(record.run_id, pb.RUN_QUEUED, {"position": position, "queued": len(self.core) + 1})
        try:
            self.store.append(record.run_id, [ev])
            self.store.put(record)  # a new state: written at once, with the event
        except StoreWriteError:
            self.store.discard(record.run_id)
            raise
        moved = self.core.push_first(record.run_id, self.clock()) if first else []
        if not first:
            self.core.push(record.run_id, self.clock())
        queued = QueuedRun(record, start)
        self.waiting[record.run_id] = queued
        self._publish(queued, ev)
        self._moved(moved)
        return position

    def take_next(self) -> QueuedRun | None:
        """The next run to start (RUN_DEQUEUED emitted), the others moved up; None when empty."""
        popped = self.core.pop(self.clock())
        if popped is None:
            return None
        run_id, waited, moved = popped
        queued = self.waiting.pop(run_id)
        queued.record.queue_position, queued.record.queue_wait = 0, ""
        self._record(queued, self._event(run_id, pb.RUN_DEQUEUED, {"waited_ms": round(waited * 1000)}))
        self._moved(moved)
        return queued

    def head_waits(self, why: str) -> None:
        """Admission holds the head back for `why`: RUN_QUEUE_WAITING says so when that changed."""
        head = self.head()
        if head is None or head.record.queue_wait == why:
            return
        head.record.queue_wait = why
        self._record(head, self._event(head.record.run_id, pb.RUN_QUEUE_WAITING, {"position": 1, "queued": len(self.core)},
                                       why))

    def stop(self, run_id: int, detail: str) -> opb.Run:
        """Operator stop of a queued run: it leaves the queue, outcome STOPPED, nothing to tear down."""
        queued = self.waiting.pop(run_id)
        moved = self.core.remove(run_id)
        r = queued.record
        r.state, r.outcome, r.reason, r.detail = opb.RUN_STATE_DONE, opb.RUN_OUTCOME_STOPPED, "operator_stop", detail
        r.queue_position, r.queue_wait, r.outcome_us = 0, "", wall_us()
        self._record(queued, self._event(run_id, pb.RUN_STOPPED, {}, f"{detail} (while queued)"))
        final = opb.Run()
        final.CopyFrom(r)
        queued.publish(opb.RunUpdate(finished=final))
        self._moved(moved)
        return final

    def _moved(self, moved: list[Moved]) -> None:
        for m in moved:
            queued = self.waiting[m.run_id]
            queued.record.queue_position = m.position
            self._record(queued, self._event(m.run_id, pb.RUN_QUEUE_MOVED, {"position": m.position,
                                                                           "queued": len(self.core)}))

    @staticmethod
    def _event(run_id: int, kind: int, counters: dict[str, int], detail: str = "") -> pb.LifecycleEvent:
        ev = pb.LifecycleEvent(kind=kind, run_id=run_id, component=pb.COMPONENT_ORCHESTRATOR, time_us=wall_us(),
                               detail=detail)
        ev.counters.update(counters)
        return ev

    def _publish(self, queued: QueuedRun, ev: pb.LifecycleEvent) -> None:
        queued.publish(opb.RunUpdate(event=ev))
        self.log.info("lifecycle_event", run_id=ev.run_id, kind=pb.LifecycleEventKind.Name(ev.kind),
                      **dict(ev.counters), **({"detail": ev.detail} if ev.detail else {}))

    def _record(self, queued: QueuedRun, ev: pb.LifecycleEvent) -> None:
        """Publish an event and store it with the run's record. A write error is logged only: the
        store holds both and retries, and the run, once started, faults on its own next write."""
        self._publish(queued, ev)
        try:
            self.store.append(ev.run_id, [ev])
            self.store.put(queued.record)
        except StoreWriteError as e:
            self.log.error("run_store_write_failed", run_id=ev.run_id, error=str(e))
