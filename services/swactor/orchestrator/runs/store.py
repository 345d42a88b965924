"""The run store: SQLite in the state directory, one row per run plus every §40 lifecycle event.

Run records are `orchestrator_pb2.Run` messages stored whole (with indexed columns for queries);
events are `common_pb2.LifecycleEvent` messages in arrival order. A run submitted with a client request
id has a `client_requests` row (the id, the run, the request's digest: client_requests.py), written in
the transaction that writes the run's first record and deleted with the run. `recover()` runs at startup: a
run that was not DONE when the previous orchestrator process ended can never finish, so it is
marked faulted with reason RUN_FAULT_ORCHESTRATOR_RESTARTED (never left "running" or "queued").

Writes are batched: a run emits ~25 events per decode token (more with edge timings), and one SQLite
transaction each cost the orchestrator a few ms of CPU per token on the hosts it shares with a stage.
Events and in-between record updates are held for at most FLUSH_AFTER_S (or FLUSH_ROWS rows) and
written in one transaction; a record whose state changed is written at once (with everything held),
and every read flushes first. A crash loses at most the last FLUSH_AFTER_S of per-token events and
token updates of a running run, which recover() marks faulted anyway.

A write that fails (disk full, read-only, I/O error) raises StoreWriteError to the writer, which
faults its run (RUN_FAULT_STORE_WRITE_FAILED); the rows stay held and are written by a later flush
that succeeds (events beyond MAX_HELD_EVENTS are dropped, counted in `dropped_events`), and reads see
the held records meanwhile. Retention (retention.py) deletes old finished runs with `delete_runs`,
whose pages go back to the file system (incremental auto-vacuum, then a truncating WAL checkpoint).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from swactor.common.events import get_logger
from swactor.v1 import common_pb2, orchestrator_pb2

DB_NAME = "orchestrator.sqlite3"
ORCHESTRATOR_RESTARTED = common_pb2.RunFaultReason.Name(common_pb2.RUN_FAULT_ORCHESTRATOR_RESTARTED)
FLUSH_AFTER_S = 0.1
FLUSH_ROWS = 512
MAX_HELD_EVENTS = 8 * FLUSH_ROWS
WAL_KEEP_BYTES = 1 << 20
_AUTO_VACUUM_INCREMENTAL = 2
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
CREATE TABLE IF NOT EXISTS client_requests (
    client_request_id TEXT PRIMARY KEY,
    run_id            INTEGER NOT NULL,
    digest            BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS client_requests_run ON client_requests (run_id);
"""


class StoreWriteError(Exception):
    """The run store could not be written; the message names SQLite's error."""


class RunStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # Deleted runs' pages return to the file system (delete_runs); set before any table exists,
        # an older store is converted once by a VACUUM.
        self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # The write-ahead log is cut back to this after each checkpoint instead of keeping its largest size.
        self._db.execute(f"PRAGMA journal_size_limit={WAL_KEEP_BYTES}")
        self._db.executescript(_SCHEMA)
        if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] != _AUTO_VACUUM_INCREMENTAL:
            self._db.execute("VACUUM")
        self._next_seq: dict[int, int] = {}
        self._clock = clock
        self._events: list[tuple] = []             # held event rows
        self._records: dict[int, tuple] = {}       # held record rows, the latest per run
        self._requests: dict[int, tuple] = {}      # held client_requests rows, by run
        self._staged_requests: dict[int, tuple] = {}  # client_requests rows waiting for their run's first put
        self._states: dict[int, tuple[int, int]] = {}  # (state, outcome) last put per run
        self._held_since: float | None = None
        self.dropped_events = 0
        self.log = get_logger()

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> RunStore:
        return cls(state_dir / DB_NAME)

    def close(self) -> None:
        try:
            self.flush()
        except StoreWriteError as e:
            self.log.error("run_store_write_failed", error=str(e), records_lost=len(self._records))
        self._db.close()

    def flush(self) -> None:
        """Write everything held, in one transaction; StoreWriteError if it fails (rows stay held)."""
        if not self._events and not self._records and not self._requests:
            return
        try:
            with self._db:  # BEGIN ... COMMIT, ROLLBACK on error
                self._db.execute("BEGIN")
                self._db.executemany(_PUT, list(self._records.values()))
                self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", self._events)
                self._db.executemany("INSERT INTO client_requests VALUES (?, ?, ?)", list(self._requests.values()))
        except sqlite3.Error as e:
            self._held_since = self._clock()  # retried by the next write after FLUSH_AFTER_S
            excess = len(self._events) - MAX_HELD_EVENTS
            if excess > 0:
                del self._events[:excess]
                self.dropped_events += excess
            raise StoreWriteError(f"{type(e).__name__}: {e} ({self.path})") from None
        self._events.clear()
        self._records.clear()
        self._requests.clear()
        self._held_since = None

    def _hold(self) -> None:
        now = self._clock()
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since >= FLUSH_AFTER_S or len(self._events) >= FLUSH_ROWS:
            self.flush()

    def _flush_for_read(self) -> None:
        try:
            self.flush()
        except StoreWriteError as e:  # the writers fault their runs; a read shows what is held
            self.log.warning("run_store_write_failed", error=str(e), during="read")

    # ---- runs ----

    def put(self, run: orchestrator_pb2.Run) -> None:
        """Store the record; written at once when its state or outcome changed, else held like events."""
        request = self._staged_requests.pop(run.run_id, None)
        if request is not None:
            self._requests[run.run_id] = request
        self._records[run.run_id] = (run.run_id, run.state, run.outcome, run.created_us, run.SerializeToString())
        if self._states.get(run.run_id) != (run.state, run.outcome):
            self._states[run.run_id] = (run.state, run.outcome)
            self.flush()
        else:
            self._hold()

    def get(self, run_id: int) -> orchestrator_pb2.Run | None:
        self._flush_for_read()
        held = self._records.get(run_id)
        if held is not None:
            return orchestrator_pb2.Run.FromString(held[4])
        row = self._db.execute("SELECT record FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else orchestrator_pb2.Run.FromString(row[0])

    def list(self, limit: int = 50, max_bytes: int = 0) -> list[orchestrator_pb2.Run]:
        """Newest first, at most `limit`, stopping before `max_bytes` of records (0: no byte limit)."""
        self._flush_for_read()
        rows = self._db.execute("SELECT run_id, created_us, record FROM runs ORDER BY created_us DESC, rowid DESC "
                                "LIMIT ?", (limit,)).fetchall()
        if self._records:  # records a failed write left held: they are newer than what is on disk
            by_id = {r[0]: r for r in rows}
            by_id.update({rid: (rid, rec[3], rec[4]) for rid, rec in self._records.items()})
            rows = sorted(by_id.values(), key=lambda r: -r[1])[:limit]
        runs, size = [], 0
        for _, _, blob in rows:
            size += len(blob)
            if max_bytes and runs and size > max_bytes:
                break
            runs.append(orchestrator_pb2.Run.FromString(blob))
        return runs

    def release(self, run_id: int) -> None:
        """The run is finished: forget what is kept in memory to batch its writes."""
        self._next_seq.pop(run_id, None)
        self._states.pop(run_id, None)

    def discard(self, run_id: int) -> None:
        """Drop a run's held (unwritten) rows: its submission was refused (its rows could not be written, or it
        was refused after its client request id was held)."""
        self._records.pop(run_id, None)
        self._events = [e for e in self._events if e[0] != run_id]
        self._requests.pop(run_id, None)
        self._staged_requests.pop(run_id, None)
        self.release(run_id)

    # ---- client request ids ----

    def remember_request(self, client_request_id: str, run_id: int, digest: bytes) -> None:
        """Stage the id's row for the run's first `put` (a new state: written at once), which writes both in one
        transaction: an id never names a run the store does not have, nor a kept run lose its id. A flush before
        that put (an event of the run held first) leaves it staged."""
        self._staged_requests[run_id] = (client_request_id, run_id, digest)

    def request_run(self, client_request_id: str) -> tuple[int, bytes] | None:
        """(run_id, request digest) recorded for the id; None when no kept run has it."""
        self._flush_for_read()
        held = next((row for row in self._requests.values() if row[0] == client_request_id), None)
        if held is not None:  # a failed write left it held, with its run's record
            return held[1], held[2]
        row = self._db.execute("SELECT run_id, digest FROM client_requests WHERE client_request_id = ?",
                               (client_request_id,)).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    # ---- events ----

    def append(self, run_id: int, events: Iterable[common_pb2.LifecycleEvent]) -> None:
        seq = self._next_seq.get(run_id)
        if seq is None:  # after those on disk and those still held (a released run may get a late event)
            row = self._db.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE run_id = ?", (run_id,)).fetchone()
            seq = max([int(row[0])] + [e[1] + 1 for e in self._events if e[0] == run_id])
        rows = []
        for ev in events:
            stage = ev.stage_index if ev.HasField("stage_index") else None
            rows.append((run_id, seq, ev.kind, ev.time_us, ev.node_id, stage, ev.SerializeToString()))
            seq += 1
        self._next_seq[run_id] = seq
        if rows:
            self._events.extend(rows)
            self._hold()

    def events_page(self, run_id: int, kind: int = 0, start_seq: int = 0, limit: int = 1000,
                    max_bytes: int = 1 << 20) -> tuple[list[common_pb2.LifecycleEvent], int | None]:
        """Events from `start_seq` on, at most `limit` and (past the first) `max_bytes` of them; and the
        seq to ask for next (None: no more)."""
        self._flush_for_read()
        if kind:
            rows = self._db.execute("SELECT seq, event FROM events WHERE run_id = ? AND kind = ? AND seq >= ? "
                                    "ORDER BY seq LIMIT ?", (run_id, kind, start_seq, limit + 1)).fetchall()
        else:
            rows = self._db.execute("SELECT seq, event FROM events WHERE run_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
                                    (run_id, start_seq, limit + 1)).fetchall()
        events, size = [], 0
        for i, (seq, blob) in enumerate(rows):
            size += len(blob)
            if i == limit or (events and size > max_bytes):
                return events, seq
            events.append(common_pb2.LifecycleEvent.FromString(blob))
        return events, None

    def iter_events(self, run_id: int, kind: int = 0) -> Iterator[common_pb2.LifecycleEvent]:
        """Every event of a run, read a page at a time."""
        start: int | None = 0
        while start is not None:
            page, start = self.events_page(run_id, kind, start)
            yield from page

    def events(self, run_id: int, kind: int = 0) -> list[common_pb2.LifecycleEvent]:
        return list(self.iter_events(run_id, kind))

    # ---- retention ----

    def finished_runs(self) -> list[tuple[int, int]]:
        """(run_id, created_us) of every finished run, newest first."""
        self._flush_for_read()
        return self._db.execute("SELECT run_id, created_us FROM runs WHERE state = ? ORDER BY created_us DESC, "
                                "rowid DESC", (orchestrator_pb2.RUN_STATE_DONE,)).fetchall()

    def delete_runs(self, run_ids: Sequence[int]) -> None:
        """Delete runs with their events and client request ids, and give the freed pages back to the file system."""
        if not run_ids:
            return
        self.flush()
        marks = ",".join("?" * len(run_ids))
        try:
            with self._db:
                self._db.execute("BEGIN")
                self._db.execute(f"DELETE FROM events WHERE run_id IN ({marks})", tuple(run_ids))
                self._db.execute(f"DELETE FROM client_requests WHERE run_id IN ({marks})", tuple(run_ids))
                self._db.execute(f"DELETE FROM runs WHERE run_id IN ({marks})", tuple(run_ids))
            # One freed page per statement step: executescript steps it to the end (execute would not).
            self._db.executescript("PRAGMA incremental_vacuum;")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as e:
            raise StoreWriteError(f"{type(e).__name__}: {e} ({self.path})") from None

    def size_bytes(self) -> int:
        """The database and its write-ahead log on disk."""
        return sum(p.stat().st_size for p in (self.path, self.path.with_name(self.path.name + "-wal")) if p.exists())

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
            if run.state == orchestrator_pb2.RUN_STATE_QUEUED:
                what = f"queued (position {run.queue_position}); it never started"
            else:
                what = f"{prior}; teardown was not confirmed"
            run.detail = (run.detail + "; " if run.detail else "") + f"orchestrator restarted while the run was {what}"
            run.state = orchestrator_pb2.RUN_STATE_DONE
            run.queue_position, run.queue_wait = 0, ""
            if not had_outcome:
                self.append(run.run_id, [common_pb2.LifecycleEvent(
                    kind=common_pb2.RUN_FAULTED, run_id=run.run_id, reason=ORCHESTRATOR_RESTARTED,
                    component=common_pb2.COMPONENT_ORCHESTRATOR, time_us=now_us, detail=run.detail)])
            self.put(run)
            self.release(run.run_id)
            interrupted.append(run)
        return interrupted
