"""The supervisor's core on a scripted clock: order, readiness, restarts and their back-off, the
watchdog, Requires=, and the stop in reverse order. No processes: the actions are checked."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path

from swactor.host.core import SupervisorCore
from swactor.host.unit_fsm import BACKOFF_CAP_S, STABLE_S, Emit, Kill, Spawn, UnitState
from swactor.host.units import Unit

BASE = Unit(name="x.service", path=Path("/units/x.service"), description="x", exec_start=("/bin/x",), notify=True,
            restart_on_failure=True, restart_always=False, restart_s=1.0, start_timeout_s=90.0, stop_timeout_s=10.0,
            watchdog_s=20.0, kill_signal=signal.SIGTERM, kill_main_only=False, user=None, group=None, environment=(),
            nice=None, umask=0o22, no_new_privileges=False, limits=(), directories=(), after=frozenset(),
            requires=frozenset())


def unit(name: str, **kw: object) -> Unit:
    return replace(BASE, name=f"{name}.service", path=Path(f"/units/{name}.service"), **kw)  # type: ignore[arg-type]


def spawns(actions: list) -> list[str]:
    return [a.unit for a in actions if isinstance(a, Spawn)]


def kills(actions: list) -> list[tuple[str, int, bool]]:
    return [(a.unit, a.sig, a.group) for a in actions if isinstance(a, Kill)]


def events(actions: list) -> list[str]:
    return [a.event for a in actions if isinstance(a, Emit)]


def pool() -> SupervisorCore:
    """arena <- edge (Requires arena) <- worker (After both, Requires arena): the host's shape."""
    return SupervisorCore([
        unit("arena"),
        unit("edge", after=frozenset({"arena.service"}), requires=frozenset({"arena.service"})),
        unit("worker", after=frozenset({"arena.service", "edge.service"}), requires=frozenset({"arena.service"}),
             kill_main_only=True),
    ])


def up(core: SupervisorCore, now: float = 0.0) -> None:
    """Start everything: each unit spawned and READY in order."""
    pending = spawns(core.start_all(now))
    pid = 100
    while pending:
        name = pending.pop(0)
        pid += 1
        core.spawned(name, pid, now)
        pending += spawns(core.notified(name, {"READY": "1"}, now))


def test_a_unit_starts_only_once_the_units_it_is_after_are_ready() -> None:
    core = pool()
    assert spawns(core.start_all(0.0)) == ["arena.service"]
    assert spawns(core.spawned("arena.service", 10, 0.0)) == []  # Type=notify: not active until READY=1
    assert core.unit("edge.service").state is UnitState.WAITING
    assert core.waiting_for(core.unit("worker.service")) == ("arena.service", "edge.service")
    assert spawns(core.notified("arena.service", {"READY": "1", "STATUS": "ready"}, 0.1)) == ["edge.service"]
    assert core.unit("arena.service").status_text == "ready"
    core.spawned("edge.service", 11, 0.1)
    assert spawns(core.notified("edge.service", {"READY": "1"}, 0.2)) == ["worker.service"]


def test_a_killed_unit_restarts_with_back_off_that_doubles_to_a_cap_and_resets_once_stable() -> None:
    core = SupervisorCore([unit("m")])
    up(core)
    now, delays = 0.0, []
    for pid in range(200, 210):
        f = core.unit("m.service")
        assert f.state is UnitState.ACTIVE
        out = core.exited(f.pid, None, signal.SIGKILL, now)
        assert ("m.service", signal.SIGKILL, True) in kills(out)  # what the main process left goes too
        delays.append(f.deadline - now)
        now = f.deadline
        assert spawns(core.tick(now)) == ["m.service"]
        core.spawned("m.service", pid, now)
        core.notified("m.service", {"READY": "1"}, now)
    assert delays[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_CAP_S]
    assert max(delays) == BACKOFF_CAP_S
    assert core.unit("m.service").restarts == 10
    # Active long enough: the next failure starts the count again.
    f = core.unit("m.service")
    core.exited(f.pid, 1, None, now + STABLE_S)
    assert f.deadline - (now + STABLE_S) == 1.0
    assert f.last_exit == "exited with status 1"


