"""One supervised unit's lifecycle, as an I/O-free core: what systemd's service state machine does for
the parts a unit file here uses (Type=notify, Restart=, the watchdog, KillMode=, the timeouts).

    Inactive --Start--> Waiting --Launch--> Starting --READY=1 (or spawned, Type=simple)--> Active
    Starting/Active --Stop | start timeout | watchdog | a required unit restarting--> Stopping
    Starting/Active/Stopping --exited--> Inactive | AutoRestart | Waiting | Failed
    AutoRestart --back-off elapsed--> Waiting;   Waiting/AutoRestart --Stop--> Inactive

`Waiting` is a start the supervisor holds until every unit the unit file orders it After= is active
(`SupervisorCore` sends Launch). A failure restarts after RestartSec, doubled for each failure in a row
up to `BACKOFF_CAP_S`; a unit that stayed active `STABLE_S` starts that count again. Inputs carry `now`
(monotonic seconds); `deadline` says when the unit next needs a Tick.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

from swactor.common.fsmtable import TransitionTable
from swactor.host.units import Unit

BACKOFF_CAP_S = 30.0
STABLE_S = 30.0
# Exits that Restart=on-failure takes as clean (systemd's list): the service was told to stop.
_CLEAN_SIGNALS = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE})


class UnitState(enum.Enum):
    INACTIVE = "Inactive"
    WAITING = "Waiting"
    STARTING = "Starting"
    ACTIVE = "Active"
    STOPPING = "Stopping"
    AUTO_RESTART = "AutoRestart"
    FAILED = "Failed"


class Change(enum.Enum):
    START = "Start"
    LAUNCH = "Launch"
    READY = "Ready"
    STOP = "Stop"
    EXITED_DOWN = "ExitedDown"  # exited; stays down (stopped, clean exit, or failed without Restart=)
    EXITED_AGAIN = "ExitedAgain"  # exited; starts again at once (a required unit restarted)
    EXITED_BACKOFF = "ExitedBackoff"  # exited; restarts after the back-off
    EXITED_FAILED = "ExitedFailed"
    BACKOFF_ELAPSED = "BackoffElapsed"


_S, _C = UnitState, Change
TRANSITIONS: TransitionTable[UnitState, Change] = TransitionTable("unit", {
    (_S.INACTIVE, _C.START): _S.WAITING,
    (_S.FAILED, _C.START): _S.WAITING,
    (_S.WAITING, _C.LAUNCH): _S.STARTING,
    (_S.WAITING, _C.STOP): _S.INACTIVE,
    (_S.STARTING, _C.READY): _S.ACTIVE,
    **{(s, _C.STOP): _S.STOPPING for s in (_S.STARTING, _S.ACTIVE)},
    **{(s, c): to for s in (_S.STARTING, _S.ACTIVE, _S.STOPPING)
       for c, to in ((_C.EXITED_DOWN, _S.INACTIVE), (_C.EXITED_AGAIN, _S.WAITING),
                     (_C.EXITED_BACKOFF, _S.AUTO_RESTART), (_C.EXITED_FAILED, _S.FAILED))},
    (_S.AUTO_RESTART, _C.BACKOFF_ELAPSED): _S.WAITING,
    (_S.AUTO_RESTART, _C.STOP): _S.INACTIVE,
})


# ---- actions (for the shell) ----


@dataclass(frozen=True)
class Spawn:
    unit: str


@dataclass(frozen=True)
class Kill:
    """Send `sig` to the unit's main process, or to its whole process group."""

    unit: str
    pid: int
    sig: int
    group: bool


@dataclass(frozen=True)
class Emit:
    event: str
    fields: dict[str, object]


Action = Spawn | Kill | Emit


class Why(enum.Enum):
    """Why a unit is stopping: what its exit then leads to."""

    ASKED = "stopped"  # Stop: stays down
    REQUIRED_RESTART = "required unit restarted"  # starts again once that unit is active
    START_TIMEOUT = "start timeout"  # failures: restart with back-off
    WATCHDOG = "watchdog timeout"


