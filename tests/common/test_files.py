"""Durable state files: whole or absent, created with their final mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swactor.common.files import write_atomic


def test_write_atomic_replaces_whole_files_with_their_mode(tmp_path: Path) -> None:
    path = tmp_path / "token"
    write_atomic(path, b"first", 0o600)
    assert path.read_bytes() == b"first" and stat.S_IMODE(path.stat().st_mode) == 0o600
    # A crash of an earlier process with this pid left its temporary file: it is not in the way.
    stale = tmp_path / f".token.{os.getpid()}.tmp"
    stale.write_bytes(b"half-writ")
    write_atomic(path, b"second", 0o644)
    assert path.read_bytes() == b"second" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]


def test_write_atomic_failure_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "node_id"
    write_atomic(path, b"1\n")
    with pytest.raises(TypeError):
        write_atomic(path, "not bytes", 0o600)  # type: ignore[arg-type]
    assert path.read_bytes() == b"1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["node_id"]
