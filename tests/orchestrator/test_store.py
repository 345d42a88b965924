"""Run store: records and events survive a reopen; unfinished runs are faulted on recovery."""

from __future__ import annotations

from pathlib import Path

from swactor.orchestrator.store import ORCHESTRATOR_RESTARTED, RunStore
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb


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
