"""Processes as the tests see them, from /proc: alive (a zombie is dead for our purpose), found by command line,
found by process group; and `poll`, waiting for what they do."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions `text` (a cluster dir is in every service's argv)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd and pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry.name)
            if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def poll(condition: Callable[[], bool], within_s: float) -> float:
    """Seconds until `condition` held; fails the test after `within_s`."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > within_s:
            pytest.fail(f"not within {within_s} s: {condition.__doc__ or condition}")
        time.sleep(0.02)
    return time.monotonic() - t0
