"""Durable state files: written whole or not at all, and still there after a power cut.

A host's identity (node id, edge key, API token) is written once and read on every start; a
crash mid-write must leave either the old file or the new one, never a truncated one that the
next start would refuse or, worse, read as a different identity.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to a temporary file beside `path` (created with `mode`, so secrets are never
    readable by others, not even for a moment), fsync it, rename it over `path`, fsync the dir."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a crash of an earlier process that had this pid (pids repeat after a reboot)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it; never widens past `mode`
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
