"""The reaper process with real processes, directories and (as root) network namespaces, but no pool: an owner
that dies without saying `done` has what it recorded removed within a second; a clean close touches nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.localcluster.lifeline import Lifeline
from swactor.localcluster.netns import Netns, namespaces
from tests.harness.procs import group_members, pid_alive, poll, processes_mentioning

GONE_WITHIN_S = 2.0

# An owner: records a process group (a shell and its child), a dir and, as root, a namespace with a process inside
# that is in no recorded group; reports them; then waits to be killed.
OWNER = r"""
import json, os, secrets, subprocess, sys, tempfile, time
from pathlib import Path
from swactor.localcluster.lifeline import Lifeline
from swactor.localcluster.netns import PREFIX
line = Lifeline()
root = Path(tempfile.mkdtemp(prefix="swl-"))
line.own_dir(root)
(root / "h0" / "log").mkdir(parents=True)
group = subprocess.Popen(["sh", "-c", f"sleep 300 & sleep 301; : {root}"], start_new_session=True)
line.own_group(group.pid)
ns = None
if sys.argv[1] == "netns":
    prefix = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
    line.own_netns(prefix)
    ns = prefix + "-h0"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.Popen(["ip", "netns", "exec", ns, "sh", "-c", f"sleep 302; : {root}"], start_new_session=True)
print(json.dumps({"root": str(root), "group": group.pid, "netns": ns, "reaper": line.reaper_pid}), flush=True)
time.sleep(600)
"""



def modes() -> list[object]:
    why = Netns.available()
    return ["loopback", pytest.param("netns", marks=[pytest.mark.netns,
                                                     pytest.mark.skipif(why is not None, reason=str(why))])]


@pytest.mark.parametrize("mode", modes())
@pytest.mark.timeout(30)
def test_an_owner_killed_with_sigkill_has_everything_it_recorded_removed(mode: str) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
        root = info["root"]
        group = info["group"]
        poll(lambda: len(group_members(group)) == 3, 2.0)  # sh and its two sleeps
        if info["netns"]:
            poll(lambda: len(processes_mentioning(root)) == 2, 2.0)  # the group's sh and the sh in the namespace
        owner.kill()
        owner.wait()

        def gone() -> bool:
            """no process, namespace, dir or reaper left"""
            return (not group_members(group) and not processes_mentioning(root) and not os.path.exists(root)
                    and not pid_alive(info["reaper"])
                    and (info["netns"] is None or info["netns"] not in namespaces()))

        took = poll(gone, GONE_WITHIN_S)
        print(f"{mode}: removed {took:.2f} s after the owner's SIGKILL")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


@pytest.fixture
def group_and_dir() -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    root = Path(tempfile.mkdtemp(prefix="swl-"))
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc, root
    proc.kill()
    proc.wait()
    subprocess.run(["rm", "-rf", str(root)], check=True)


@pytest.mark.timeout(30)
def test_a_clean_close_touches_nothing(group_and_dir: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, root = group_and_dir
    line = Lifeline()
    line.own_group(proc.pid)
    line.own_dir(root)
    line.close(clean=True)
    assert not pid_alive(line.reaper_pid)
    assert proc.poll() is None and root.is_dir()


@pytest.mark.timeout(30)
def test_a_close_without_done_leaves_the_rest_to_the_reaper(
        group_and_dir: tuple[subprocess.Popen[bytes], Path]) -> None:
    # A teardown that failed part way: the reaper finishes it before close() returns.
    proc, root = group_and_dir
    line = Lifeline()
    line.own_group(proc.pid)
    line.own_dir(root)
    line.close(clean=False)
    assert proc.wait(1.0) == -signal.SIGKILL
    assert not root.exists()


@pytest.mark.timeout(30)
def test_a_released_group_survives_the_owner(group_and_dir: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, _ = group_and_dir
    line = Lifeline()
    line.own_group(proc.pid)
    line.release_group(proc.pid)
    line.close(clean=False)
    assert proc.poll() is None