@dataclass
class UnitFsm:
    unit: Unit
    state: UnitState = UnitState.INACTIVE
    pid: int = 0
    since: float = 0.0  # monotonic time of the last state change
    restarts: int = 0  # starts after the first (systemd's NRestarts)
    failures_in_row: int = 0
    status_text: str = ""
    last_exit: str = ""  # "exited with status 1", "killed by SIGKILL"
    stopping_why: Why | None = None
    _timer: float | None = None
    _started_once: bool = False

    @property
    def deadline(self) -> float | None:
        return self._timer

    @property
    def name(self) -> str:
        return self.unit.name

    def _to(self, change: Change, now: float, timer: float | None = None) -> None:
        self.state = TRANSITIONS(self.state, change)
        self.since = now
        self._timer = timer

    def _emit(self, event: str, **fields: object) -> Emit:
        return Emit(event, {"unit": self.name, **fields})

    # ---- inputs ----

    def start(self, now: float) -> list[Action]:
        if self.state in (UnitState.INACTIVE, UnitState.FAILED):
            self._to(Change.START, now)
        return []

    def launch(self, now: float) -> list[Action]:
        """Every unit this one is ordered After= is active: spawn it."""
        self._to(Change.LAUNCH, now, now + self.unit.start_timeout_s)
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        self.pid = 0
        self.status_text = ""
        return [Spawn(self.name)]

    def spawned(self, pid: int, now: float) -> list[Action]:
        self.pid = pid
        out: list[Action] = [self._emit("unit_spawned", pid=pid, restarts=self.restarts)]
        if not self.unit.notify:
            out += self._ready(now)
        return out

    def spawn_failed(self, detail: str, now: float) -> list[Action]:
        self.last_exit = f"could not start: {detail}"
        return [self._emit("unit_spawn_failed", detail=detail), *self._after_exit(now, failed=True)]

    def notified(self, message: dict[str, str], now: float) -> list[Action]:
        """A datagram the main process sent to its NOTIFY_SOCKET, as key=value pairs."""
        out: list[Action] = []
        if "STATUS" in message:
            self.status_text = message["STATUS"]
        if message.get("READY") == "1" and self.state is UnitState.STARTING:
            out += self._ready(now)
        if message.get("WATCHDOG") == "1" and self.state is UnitState.ACTIVE and self.unit.watchdog_s:
            self._timer = now + self.unit.watchdog_s
        return out

    def _ready(self, now: float) -> list[Action]:
        self._to(Change.READY, now, now + self.unit.watchdog_s if self.unit.watchdog_s else None)
        return [self._emit("unit_active", pid=self.pid, restarts=self.restarts)]

    def stop(self, now: float, why: Why = Why.ASKED) -> list[Action]:
        if self.state in (UnitState.WAITING, UnitState.AUTO_RESTART):
            self._to(Change.STOP, now)
            return [self._emit("unit_stopped", reason=why.value)]
        if self.state not in (UnitState.STARTING, UnitState.ACTIVE):
            if self.state is UnitState.STOPPING and why is Why.ASKED:
                self.stopping_why = why  # a restart under way becomes a stop
            return []
        return self._begin_stop(now, why, self.unit.kill_signal)

    def _begin_stop(self, now: float, why: Why, sig: int) -> list[Action]:
        self.stopping_why = why
        self._to(Change.STOP, now, now + self.unit.stop_timeout_s)
        out: list[Action] = [self._emit("unit_stopping", pid=self.pid, reason=why.value, signal=signal.Signals(sig).name)]
        if self.pid:
            out.append(Kill(self.name, self.pid, sig, group=not self.unit.kill_main_only))
        return out

    def tick(self, now: float) -> list[Action]:
        if self._timer is None or now < self._timer:
            return []
        match self.state:
            case UnitState.STARTING:
                return [self._emit("unit_start_timeout", pid=self.pid, seconds=self.unit.start_timeout_s),
                        *self._begin_stop(now, Why.START_TIMEOUT, signal.SIGTERM)]
            case UnitState.ACTIVE:
                # systemd's WatchdogSignal: SIGABRT, so a Python service prints its stacks (faulthandler).
                return [self._emit("unit_watchdog_timeout", pid=self.pid, seconds=self.unit.watchdog_s),
                        *self._begin_stop(now, Why.WATCHDOG, signal.SIGABRT)]
            case UnitState.STOPPING:
                self._timer = None
                return [self._emit("unit_stop_timeout", pid=self.pid, seconds=self.unit.stop_timeout_s),
                        Kill(self.name, self.pid, signal.SIGKILL, group=True)]
            case UnitState.AUTO_RESTART:
                self._to(Change.BACKOFF_ELAPSED, now)
        return []

    def exited(self, code: int | None, sig: int | None, now: float) -> list[Action]:
        """The main process ended: `code` from exit(), or killed by `sig`."""
        pid, self.pid = self.pid, 0
        self.last_exit = f"exited with status {code}" if sig is None else f"killed by {signal.Signals(sig).name}"
        clean = (sig is None and code == 0) or (sig is not None and sig in _CLEAN_SIGNALS)
        why = self.stopping_why if self.state is UnitState.STOPPING else None
        # Whatever the main process left in its group (the worker's compute process) goes with it.
        out: list[Action] = [Kill(self.name, pid, signal.SIGKILL, group=True),
                             self._emit("unit_exited", pid=pid, code=code,
                                        signal=None if sig is None else signal.Signals(sig).name,
                                        reason=why.value if why else ("clean" if clean else "failed"))]
        if why is Why.ASKED:
            self._to(Change.EXITED_DOWN, now)
        elif why is Why.REQUIRED_RESTART:
            self._to(Change.EXITED_AGAIN, now)
        else:
            out += self._after_exit(now, failed=why is not None or not clean)
        self.stopping_why = None
        return out

    def _after_exit(self, now: float, failed: bool) -> list[Action]:
        if not failed and not self.unit.restart_always:
            self._to(Change.EXITED_DOWN, now)
            return []
        if failed and not self.unit.restart_on_failure:
            self._to(Change.EXITED_FAILED, now)
            return [self._emit("unit_failed", last_exit=self.last_exit)]
        if self.state is UnitState.ACTIVE and now - self.since >= STABLE_S:
            self.failures_in_row = 0
        self.failures_in_row += 1 if failed else 0
        delay = min(max(self.unit.restart_s, BACKOFF_CAP_S),
                    self.unit.restart_s * 2 ** max(0, self.failures_in_row - 1))
        self._to(Change.EXITED_BACKOFF, now, now + delay)
        return [self._emit("unit_restart_scheduled", delay_s=round(delay, 3), failures_in_row=self.failures_in_row,
                           last_exit=self.last_exit)]
