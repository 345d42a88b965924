"""Run store: records and events survive a reopen; unfinished runs are faulted on recovery; pages,
retention deletes with space given back, and write errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from swactor.orchestrator.runs.store import ORCHESTRATOR_RESTARTED, RunStore, StoreWriteError
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

from .helpers import fill, small_tmpfs


def test_records_and_events_survive_reopen_and_recovery_faults_unfinished(tmp_path: Path) -> None:
    store = RunStore.in_state_dir(tmp_path)
    done = opb.Run(run_id=1, model="m", state=opb.RUN_STATE_DONE, outcome=opb.RUN_OUTCOME_COMPLETED, reason="eos",
                   created_us=10, token_ids=[5, 6], text="hi")
    running = opb.Run(run_id=2**62 + 3, model="m", state=opb.RUN_STATE_RUNNING, created_us=20)
    store.put(done)
    store.put(running)
    store.append(1, [pb.LifecycleEvent(kind=pb.RUN_PLANNED, run_id=1, time_us=11),
                     pb.LifecycleEvent(kind=pb.STAGE_READY, run_id=1, node_id=7, stage_index=0, time_us=12)])
    store.append(1, [pb.LifecycleEvent(kind=pb.RUN_COMPLETED, run_id=1, time_us=13)])
    store.close()

    store = RunStore.in_state_dir(tmp_path)
    assert store.get(1) == done
    assert [e.kind for e in store.events(1)] == [pb.RUN_PLANNED, pb.STAGE_READY, pb.RUN_COMPLETED]
    assert [e.node_id for e in store.events(1, pb.STAGE_READY)] == [7]
    interrupted = store.recover(now_us=99)
    assert [r.run_id for r in interrupted] == [2**62 + 3]
    got = store.get(2**62 + 3)
    assert got.state == opb.RUN_STATE_DONE and got.outcome == opb.RUN_OUTCOME_FAULTED
    assert got.reason == ORCHESTRATOR_RESTARTED and "RUN_STATE_RUNNING" in got.detail
    ev = store.events(2**62 + 3)
    assert [(e.kind, e.reason) for e in ev] == [(pb.RUN_FAULTED, ORCHESTRATOR_RESTARTED)]
    assert store.recover(now_us=100) == []  # idempotent
    assert [r.run_id for r in store.list(10)] == [2**62 + 3, 1]  # newest first
    assert store.get(12345) is None


def test_outcome_recorded_before_restart_is_kept(tmp_path: Path) -> None:
    store = RunStore.in_state_dir(tmp_path)
    store.put(opb.Run(run_id=4, state=opb.RUN_STATE_TEARING_DOWN, outcome=opb.RUN_OUTCOME_COMPLETED, reason="eos"))
    (run,) = store.recover(now_us=5)
    assert (run.outcome, run.reason, run.state) == (opb.RUN_OUTCOME_COMPLETED, "eos", opb.RUN_STATE_DONE)
    assert store.events(4) == []


def test_writes_are_held_briefly_but_state_changes_and_reads_see_everything(tmp_path: Path) -> None:
    now = [0.0]
    store = RunStore(tmp_path / "s.sqlite3", clock=lambda: now[0])
    other = RunStore(tmp_path / "s.sqlite3")  # a second connection sees only what was written
    run = opb.Run(run_id=9, state=opb.RUN_STATE_RUNNING, created_us=1)
    store.put(run)  # new state: written at once
    assert other.get(9) == run
    run.token_ids.append(42)
    store.put(run)  # same state: held
    store.append(9, [pb.LifecycleEvent(kind=pb.TOKEN_RECEIVED, run_id=9, sequence=0, time_us=2)])
    assert other.get(9).token_ids == [] and other.events(9) == []
    assert [e.kind for e in store.events(9)] == [pb.TOKEN_RECEIVED]  # a read through the store flushes
    assert other.get(9).token_ids == [42]
    store.append(9, [pb.LifecycleEvent(kind=pb.TOKEN_RECEIVED, run_id=9, sequence=1, time_us=3)])
    assert len(other.events(9)) == 1
    now[0] = 0.5  # the next write after FLUSH_AFTER_S writes everything held
    store.append(9, [pb.LifecycleEvent(kind=pb.TOKEN_RECEIVED, run_id=9, sequence=2, time_us=4)])
    assert [e.sequence for e in other.events(9)] == [0, 1, 2]
    store.append(9, [pb.LifecycleEvent(kind=pb.RUN_COMPLETED, run_id=9, time_us=5)])
    run.state, run.outcome = opb.RUN_STATE_DONE, opb.RUN_OUTCOME_COMPLETED
    store.put(run)  # the final state is durable at once, with the events held before it
    assert other.get(9).state == opb.RUN_STATE_DONE and other.events(9)[-1].kind == pb.RUN_COMPLETED


def ev(run_id: int, seq: int, detail: str = "") -> pb.LifecycleEvent:
    return pb.LifecycleEvent(kind=pb.TOKEN_RECEIVED, run_id=run_id, sequence=seq, time_us=seq, detail=detail)


def test_events_come_in_pages_bounded_by_count_and_bytes(tmp_path: Path) -> None:
    store = RunStore.in_state_dir(tmp_path)
    store.append(3, [ev(3, k, "x" * 100) for k in range(25)])
    store.append(3, [pb.LifecycleEvent(kind=pb.RUN_COMPLETED, run_id=3)])
    page, after = store.events_page(3, start_seq=0, limit=10)
    assert [e.sequence for e in page] == list(range(10)) and after == 10
    page, after = store.events_page(3, start_seq=20, limit=10)
    assert [e.sequence for e in page] == [20, 21, 22, 23, 24, 0] and after is None
    page, after = store.events_page(3, start_seq=0, limit=100, max_bytes=350)  # ~110 bytes each
    assert len(page) == 3 and after == 3
    page, after = store.events_page(3, start_seq=0, limit=100, max_bytes=1)  # a page holds at least one
    assert len(page) == 1 and after == 1
    page, after = store.events_page(3, kind=pb.RUN_COMPLETED, start_seq=0, limit=1)
    assert [e.kind for e in page] == [pb.RUN_COMPLETED] and after is None
    assert [e.kind for e in store.iter_events(3)].count(pb.TOKEN_RECEIVED) == 25


def test_deleting_runs_gives_their_space_back(tmp_path: Path) -> None:
    store = RunStore.in_state_dir(tmp_path)
    for run_id in range(1, 41):
        store.put(opb.Run(run_id=run_id, state=opb.RUN_STATE_DONE, outcome=opb.RUN_OUTCOME_COMPLETED,
                          created_us=run_id))
        store.append(run_id, [ev(run_id, k, "y" * 400) for k in range(100)])
    store.put(opb.Run(run_id=99, state=opb.RUN_STATE_QUEUED, created_us=1))  # not finished: never a candidate
    store.flush()
    full = store.size_bytes()
    finished = store.finished_runs()
    assert [r for r, _ in finished] == list(range(40, 0, -1)) and finished[0] == (40, 40)
    store.delete_runs([r for r, _ in finished[4:]])
    after = store.size_bytes()
    assert [r for r, _ in store.finished_runs()] == [40, 39, 38, 37]
    assert store.get(1) is None and store.events(1) == [] and len(store.events(40)) == 100
    assert store.get(99).state == opb.RUN_STATE_QUEUED
    assert full > 1_500_000 and after < full * 0.2, (full, after)
    store.close()
    reopened = RunStore.in_state_dir(tmp_path)
    assert [r for r, _ in reopened.finished_runs()] == [40, 39, 38, 37]


def test_a_store_made_without_auto_vacuum_is_converted(tmp_path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / "orchestrator.sqlite3")
    db.execute("CREATE TABLE runs (run_id INTEGER PRIMARY KEY, state INTEGER NOT NULL, outcome INTEGER NOT NULL, "
               "created_us INTEGER NOT NULL, record BLOB NOT NULL)")
    run = opb.Run(run_id=8, state=opb.RUN_STATE_DONE, created_us=5)
    db.execute("INSERT INTO runs VALUES (8, ?, 0, 5, ?)", (opb.RUN_STATE_DONE, run.SerializeToString()))
    db.commit()
    assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    db.close()
    store = RunStore.in_state_dir(tmp_path)
    assert store.get(8) == run
    store.close()
    db = sqlite3.connect(tmp_path / "orchestrator.sqlite3")
    assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental


def test_a_write_error_is_raised_reads_see_what_is_held_and_a_later_flush_writes_it(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "1m") as fs:
        store = RunStore.in_state_dir(fs)
        run = opb.Run(run_id=5, state=opb.RUN_STATE_RUNNING, created_us=1)
        store.put(run)
        filler = fill(fs)
        store.append(5, [ev(5, k, "z" * 200) for k in range(300)])
        run.state, run.outcome = opb.RUN_STATE_DONE, opb.RUN_OUTCOME_COMPLETED
        with pytest.raises(StoreWriteError, match=r"database or disk is full|disk I/O error"):
            store.put(run)  # a state change is written at once: it fails
        assert store.get(5) == run  # the held record, not the stale one on disk
        assert store.list(10) == [run]
        refused = opb.Run(run_id=6, state=opb.RUN_STATE_WAITING_POOL, created_us=2)
        with pytest.raises(StoreWriteError):
            store.put(refused)
        store.discard(6)  # a refused submission leaves nothing behind
        filler.unlink()
        store.flush()
        on_disk = RunStore(store.path)
        assert on_disk.get(5) == run and len(on_disk.events(5)) == 300 and on_disk.get(6) is None
        assert store.dropped_events == 0
        store.close()
        on_disk.close()
