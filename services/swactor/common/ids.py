"""Identifiers (spec §6): random u64s for run-scoped ids, a persisted node id per host.

Ids use 63 random bits so they survive every signed 64-bit store (SQLite, JSON readers) unchanged.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from swactor.common.files import write_atomic

NODE_ID_FILE = "node_id"


def new_id() -> int:
    """A fresh non-zero 63-bit id (0 means "unset" in every message)."""
    while True:
        value = secrets.randbits(63)
        if value:
            return value


def load_or_create_node_id(state_dir: Path) -> int:
    """The host's stable node id: created once in `state_dir`, the same across restarts."""
    path = state_dir / NODE_ID_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        state_dir.mkdir(parents=True, exist_ok=True)
        node_id = new_id()
        write_atomic(path, f"{node_id}\n".encode(), 0o644)  # a crash never leaves a half-written id
        return node_id
    try:
        node_id = int(text)
    except ValueError:
        raise ValueError(f"{path}: node id is not an integer: {text!r}") from None
    if not 0 < node_id < 2**63:
        raise ValueError(f"{path}: node id {node_id} is outside 1..2^63-1")
    return node_id
