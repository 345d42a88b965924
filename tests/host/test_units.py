"""The unit files as the supervisor reads them: the project's own units, and files it must refuse."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import pytest

from swactor.host.units import UnitError, read_unit, read_units, timespan_s

UNITS = Path(__file__).resolve().parents[2] / "systemd"


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_the_projects_units_read_in_start_order() -> None:
    units = read_units(UNITS)
    order = [u.short_name for u in units]
    assert order.index("swactor-arena") < order.index("swactor-edge") < order.index("swactor-worker")
    assert order.index("swactor-membership") < order.index("swactor-worker") < order.index("swactor-orchestrator")
    assert order.index("swactor-orchestrator") < order.index("swactor-gateway")
    worker = next(u for u in units if u.short_name == "swactor-worker")
    assert worker.exec_start == ("/opt/swactor/venv/bin/swactor-worker", "--config", "/etc/swactor/swactor.toml")
    assert worker.notify and worker.restart_on_failure and not worker.restart_always
    assert (worker.restart_s, worker.watchdog_s, worker.stop_timeout_s) == (2.0, 20.0, 20.0)
    assert worker.kill_main_only and worker.kill_signal == signal.SIGTERM
    assert (worker.user, worker.group, worker.umask, worker.no_new_privileges) == ("swactor", "swactor", 0o077, True)
    assert dict(worker.limits) == {resource.RLIMIT_NOFILE: 65536, resource.RLIMIT_MEMLOCK: resource.RLIM_INFINITY,
                                   resource.RLIMIT_CORE: 0}
    assert {(d.kind, d.name, d.mode) for d in worker.directories} == {
        ("Runtime", "swactor", 0o750), ("State", "swactor", 0o750), ("Cache", "swactor", 0o750)}
    assert ("XDG_CACHE_HOME", "/var/cache/swactor") in worker.environment
    assert worker.requires == {"swactor-arena.service"}
    # What systemd's sandbox gives and the supervisor cannot is listed, not silently dropped.
    assert {"ProtectSystem", "SystemCallFilter", "PrivateTmp"} <= set(worker.not_applied)
    membership = next(u for u in units if u.short_name == "swactor-membership")
    assert membership.nice == -5


def test_an_unknown_key_is_refused_by_file_line_and_name(tmp_path: Path) -> None:
    path = write(tmp_path, "x.service", "[Service]\nExecStart=/bin/true\nExecReload=/bin/kill -HUP $MAINPID\n")
    with pytest.raises(UnitError, match=r"x.service:3: ExecReload: the supervisor does not know this key"):
        read_unit(path)


@pytest.mark.parametrize(("line", "message"), [
    ("RestartSec=soon", "'soon' is not a time span"),
    ("Type=forking", "'forking' is not simple, exec or notify"),
    ("Restart=on-abnormal", "'on-abnormal' is not no, on-failure or always"),
    ("KillSignal=SIGNOPE", "'SIGNOPE' is not a signal name"),
    ("Environment=NOEQUALS", "'NOEQUALS' is not NAME=VALUE"),
    ("LimitNOFILE=1024:4096", "neither a number nor infinity"),
    ("Nice=-30", "-30 is not in -20..19"),
])
def test_values_it_cannot_read_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, "x.service", f"[Service]\nExecStart=/bin/true\n{line}\n")
    with pytest.raises(UnitError, match=message):
        read_unit(path)


def test_a_relative_command_and_an_after_cycle_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnitError, match="ExecStart: needs an absolute command"):
        read_unit(write(tmp_path, "x.service", "[Service]\nExecStart=true\n"))
    (tmp_path / "x.service").unlink()
    write(tmp_path, "a.service", "[Unit]\nAfter=b.service\n[Service]\nExecStart=/bin/true\n")
    write(tmp_path, "b.service", "[Unit]\nAfter=a.service\n[Service]\nExecStart=/bin/true\n")
    with pytest.raises(UnitError, match=r"cycle: a\.service, b\.service"):
        read_units(tmp_path)
    with pytest.raises(UnitError, match="no such directory"):
        read_units(tmp_path / "missing")


def test_time_spans_and_environment_words() -> None:
    assert timespan_s("20s", "x") == 20.0
    assert timespan_s("1min 30s", "x") == 90.0
    assert timespan_s("500ms", "x") == 0.5
    assert timespan_s("2", "x") == 2.0
    assert timespan_s("infinity", "x") == float("inf")


def test_environment_quoting_and_an_empty_assignment_resets(tmp_path: Path) -> None:
    unit = read_unit(write(tmp_path, "x.service", '[Service]\nExecStart=/bin/true\nEnvironment=A=1 "B=two words"\n'
                                                  "After=y.service\nAfter=\nAfter=z.service\n"))
    assert unit.environment == (("A", "1"), ("B", "two words"))
    assert unit.after == {"z.service"}
