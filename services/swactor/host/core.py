"""The host supervisor's core (I/O-free): the units of one host, their order and their dependencies.

What systemd's job engine does for swactor.target, reduced to what the unit files say:
- start: a unit is launched once every unit it is ordered After= is active (READY=1), so the arena
  is ready before the edge-driver and the worker map its memfd;
- Requires=: a unit runs only while the units it requires run; when one of those exits or is stopped
  for a failure, the units requiring it are restarted and launch again once it is active (a worker
  whose arena restarted would hold a memfd no one serves);
- stop: units stop one at a time in the reverse of their start order, each after every unit started
  after it is down; then `done` is true and the shell exits.
The shell (`shell.py`) performs the actions and feeds back what happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from swactor.host.unit_fsm import Action, Emit, UnitFsm, UnitState, Why
from swactor.host.units import Unit

_RUNNING = (UnitState.STARTING, UnitState.ACTIVE)
_DOWN = (UnitState.INACTIVE, UnitState.FAILED)


@dataclass(frozen=True)
class UnitStatus:
    """One unit as `swactor-host status` shows it (systemctl's ActiveState / SubState)."""

    name: str
    description: str
    path: str
    active_state: str  # active | activating | deactivating | inactive | failed
    sub_state: str  # running | start | auto-restart | waiting | stop-sigterm | dead | failed
    main_pid: int
    restarts: int
    status_text: str
    since: float  # wall-clock seconds
    last_exit: str
    waiting_for: tuple[str, ...]
    not_applied: tuple[str, ...]


_SHOWN = {
    UnitState.INACTIVE: ("inactive", "dead"), UnitState.WAITING: ("activating", "waiting"),
    UnitState.STARTING: ("activating", "start"), UnitState.ACTIVE: ("active", "running"),
    UnitState.STOPPING: ("deactivating", "stop-sigterm"), UnitState.AUTO_RESTART: ("activating", "auto-restart"),
    UnitState.FAILED: ("failed", "failed"),
}


class SupervisorCore:
    def __init__(self, units: list[Unit]) -> None:
        self.units = [UnitFsm(u) for u in units]  # start order
        self._by_name = {f.name: f for f in self.units}
        self.stopping = False
        # monotonic -> wall clock, for the `since` of a status
        self._wall_offset = time.time() - time.monotonic()

    def unit(self, name: str) -> UnitFsm:
        return self._by_name[name]

    def of_pid(self, pid: int) -> UnitFsm | None:
        return next((f for f in self.units if f.pid == pid and pid), None)

    @property
    def deadline(self) -> float | None:
        times = [f.deadline for f in self.units if f.deadline is not None]
        return min(times) if times else None

    @property
    def done(self) -> bool:
        return self.stopping and all(f.state in _DOWN for f in self.units)

    # ---- inputs ----

    def start_all(self, now: float) -> list[Action]:
        out: list[Action] = [Emit("host_starting", {"units": [f.name for f in self.units]})]
        for f in self.units:
            out += f.start(now)
        return out + self._advance(now)

    def stop_all(self, now: float) -> list[Action]:
        if self.stopping:
            return []
        self.stopping = True
        return [Emit("host_stopping", {}), *self._advance(now)]

    def spawned(self, name: str, pid: int, now: float) -> list[Action]:
        return self.unit(name).spawned(pid, now) + self._advance(now)

    def spawn_failed(self, name: str, detail: str, now: float) -> list[Action]:
        return self.unit(name).spawn_failed(detail, now) + self._advance(now)

    def notified(self, name: str, message: dict[str, str], now: float) -> list[Action]:
        return self.unit(name).notified(message, now) + self._advance(now)

    def exited(self, pid: int, code: int | None, sig: int | None, now: float) -> list[Action]:
        """A child ended; a pid of no unit (an orphan the supervisor reaped as PID 1) changes nothing."""
        f = self.of_pid(pid)
        if f is None:
            return []
        return f.exited(code, sig, now) + self._advance(now)

    def tick(self, now: float) -> list[Action]:
        out: list[Action] = []
        for f in self.units:
            out += f.tick(now)
        return out + self._advance(now)

    # ---- what follows from the states ----

    def _advance(self, now: float) -> list[Action]:
        out: list[Action] = []
        if self.stopping:
            return self._stop_next(now)
        for f in self.units:
            lost = [r for r in f.unit.requires if r in self._by_name and self._by_name[r].state not in _RUNNING]
            if f.state in _RUNNING and lost:
                out += f.stop(now, Why.REQUIRED_RESTART)
            elif f.state is UnitState.WAITING and not self.waiting_for(f):
                out += f.launch(now)
        return out

    def waiting_for(self, f: UnitFsm) -> tuple[str, ...]:
        """The units `f` is ordered after that are not active yet."""
        return tuple(sorted(a for a in f.unit.after
                            if a in self._by_name and self._by_name[a].state is not UnitState.ACTIVE))

    def _stop_next(self, now: float) -> list[Action]:
        out: list[Action] = []
        for f in reversed(self.units):
            if f.state in (UnitState.WAITING, UnitState.AUTO_RESTART):
                out += f.stop(now)
            if f.state in _DOWN:
                continue
            out += f.stop(now)  # running: begin; stopping already: made a stop if it was a restart
            break
        return out

    # ---- status ----

    def status(self) -> list[UnitStatus]:
        out = []
        for f in self.units:
            active, sub = _SHOWN[f.state]
            out.append(UnitStatus(
                name=f.name, description=f.unit.description, path=str(f.unit.path), active_state=active,
                sub_state=sub, main_pid=f.pid, restarts=f.restarts, status_text=f.status_text,
                since=f.since + self._wall_offset if f.since else 0.0, last_exit=f.last_exit,
                waiting_for=self.waiting_for(f) if f.state is UnitState.WAITING else (),
                not_applied=f.unit.not_applied))
        return out
