"""When the node is offered, withdrawn and retired (worker/availability.py): scripted input sequences,
each step with the actions it must give. No asyncio, no membership, no sleeps."""

from __future__ import annotations

import pytest

from swactor.v1 import common_pb2
from swactor.worker.availability import (
    ArenaGone,
    Driver,
    FailStopRun,
    NodeAvailability,
    Offer,
    Retire,
    StageSettled,
    Withdraw,
    Worker,
)
from swactor.worker.stage_fsm import StageState as S

CRASHED = Withdraw(common_pb2.RUN_FAULT_WORKER_CRASHED)
UNAVAILABLE = Withdraw(common_pb2.RUN_FAULT_NODE_UNAVAILABLE)
GONE = "arena-manager (pid 9) closed the hand-out connection"
UP = [(Worker(True), []), (Driver(True), [Offer()])]  # a booted node

SCRIPTS = {
    "offered once the worker is ready and the driver answers": [
        (Worker(True), []), (Driver(True), [Offer()])],
    "either order": [
        (Driver(True), []), (Worker(True), [Offer()])],
    "nothing twice: the same fact again changes nothing": [
        *UP, (Worker(True), []), (Driver(True), []), (Driver(False), [UNAVAILABLE]), (Driver(False), [])],
    "a crashed worker withdraws the node naming the worker, a new generation offers it again": [
        *UP, (Worker(False), [CRASHED]), (Worker(True), [Offer()])],
    "a lost driver withdraws it as unavailable": [
        *UP, (Driver(False), [UNAVAILABLE]), (Driver(True), [Offer()])],
    "withdrawn once however many facts go": [
        *UP, (Worker(False), [CRASHED]), (Driver(False), []), (Worker(True), []), (Driver(True), [Offer()])],
    "a driver gone at boot: never offered": [
        (Worker(True), []), (Driver(False), [])],
    "the stage settling means nothing while the arena is there": [
        *UP, (StageSettled(S.STOPPED), []), (StageSettled(None), [])],
    "arena gone mid-run: fail-stop the run, hold the membership state, retire and withdraw once it stopped": [
        *UP, (ArenaGone(GONE), [FailStopRun(GONE)]), (StageSettled(S.FAULTED), []),
        (StageSettled(S.STOPPING), []), (StageSettled(S.STOPPED), [Retire(GONE), UNAVAILABLE])],
    "arena gone while idle: retired at once": [
        *UP, (ArenaGone(GONE), [FailStopRun(GONE)]), (StageSettled(None), [Retire(GONE), UNAVAILABLE])],
    "an unprovisioned stage is no run": [
        *UP, (ArenaGone(GONE), [FailStopRun(GONE)]), (StageSettled(S.UNPROVISIONED), [Retire(GONE), UNAVAILABLE])],
    "the arena is gone once: a second report changes nothing": [
        *UP, (ArenaGone(GONE), [FailStopRun(GONE)]), (ArenaGone("again"), [])],
    "while held, a crash is not reported; at retirement the withdrawal names the worker": [
        *UP, (ArenaGone(GONE), [FailStopRun(GONE)]), (Worker(False), []), (Driver(False), []),
        (StageSettled(S.STOPPED), [Retire(GONE), CRASHED])],
    "retired: never offered again, retired once": [
        *UP, (ArenaGone(GONE), [FailStopRun(GONE)]), (StageSettled(None), [Retire(GONE), UNAVAILABLE]),
        (Worker(False), []), (Worker(True), []), (Driver(True), []), (StageSettled(None), [])],
    "arena gone before the node was ever offered: retired, nothing to withdraw": [
        (Worker(True), []), (ArenaGone(GONE), [FailStopRun(GONE)]), (Driver(True), []),
        (StageSettled(None), [Retire(GONE)])],
}


@pytest.mark.parametrize("script", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_script(script: list[tuple[object, list[object]]]) -> None:
    node = NodeAvailability(node_id=5)
    for i, (inp, want) in enumerate(script):
        assert node.handle(inp) == want, f"step {i}: {inp}"  # type: ignore[arg-type]
        if want and isinstance(want[-1], Offer | Withdraw):
            assert node.available is isinstance(want[-1], Offer)


@pytest.mark.parametrize("state", [S.PREPARING, S.READY, S.EXECUTING, S.FAULTED, S.STOPPING])
def test_a_run_still_on_the_stage_keeps_the_node_from_retiring(state: S) -> None:
    node = NodeAvailability(node_id=5)
    node.handle(ArenaGone(GONE))
    assert node.handle(StageSettled(state)) == [] and not node.retired
    assert node.handle(StageSettled(S.STOPPED)) == [Retire(GONE)] and node.retired


def test_facts_kept_for_the_shell() -> None:
    node = NodeAvailability(node_id=5)
    for inp, _ in UP:
        node.handle(inp)
    node.handle(ArenaGone(GONE))
    assert (node.worker_ready, node.driver_up, node.arena_gone, node.available, node.retired) == \
        (True, True, GONE, True, False)  # still offered: the stage's fault report goes first
