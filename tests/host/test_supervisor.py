"""`swactor-host run` with real processes: services that speak sd_notify through the project's own
swactor.common.systemd, a NOTIFY_SOCKET the supervisor owns, real signals, the CLI's status and stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.procs import group_members, pid_alive, poll

FAKE = Path(__file__).with_name("fake_service.py")
SERVICES = Path(__file__).resolve().parents[2] / "services"


def unit_text(name: str, *args: str, after: str = "", requires: str = "", extra: str = "") -> str:
    return (f"[Unit]\nDescription=fake {name}\n" + (f"After={after}\n" if after else "")
            + (f"Requires={requires}\n" if requires else "")
            + f"[Service]\nType=notify\nExecStart={sys.executable} {FAKE} {name} {' '.join(args)}\n"
            + "Restart=on-failure\nRestartSec=0.2\nTimeoutStopSec=5\n" + extra)


@dataclass
class Host:
    dir: Path
    proc: subprocess.Popen[str]
    log: Path

    @property
    def control(self) -> Path:
        return self.dir / "own" / "control.sock"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "swactor.host.main", "--control", str(self.control), *args],
                              capture_output=True, text=True, timeout=60)

    def status(self) -> dict[str, dict]:
        done = self.cli("status", "--json")
        assert done.returncode in (0, 3), done.stderr
        return {u["name"]: u for u in json.loads(done.stdout)["units"]}

    def records(self) -> list[list[str]]:
        return [line.split() for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def active(self, name: str) -> bool:
        return self.status()[name]["active_state"] == "active"


def start_host(tmp_path: Path, units: dict[str, str]) -> Host:
    (tmp_path / "units").mkdir()
    log = tmp_path / "records"
    for name, text in units.items():
        env = f"Environment=FAKE_LOG={log} PYTHONPATH={SERVICES}\n"
        (tmp_path / "units" / f"{name}.service").write_text(text + env)
    proc = subprocess.Popen([sys.executable, "-m", "swactor.host.main", "--control", str(tmp_path / "own" / "control.sock"),
                             "run", "--units", str(tmp_path / "units")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Host(tmp_path, proc, log)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = start_host(tmp_path, {
        "a": unit_text("a", "--ready-after", "0.3"),
        "b": unit_text("b", "--child", after="a.service", requires="a.service", extra="KillMode=mixed\n"),
        "c": unit_text("c", after="b.service", extra="WatchdogSec=2s\n"),
    })
    yield h
    if h.proc.poll() is None:
        h.proc.kill()
        h.proc.wait(10)
    for pid in [int(r[2]) for r in h.records() if r[0] == "started"]:
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def everything_active(h: Host) -> bool:
    return h.control.exists() and all(u["active_state"] == "active" for u in h.status().values())


def test_units_start_in_order_restart_when_killed_and_stop_in_reverse(host: Host) -> None:
    poll(lambda: everything_active(host), 30)
    started = [r[1] for r in host.records() if r[0] == "started"]
    assert started == ["a", "b", "c"]  # b waited for a's READY=1 (0.3 s in), c for b's
    first = host.status()
    assert all(r[4] == f"watchdog_pid={r[2]}" for r in host.records())  # WATCHDOG_PID names the main process
    assert first["a.service"]["status_text"] == "a serving"

    # A killed unit comes back with a new pid; b requires a, so it restarts too; c (only After=) stays.
    b_child = [p for p in group_members(first["b.service"]["main_pid"]) if p != first["b.service"]["main_pid"]]
    os.kill(first["a.service"]["main_pid"], signal.SIGKILL)
    poll(lambda: everything_active(host) and host.status()["a.service"]["restarts"] == 1
         and host.status()["b.service"]["restarts"] == 1, 30)
    now = host.status()
    assert now["a.service"]["main_pid"] != first["a.service"]["main_pid"]
    assert now["a.service"]["last_exit"] == "killed by SIGKILL"
    assert now["c.service"]["main_pid"] == first["c.service"]["main_pid"] and now["c.service"]["restarts"] == 0
    assert b_child and not any(pid_alive(p) for p in b_child), "b's child outlived it"

    again = host.cli("run", "--units", str(host.dir / "units"))  # a second supervisor is refused, not started
    assert again.returncode == 1 and "a supervisor already runs here" in again.stderr, again.stderr
    text = host.cli("status", "b")
    assert text.returncode == 0, text.stderr
    assert "● b.service - fake b" in text.stdout and "Active: active (running) since" in text.stdout
    assert f"Main PID: {now['b.service']['main_pid']}" in text.stdout and "Restarts: 1" in text.stdout
    assert "plain line from b" in text.stdout  # the unit's last lines
    assert host.cli("status", "nosuch").returncode == 4

    host.proc.send_signal(signal.SIGTERM)
    _, err = host.proc.communicate(timeout=30)
    assert host.proc.returncode == 0, err[-2000:]
    stopped = [r[1] for r in host.records() if r[0] == "stopping"]
    assert stopped[-3:] == ["c", "b", "a"]
    assert not any(pid_alive(int(r[2])) for r in host.records() if r[0] == "started")
    assert not host.control.exists()
    # One stream: the supervisor's events and every unit's lines, each a JSON object naming its service.
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert {"service": "b", "event": "unit_output", "line": "plain line from b"} in lines
    assert any(e.get("event") == "unit_restart_scheduled" and e.get("unit") == "a.service" for e in lines)
    assert host.cli("status").returncode == 1  # no supervisor answers any more


def test_a_hung_unit_is_restarted_by_the_watchdog(tmp_path: Path) -> None:
    h = start_host(tmp_path, {"w": unit_text("w", "--hang-after", "0.5", extra="WatchdogSec=1s\n")})
    try:
        poll(lambda: h.control.exists() and h.status()["w.service"]["restarts"] >= 1, 30)
        assert h.status()["w.service"]["last_exit"] == "killed by SIGABRT"
        assert h.cli("stop").returncode == 0
        assert h.proc.wait(30) == 0
    finally:
        if h.proc.poll() is None:
            h.proc.kill()


def test_a_unit_that_cannot_start_is_named_and_retried(tmp_path: Path) -> None:
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "bad.service").write_text(
        "[Service]\nType=notify\nExecStart=/nonexistent/bin/x\nRestart=on-failure\nRestartSec=0.1\n")
    h = Host(tmp_path, subprocess.Popen(
        [sys.executable, "-m", "swactor.host.main", "--control", str(tmp_path / "own" / "control.sock"), "run",
         "--units", str(tmp_path / "units")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        tmp_path / "records")
    try:
        poll(lambda: h.control.exists() and h.status()["bad.service"]["restarts"] >= 2, 30)
        assert "could not start: ExecStart=/nonexistent/bin/x: not an executable file" in h.status()["bad.service"]["last_exit"]
        assert h.cli("status").returncode == 3
        h.proc.send_signal(signal.SIGTERM)
        assert h.proc.wait(30) == 0
    finally:
        if h.proc.poll() is None:
            h.proc.kill()


def test_a_directory_without_units_is_refused_by_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "swactor.host.main", "--control", str(tmp_path / "c.sock"), "run",
                           "--units", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and f"{tmp_path}: holds no *.service unit file" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_a_unit_runs_as_its_user_with_its_directories_and_limits(tmp_path: Path) -> None:
    """User=, RuntimeDirectory=, LimitNOFILE= and UMask= as systemd gives them (a shell unit: the venv's
    Python may sit where `nobody` cannot read; it says what it sees on stdout, the supervisor's log stream)."""
    from swactor.host.shell import HostSupervisor
    from swactor.host.spawn import HostPaths
    from swactor.host.units import read_units

    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "u.service").write_text(
        "[Service]\nExecStart=/bin/sh -c 'echo seen $(id -un) $(ulimit -n) $(umask) $RUNTIME_DIRECTORY; exec sleep 600'\n"
        "User=nobody\nRuntimeDirectory=fake\nRuntimeDirectoryMode=0750\nLimitNOFILE=4321\nUMask=0077\n"
        "NoNewPrivileges=yes\n")
    paths = HostPaths(run=tmp_path / "run", state=tmp_path / "lib", cache=tmp_path / "cache", own=tmp_path / "own")
    lines: list[str] = []

    async def scenario() -> None:
        sup = HostSupervisor(read_units(tmp_path / "units"), paths, write_line=lines.append)
        task = asyncio.create_task(sup.run())
        for _ in range(500):
            if any("seen" in line for line in lines):
                break
            await asyncio.sleep(0.02)
        sup.stop()
        assert await asyncio.wait_for(task, 30) == 0

    asyncio.run(scenario())
    (seen,) = [json.loads(line)["line"] for line in lines if "seen" in line]
    assert seen.split() == ["seen", "nobody", "4321", "0077", str(tmp_path / "run" / "fake")]
    runtime = tmp_path / "run" / "fake"
    assert runtime.stat().st_uid == int(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True).stdout)
    assert runtime.stat().st_mode & 0o777 == 0o750
