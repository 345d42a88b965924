"""A local pool dies with its owner. However `python -m swactor.localcluster` or `swactor demo` ends (Ctrl-C,
SIGTERM, SIGHUP, SIGKILL, or the terminal it runs in closing), within seconds no process of its pool runs, none of its
network namespaces exists, its temporary directory is gone and its reaper has exited: the orderly teardown for the
signals it can handle, its reaper (localcluster/reaper.py) for the rest. Nothing waits for a later run's clean-up."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from swactor.localcluster.netns import PREFIX, Netns, namespaces

from .conftest import needs_model, processes_mentioning

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), needs_model]

# Seconds from the owner's end until nothing is left: the orderly teardown and the reaper take 1-2 s alone; the bound
# leaves room for a neighbour's load (the suite's other worker), so these run beside it, not alone.
CLEAN_WITHIN_S = 15.0
LOCALCLUSTER = [sys.executable, "-m", "swactor.localcluster", "--hosts", "1", "--no-openai"]
DEMO = [sys.executable, "-m", "swactor.cli.main", "demo", "--hosts", "2", "--max-tokens", "200",
        "--prompt", "Tell me a long story about a lighthouse keeper and the sea."]
# What `python -m swactor.localcluster` exits with when it tears down in order (None: it cannot, SIGKILL).
LOCALCLUSTER_STATUS = {"sigint": 130, "sigterm": 128 + signal.SIGTERM, "sighup": 128 + signal.SIGHUP,
                       "sigkill": -signal.SIGKILL, "terminal": 128 + signal.SIGHUP}
SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sighup": signal.SIGHUP, "sigkill": signal.SIGKILL}


def _foreground() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as an interactive shell's foreground job has it, whatever ours is


@dataclass
class Owner:
    """The program under test and its output, read without blocking (a pipe each for stdout and stderr, or the
    master side of its terminal)."""

    proc: subprocess.Popen[bytes]
    fds: dict[str, int]
    text: dict[str, str] = field(default_factory=dict)

    @classmethod
    def on_pipes(cls, argv: list[str]) -> Owner:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_foreground)
        assert proc.stdout is not None and proc.stderr is not None
        return cls(proc, {"out": proc.stdout.fileno(), "err": proc.stderr.fileno()}, {"out": "", "err": ""})

    @classmethod
    def on_terminal(cls, argv: list[str]) -> Owner:
        # The program leads a session whose controlling terminal is the pty: closing the master hangs it up, and
        # the kernel sends SIGHUP, as when a terminal window closes. (`setsid` execs without forking: a Popen child
        # does not lead a process group.)
        master, slave = os.openpty()
        try:
            proc = subprocess.Popen(["setsid", "--ctty", *argv], stdin=slave, stdout=slave, stderr=slave)
        finally:
            os.close(slave)
        return cls(proc, {"tty": master}, {"tty": ""})

    def drain(self, timeout_s: float = 0.0) -> None:
        ready, _, _ = select.select(list(self.fds.values()), [], [], timeout_s)
        for name, fd in list(self.fds.items()):
            if fd in ready:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:  # EIO: the terminal's other side is gone
                    data = b""
                if not data:
                    del self.fds[name]
                self.text[name] += data.decode(errors="replace").replace("\r", "")

    def wait_for(self, stream: str, pattern: str, timeout_s: float = 90.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while not (m := re.search(pattern, self.text[stream])):
            if time.monotonic() > deadline or not self.fds:
                pytest.fail(f"no {pattern!r} from {self.proc.args} (status {self.proc.poll()}): {self.text}")
            self.drain(0.2)
        return m

    def rest(self, timeout_s: float = 5.0) -> dict[str, str]:
        """Everything it and its reaper wrote, up to the end of the pipes (both have exited by now)."""
        deadline = time.monotonic() + timeout_s
        while self.fds and time.monotonic() < deadline:
            self.drain(0.2)
        return self.text

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.proc.stdout, self.proc.stderr):
            if fd is not None:
                fd.close()
        if "tty" in self.fds:
            os.close(self.fds.pop("tty"))


def _stat(pid: int) -> list[str] | None:
    """The fields after the command name in /proc/PID/stat (state, ppid, ...), or None once it exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields


def pool_processes(root: Path) -> set[tuple[int, str]]:
    """The services (their command lines name the pool's dir) and all their descendants (the workers' compute
    processes and whatever those start, which may not), as (pid, start time) so that a reused pid is not taken
    for one of them."""
    procs = {int(p.name): f for p in Path("/proc").iterdir() if p.name.isdigit() and (f := _stat(int(p.name)))}
    found = set(processes_mentioning(str(root)))
    while more := {pid for pid, f in procs.items() if int(f[1]) in found} - found:
        found |= more
    return {(pid, procs[pid][19]) for pid in found if pid in procs}


def still_running(snapshot: set[tuple[int, str]]) -> list[int]:
    return [pid for pid, started in snapshot if (f := _stat(pid)) is not None and f[19] == started]


def reapers_of(pid: int) -> list[int]:
    return processes_mentioning(f"swactor.localcluster.reaper --owner {pid}")


