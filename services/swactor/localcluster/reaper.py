"""The reaper (`python -m swactor.localcluster.reaper`): a small process that removes a local pool whose owner died
without tearing it down.

LocalCluster starts it before it creates anything and, through the lifeline (lifeline.py: a pipe whose write end
only the owner holds), tells it what it creates (owned.py). However the owner ends (Ctrl-C, SIGTERM, SIGHUP, SIGKILL,
the OOM killer, its terminal closing) the kernel closes that write end; unless the owner said `done` first, the
reaper then SIGKILLs the services' process groups, kills what runs in the namespaces and deletes them, removes the
temporary dir, logs what it removed (one line on the owner's stderr) and exits, in well under a second. It runs in a
session of its own, so the terminal's SIGHUP and SIGINT, and a kill of the owner's process group, do not reach it;
its parent is gone by then, so whatever reaps orphans reaps it.

Not used as a second line: PR_SET_PDEATHSIG on the services. It fires when the *thread* that started a service ends
(a cluster started or restarted from a helper thread would lose its services at once), setting it in the child needs
a preexec_fn (unsafe once gRPC's threads run) or an exec shim, and it reaches only the direct child: not the worker's
compute process, the namespaces or the dir, all of which the reaper removes anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time

from swactor.common.events import configure_logging, get_logger
from swactor.localcluster import netns
from swactor.localcluster.owned import Cleanup, Owned, apply, cleanup

GONE_WITHIN_S = 1.5  # a SIGKILLed service exits in milliseconds; one stuck in the kernel is not waited for longer
POLL_S = 0.02
log = get_logger(component="localcluster-reaper")


def _say(event: str, **fields: object) -> None:
    # stderr may be a terminal that has just closed (EIO) or a pipe nobody reads any more: the clean-up matters more.
    with contextlib.suppress(OSError, ValueError):
        log.warning(event, **fields)


def _live_members(pgids: frozenset[int]) -> list[int]:
    """Processes of these groups that have not exited (a zombie has: its parent is gone and it waits to be reaped)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) in pgids and fields[0] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def _kill_groups(pgids: frozenset[int]) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def execute(plan: Cleanup) -> dict[str, object]:
    """Carry out the plan; what was removed and what was left, for the log."""
    t0 = time.monotonic()
    groups = frozenset(plan.groups)
    _kill_groups(groups)
    for ns in plan.namespaces:
        netns.remove(ns)
    # The dir goes last: a process still running could create files in it behind rmtree.
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := _live_members(groups)) and time.monotonic() < deadline:
        _kill_groups(groups)  # a child forked while the first SIGKILL was on its way
        time.sleep(POLL_S)
    for d in plan.dirs:
        shutil.rmtree(d, ignore_errors=True)
    return {"groups": list(plan.groups), "namespaces": list(plan.namespaces), "dirs": list(plan.dirs),
            "left": left, "dirs_left": [d for d in plan.dirs if os.path.lexists(d)],
            "elapsed_s": round(time.monotonic() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m swactor.localcluster.reaper", description=__doc__)
    p.add_argument("--owner", type=int, required=True, help="the owner's pid (for the log)")
    args = p.parse_args(argv)
    # Its own session already keeps the terminal's signals away; this keeps a stray one from cutting it short.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    configure_logging("swactor-localcluster-reaper", owner_pid=args.owner)
    owned = Owned()
    for raw in sys.stdin.buffer:  # until EOF: the owner closed the lifeline, or died
        try:
            owned = apply(owned, raw.decode(errors="surrogateescape"))
        except ValueError as e:
            _say("localcluster_reaper_record_refused", detail=str(e))
    try:
        existing = netns.namespaces() if owned.netns and not owned.done else []
    except (netns.NetnsError, OSError) as e:
        _say("localcluster_reaper_netns_list_failed", detail=str(e))
        existing = []
    plan = cleanup(owned, existing)
    if plan:
        _say("localcluster_reaped", **execute(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
