"""The run store: SQLite in the state directory, one row per run plus every §40 lifecycle event.

Run records are `orchestrator_pb2.Run` messages stored whole (with indexed columns for queries);
events are `common_pb2.LifecycleEvent` messages in arrival order. `recover()` runs at startup: a
run that was not DONE when the previous orchestrator process ended can never finish, so it is
marked faulted with reason RUN_FAULT_ORCHESTRATOR_RESTARTED (never left "running").

Writes are batched: a run emits ~25 events per decode token (more with edge timings), and one SQLite
transaction each cost the orchestrator a few ms of CPU per token on the hosts it shares with a stage.
Events and in-between record updates are held for at most FLUSH_AFTER_S (or FLUSH_ROWS rows) and
written in one transaction; a record whose state changed is written at once (with everything held),
and every read flushes first. A crash loses at most the last FLUSH_AFTER_S of per-token events and
token updates of a running run, which recover() marks faulted anyway.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from swactor.v1 import common_pb2, orchestrator_pb2

DB_NAME = "orchestrator.sqlite3"
ORCHESTRATOR_RESTARTED = common_pb2.RunFaultReason.Name(common_pb2.RUN_FAULT_ORCHESTRATOR_RESTARTED)
FLUSH_AFTER_S = 0.1
FLUSH_ROWS = 512
_PUT = ("INSERT INTO runs (run_id, state, outcome, created_us, record) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, outcome = excluded.outcome, record = excluded.record")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id     INTEGER PRIMARY KEY,
    state      INTEGER NOT NULL,
    outcome    INTEGER NOT NULL,
    created_us INTEGER NOT NULL,
    record     BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created_us DESC);
CREATE TABLE IF NOT EXISTS events (
    run_id      INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    kind        INTEGER NOT NULL,
    time_us     INTEGER NOT NULL,
    node_id     INTEGER NOT NULL,
    stage_index INTEGER,
    event       BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX IF NOT EXISTS events_kind ON events (run_id, kind);
"""


class RunStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._next_seq: dict[int, int] = {}
        self._clock = clock
        self._events: list[tuple] = []             # held event rows
        self._records: dict[int, tuple] = {}       # held record rows, the latest per run
        self._states: dict[int, tuple[int, int]] = {}  # (state, outcome) last written per run
        self._held_since: float | None = None

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> RunStore:
        return cls(state_dir / DB_NAME)

    def close(self) -> None:
        self.flush()
        self._db.close()

    def flush(self) -> None:
        """Write everything held, in one transaction."""
        if not self._events and not self._records:
            return
        with self._db:  # BEGIN ... COMMIT
            self._db.execute("BEGIN")
            self._db.executemany(_PUT, list(self._records.values()))
            self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", self._events)
        self._events.clear()
        self._records.clear()
        self._held_since = None

    def _hold(self) -> None:
        now = self._clock()
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since >= FLUSH_AFTER_S or len(self._events) >= FLUSH_ROWS:
            self.flush()

    # ---- runs ----

    def put(self, run: orchestrator_pb2.Run) -> None:
        """Store the record; written at once when its state or outcome changed, else held like events."""
        self._records[run.run_id] = (run.run_id, run.state, run.outcome, run.created_us, run.SerializeToString())
        if self._states.get(run.run_id) != (run.state, run.outcome):
            self._states[run.run_id] = (run.state, run.outcome)
            self.flush()
        else:
            self._hold()

    def get(self, run_id: int) -> orchestrator_pb2.Run | None:
        self.flush()
        row = self._db.execute("SELECT record FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else orchestrator_pb2.Run.FromString(row[0])

    def list(self, limit: int = 50) -> list[orchestrator_pb2.Run]:
        self.flush()
        rows = self._db.execute("SELECT record FROM runs ORDER BY created_us DESC, rowid DESC LIMIT ?", (limit,))
        return [orchestrator_pb2.Run.FromString(r[0]) for r in rows]

    # ---- events ----

    def append(self, run_id: int, events: Iterable[common_pb2.LifecycleEvent]) -> None:
        seq = self._next_seq.get(run_id)
        if seq is None:
            row = self._db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE run_id = ?", (run_id,)).fetchone()
            seq = int(row[0])
        rows = []
        for ev in events:
            stage = ev.stage_index if ev.HasField("stage_index") else None
            rows.append((run_id, seq, ev.kind, ev.time_us, ev.node_id, stage, ev.SerializeToString()))
            seq += 1
        self._next_seq[run_id] = seq
        if rows:
            self._events.extend(rows)
            self._hold()

    def events(self, run_id: int, kind: int = 0) -> list[common_pb2.LifecycleEvent]:
        self.flush()
        if kind:
            rows = self._db.execute("SELECT event FROM events WHERE run_id = ? AND kind = ? ORDER BY seq", (run_id, kind))
        else:
            rows = self._db.execute("SELECT event FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        return [common_pb2.LifecycleEvent.FromString(r[0]) for r in rows]

    # ---- restart ----

    def recover(self, now_us: int) -> list[orchestrator_pb2.Run]:
        """Mark every run left unfinished by a previous process as faulted; returns those runs."""
        rows = self._db.execute("SELECT record FROM runs WHERE state != ?", (orchestrator_pb2.RUN_STATE_DONE,)).fetchall()
        interrupted = []
        for (blob,) in rows:
            run = orchestrator_pb2.Run.FromString(blob)
            prior = orchestrator_pb2.RunState.Name(run.state)
            had_outcome = run.outcome != orchestrator_pb2.RUN_OUTCOME_UNSPECIFIED
            if not had_outcome:
                run.outcome = orchestrator_pb2.RUN_OUTCOME_FAULTED
                run.reason = ORCHESTRATOR_RESTARTED
                run.outcome_us = now_us
            run.detail = (run.detail + "; " if run.detail else "") + (
                f"orchestrator restarted while the run was {prior}; teardown was not confirmed")
            run.state = orchestrator_pb2.RUN_STATE_DONE
            if not had_outcome:
                self.append(run.run_id, [common_pb2.LifecycleEvent(
                    kind=common_pb2.RUN_FAULTED, run_id=run.run_id, reason=ORCHESTRATOR_RESTARTED,
                    component=common_pb2.COMPONENT_ORCHESTRATOR, time_us=now_us, detail=run.detail)])
            self.put(run)
            interrupted.append(run)
        return interrupted
