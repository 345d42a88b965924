"""ArenaManager lifecycle FSM (spec §19): one enum, one transition table, one transition function.

    Booting --BootSucceeded--> Ready --Shutdown--> ShuttingDown
    Booting --BootFailed-----> Failed

Lease, cancel and release are handled *inside* Ready (and release/cancel also in ShuttingDown);
they do not change this state, so they live in the lease table, which asks `accepts()` here.
"""

from __future__ import annotations

import enum

from swactor.common.fsmtable import TransitionTable


class ArenaState(enum.Enum):
    BOOTING = "booting"
    READY = "ready"
    FAILED = "failed"
    SHUTTING_DOWN = "shutting_down"


class ArenaInput(enum.Enum):
    BOOT_SUCCEEDED = "boot_succeeded"  # memfd, truncate and mmap all succeeded
    BOOT_FAILED = "boot_failed"
    SHUTDOWN = "shutdown"


class ArenaOp(enum.Enum):
    """Requests the table handles without a state change; `accepts` says in which states."""

    LEASE = "lease"
    CANCEL = "cancel"
    RELEASE = "release"
    ATTACH = "attach"
    DETACH = "detach"


TERMINAL = frozenset({ArenaState.FAILED})

_TRANSITIONS: dict[tuple[ArenaState, ArenaInput], ArenaState] = {
    (ArenaState.BOOTING, ArenaInput.BOOT_SUCCEEDED): ArenaState.READY,
    (ArenaState.BOOTING, ArenaInput.BOOT_FAILED): ArenaState.FAILED,
    (ArenaState.BOOTING, ArenaInput.SHUTDOWN): ArenaState.SHUTTING_DOWN,
    (ArenaState.READY, ArenaInput.SHUTDOWN): ArenaState.SHUTTING_DOWN,
    (ArenaState.SHUTTING_DOWN, ArenaInput.SHUTDOWN): ArenaState.SHUTTING_DOWN,
}

# ShuttingDown rejects new leases but still lets holders cancel, detach and release, so that a
# graceful stop can drain the table.
_ACCEPTS: dict[ArenaState, frozenset[ArenaOp]] = {
    ArenaState.BOOTING: frozenset(),
    ArenaState.READY: frozenset(ArenaOp),
    ArenaState.FAILED: frozenset(),
    ArenaState.SHUTTING_DOWN: frozenset({ArenaOp.CANCEL, ArenaOp.RELEASE, ArenaOp.ATTACH, ArenaOp.DETACH}),
}


transition: TransitionTable[ArenaState, ArenaInput] = TransitionTable("arena", _TRANSITIONS)


def accepts(state: ArenaState, op: ArenaOp) -> bool:
    return op in _ACCEPTS[state]