def test_a_required_unit_restarting_restarts_the_units_that_require_it() -> None:
    core = pool()
    up(core)
    out = core.exited(core.unit("arena.service").pid, None, signal.SIGSEGV, 5.0)
    # edge (control-group) and worker (mixed: SIGTERM to the main process only) are stopped...
    assert ("edge.service", signal.SIGTERM, True) in kills(out)
    assert ("worker.service", signal.SIGTERM, False) in kills(out)
    for name, pid in (("edge.service", 102), ("worker.service", 103)):
        core.exited(pid, 0, None, 5.1)
        assert core.unit(name).state is UnitState.WAITING  # ...and start again, without back-off
    arena = core.unit("arena.service")
    assert spawns(core.tick(arena.deadline)) == ["arena.service"]
    core.spawned("arena.service", 300, 6.0)
    assert spawns(core.notified("arena.service", {"READY": "1"}, 6.1)) == ["edge.service"]


def test_a_unit_that_stops_pinging_gets_sigabrt_then_sigkill_then_a_restart() -> None:
    core = SupervisorCore([unit("w", watchdog_s=20.0, stop_timeout_s=10.0)])
    up(core)
    f = core.unit("w.service")
    core.notified("w.service", {"WATCHDOG": "1"}, 15.0)
    assert core.tick(30.0) == [] and f.deadline == 35.0  # the ping moved the deadline
    out = core.tick(35.0)
    assert "unit_watchdog_timeout" in events(out)
    assert kills(out) == [("w.service", signal.SIGABRT, True)]
    assert kills(core.tick(45.0)) == [("w.service", signal.SIGKILL, True)]  # it did not exit: TimeoutStopSec
    core.exited(f.pid, None, signal.SIGKILL, 45.5)
    assert f.state is UnitState.AUTO_RESTART


def test_a_unit_not_ready_within_its_start_timeout_is_stopped_and_restarted() -> None:
    core = SupervisorCore([unit("s", start_timeout_s=5.0)])
    core.start_all(0.0)
    core.spawned("s.service", 50, 0.0)
    assert kills(core.tick(5.0)) == [("s.service", signal.SIGTERM, True)]
    core.exited(50, 0, None, 5.2)  # even a clean exit after a timeout is a failure
    assert core.unit("s.service").state is UnitState.AUTO_RESTART


def test_exits_without_restart() -> None:
    core = SupervisorCore([unit("once", restart_on_failure=False), unit("clean")])
    up(core)
    assert "unit_failed" in events(core.exited(core.unit("once.service").pid, 3, None, 1.0))
    assert core.unit("once.service").state is UnitState.FAILED
    core.exited(core.unit("clean.service").pid, 0, None, 1.0)  # on-failure: a clean exit stays down
    assert core.unit("clean.service").state is UnitState.INACTIVE
    assert core.exited(9999, 0, None, 1.0) == []  # an orphan reaped as PID 1 is no unit's


def test_stop_all_goes_in_reverse_order_one_unit_at_a_time() -> None:
    core = pool()
    up(core)
    assert kills(core.stop_all(1.0)) == [("worker.service", signal.SIGTERM, False)]
    assert kills(core.stop_all(1.0)) == []  # asked twice: nothing more
    out = core.exited(core.unit("worker.service").pid, 0, None, 1.1)
    assert ("edge.service", signal.SIGTERM, True) in kills(out)
    assert core.unit("worker.service").state is UnitState.INACTIVE  # stopped: no restart
    core.exited(core.unit("edge.service").pid, 0, None, 1.2)
    assert not core.done
    core.exited(core.unit("arena.service").pid, 0, None, 1.3)
    assert core.done


def test_stop_while_a_unit_waits_for_its_restart() -> None:
    core = pool()
    up(core)
    core.exited(core.unit("arena.service").pid, None, signal.SIGKILL, 1.0)  # arena backs off, the others stop
    core.stop_all(1.1)  # edge and worker, stopping for the restart, become stops; arena's restart is dropped
    for name in ("worker.service", "edge.service"):
        core.exited(core.unit(name).pid, 0, None, 1.2)
        assert core.unit(name).state is UnitState.INACTIVE
    assert core.unit("arena.service").state is UnitState.INACTIVE
    assert core.done


def test_status_names_what_a_waiting_unit_waits_for() -> None:
    core = pool()
    core.start_all(0.0)
    rows = {s.name: s for s in core.status()}
    assert (rows["arena.service"].active_state, rows["arena.service"].sub_state) == ("activating", "start")
    assert rows["worker.service"].waiting_for == ("arena.service", "edge.service")