def namespaces_of(pid: int) -> list[str]:
    # Netns names carry the creating process's pid: swl<pid>-<hex>-br / -h<i>
    return [ns for ns in namespaces() if ns.startswith(f"{PREFIX}{pid}-")] if Netns.available() is None else []


def end(owner: Owner, way: str) -> None:
    if way == "terminal":
        os.close(owner.fds.pop("tty"))
    else:
        owner.proc.send_signal(SIGNALS[way])


def assert_gone_within(owner: Owner, root: Path, way: str, *, keeps_dir: bool = False) -> float:
    """Seconds from the end of the owner until nothing of its pool is left (fails after CLEAN_WITHIN_S); a dir
    the caller gave or asked to keep stays."""
    pid = owner.proc.pid
    pool = pool_processes(root)
    t0 = time.monotonic()
    end(owner, way)
    while True:
        if owner.fds:
            owner.drain()  # keep its pipes from filling while it tears down
        left = {"processes": processes_mentioning(str(root)) + still_running(pool), "namespaces": namespaces_of(pid),
                "dir": [str(root)] if root.exists() and not keeps_dir else [], "reaper": reapers_of(pid)}
        took = time.monotonic() - t0
        if not any(left.values()):
            return took
        if took > CLEAN_WITHIN_S:
            pytest.fail(f"{way}: left {CLEAN_WITHIN_S} s after: {left}; output: {owner.text}")
        time.sleep(0.05)


def check_cleaner(owner: Owner, way: str) -> None:
    """The orderly teardown for a signal the program handles, the reaper after SIGKILL (its one line on stderr)."""
    if way != "terminal":  # there, stderr went with the terminal
        assert ("localcluster_reaped" in owner.rest()["err"]) == (way == "sigkill"), owner.text


def check_pool(owner: Owner, root: Path, services: int) -> None:
    """What the owner's end must remove is there: the services, the reaper and (as root) the namespaces."""
    assert len(processes_mentioning(str(root))) >= services
    assert len(reapers_of(owner.proc.pid)) == 1
    if Netns.available() is None:
        assert len(namespaces_of(owner.proc.pid)) >= 2  # the bridge's and host 0's


@pytest.mark.parametrize("way", ["sigint", "sigterm", "sighup", "sigkill", "terminal"])
def test_localcluster_leaves_nothing_however_it_ends(way: str) -> None:
    owner = Owner.on_terminal(LOCALCLUSTER) if way == "terminal" else Owner.on_pipes(LOCALCLUSTER)
    try:
        err = "tty" if way == "terminal" else "err"
        root = Path(owner.wait_for(err, r"dir (/\S+)")[1])
        owner.wait_for("tty" if way == "terminal" else "out", r"--address unix:")  # the pool is ready
        check_pool(owner, root, services=5)
        took = assert_gone_within(owner, root, way)
        assert owner.proc.wait(5) == LOCALCLUSTER_STATUS[way], owner.text
        check_cleaner(owner, way)
        print(f"localcluster {way}: nothing left {took:.2f} s after")
    finally:
        owner.close()


@pytest.mark.parametrize("way", ["sighup", "sigkill", "terminal"])
def test_demo_leaves_nothing_however_it_ends_mid_answer(way: str) -> None:
    owner = Owner.on_terminal(DEMO) if way == "terminal" else Owner.on_pipes(DEMO)
    try:
        err = "tty" if way == "terminal" else "err"
        root = Path(owner.wait_for(err, r"dir (/\S+)")[1])
        owner.wait_for(err, r"every stage is ready")
        # then the first token of the answer (on stdout; on the terminal, after that line)
        owner.wait_for("tty", r"every stage is ready[^\n]*\n\s*\S") if way == "terminal" else owner.wait_for(
            "out", r"\S")
        check_pool(owner, root, services=9)
        took = assert_gone_within(owner, root, way)
        owner.proc.wait(5)
        check_cleaner(owner, way)
        print(f"demo {way}: nothing left {took:.2f} s after (exit status {owner.proc.returncode})")
    finally:
        owner.close()


@pytest.mark.parametrize("keep", ["--keep", "--dir"])
def test_a_kept_or_given_dir_outlives_a_killed_localcluster(keep: str) -> None:
    # Its logs are what the caller wanted to keep: the reaper removes only a temporary dir the owner made for itself.
    given = Path(tempfile.mkdtemp(prefix="swk-"))  # short: the services' Unix socket paths live under it
    argv = [*LOCALCLUSTER, *(["--keep"] if keep == "--keep" else ["--dir", str(given)])]
    owner = Owner.on_pipes(argv)
    root = given
    try:
        root = Path(owner.wait_for("err", r"dir (/\S+)")[1])
        assert (root == given) == (keep == "--dir")
        owner.wait_for("out", r"--address unix:")
        check_pool(owner, root, services=5)
        assert_gone_within(owner, root, "sigkill", keeps_dir=True)
        assert (root / "h0" / "log" / "worker.log").is_file()
        check_cleaner(owner, "sigkill")
    finally:
        owner.close()
        shutil.rmtree(given, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
