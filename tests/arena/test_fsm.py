"""Every transition of the ArenaManager FSM (spec §19), allowed and refused."""

from __future__ import annotations

import pytest

from swactor.arena.fsm import ArenaInput, ArenaOp, ArenaState, accepts, transition
from swactor.common.fsmtable import InvalidTransition

ALLOWED = {
    (ArenaState.BOOTING, ArenaInput.BOOT_SUCCEEDED): ArenaState.READY,
    (ArenaState.BOOTING, ArenaInput.BOOT_FAILED): ArenaState.FAILED,
    (ArenaState.BOOTING, ArenaInput.SHUTDOWN): ArenaState.SHUTTING_DOWN,
    (ArenaState.READY, ArenaInput.SHUTDOWN): ArenaState.SHUTTING_DOWN,
    (ArenaState.SHUTTING_DOWN, ArenaInput.SHUTDOWN): ArenaState.SHUTTING_DOWN,
}


@pytest.mark.parametrize("state", list(ArenaState))
@pytest.mark.parametrize("event", list(ArenaInput))
def test_transition_table(state: ArenaState, event: ArenaInput) -> None:
    if (state, event) in ALLOWED:
        assert transition(state, event) is ALLOWED[(state, event)]
    else:
        with pytest.raises(InvalidTransition, match=event.value):
            transition(state, event)


def test_failed_is_terminal() -> None:
    for event in ArenaInput:
        with pytest.raises(InvalidTransition):
            transition(ArenaState.FAILED, event)


def test_ready_accepts_everything_and_shutting_down_no_leases() -> None:
    assert all(accepts(ArenaState.READY, op) for op in ArenaOp)
    assert not accepts(ArenaState.SHUTTING_DOWN, ArenaOp.LEASE)
    assert accepts(ArenaState.SHUTTING_DOWN, ArenaOp.RELEASE)
    assert accepts(ArenaState.SHUTTING_DOWN, ArenaOp.CANCEL)
    assert not any(accepts(ArenaState.BOOTING, op) for op in ArenaOp)
    assert not any(accepts(ArenaState.FAILED, op) for op in ArenaOp)
