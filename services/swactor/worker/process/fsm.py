"""Worker process FSM (spec §31): one enum, one transition table, one transition function.

    Booting --Initialized--> Running --Shutdown--> Draining --Drained--> Stopped
    Booting --Shutdown-----> Stopped
    Booting | Running | Draining --Fatal / ControlLost--> Fatal

Which commands each state serves, and how the others are refused, is `admission()`: before
InitializeWorker every command but InitializeWorker / ShutdownWorker is malformed (fatal); while
draining, commands that would start new work are refused with an event and everything else is
served so the drain can finish.
"""

from __future__ import annotations

import enum

from swactor.common.fsmtable import TransitionTable
from swactor.worker.process import wire


class WorkerState(enum.Enum):
    BOOTING = "Booting"
    RUNNING = "Running"
    DRAINING = "Draining"
    STOPPED = "Stopped"
    FATAL = "Fatal"


class WorkerInput(enum.Enum):
    INITIALIZED = "initialized"  # arena mapped, ring helper and backend up: WorkerReady
    SHUTDOWN = "shutdown"  # ShutdownWorker
    DRAINED = "drained"  # no step, no load, rings quiesced: WorkerStopped
    FATAL = "fatal"  # a WorkerFatal condition
    CONTROL_LOST = "control_lost"  # stdin closed: nobody can command or read us any more


TERMINAL = frozenset({WorkerState.STOPPED, WorkerState.FATAL})

_TRANSITIONS: dict[tuple[WorkerState, WorkerInput], WorkerState] = {
    (WorkerState.BOOTING, WorkerInput.INITIALIZED): WorkerState.RUNNING,
    (WorkerState.BOOTING, WorkerInput.SHUTDOWN): WorkerState.STOPPED,
    (WorkerState.RUNNING, WorkerInput.SHUTDOWN): WorkerState.DRAINING,
    (WorkerState.DRAINING, WorkerInput.SHUTDOWN): WorkerState.DRAINING,  # a second one may change the mode
    (WorkerState.DRAINING, WorkerInput.DRAINED): WorkerState.STOPPED,
    **{(s, i): WorkerState.FATAL
       for s in (WorkerState.BOOTING, WorkerState.RUNNING, WorkerState.DRAINING)
       for i in (WorkerInput.FATAL, WorkerInput.CONTROL_LOST)},
}


transition: TransitionTable[WorkerState, WorkerInput] = TransitionTable("worker", _TRANSITIONS)


class Admission(enum.Enum):
    SERVE = "serve"
    MALFORMED = "malformed"  # WorkerFatal MalformedControlMessage
    REFUSE = "refuse"  # answered with the command's WorkerShuttingDown event, no state change


_BOOT_COMMANDS = (wire.InitializeWorker, wire.ShutdownWorker)
_NEW_WORK = (wire.ConfigureRole, wire.InstallRing, wire.ExecuteStep, wire.GrantSteps)


def admission(state: WorkerState, command: object) -> Admission:
    """What `state` does with `command` (TERMINAL states read no more commands)."""
    if isinstance(command, wire.InitializeWorker) and state is not WorkerState.BOOTING:
        return Admission.MALFORMED  # sent twice
    if state is WorkerState.BOOTING:
        return Admission.SERVE if isinstance(command, _BOOT_COMMANDS) else Admission.MALFORMED
    if state is WorkerState.DRAINING and isinstance(command, _NEW_WORK):
        return Admission.REFUSE
    return Admission.SERVE
