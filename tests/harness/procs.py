"""Processes as the tests see them, from /proc: alive (a zombie is dead for our purpose), found by command line,
found by process group."""

from __future__ import annotations

from pathlib import Path


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
