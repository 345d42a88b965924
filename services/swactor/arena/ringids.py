"""Ring ids that are never reused on this host, across restarts of the service (spec §6).

The state file holds a high-water mark: every id below it may have been handed out. Ids are
reserved in blocks (one fsync per block, not per lease); after a crash the unused rest of a block
is skipped, never reissued. A lock file keeps a second arena from sharing the id space.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from swactor.common.files import write_atomic

STATE_FILE = "arena_ring_ids"
LOCK_FILE = "arena.lock"
DEFAULT_BLOCK = 1024


class RingIdStoreError(RuntimeError):
    pass


class RingIdStore:
    """Callable: each call returns a fresh ring id (>= 1)."""

    def __init__(self, state_dir: Path, block: int = DEFAULT_BLOCK) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self._path = state_dir / STATE_FILE
        self._block = block
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise RingIdStoreError(f"state dir {state_dir}: {e.strerror}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RingIdStoreError(f"state dir {state_dir} is locked by another swactor-arena") from None
        self._next = self._read_high_water()
        self._reserved_to = self._next  # nothing of the new process's ids is durable yet

    def _read_high_water(self) -> int:
        try:
            text = self._path.read_text().strip()
        except FileNotFoundError:
            return 1
        except OSError as e:
            raise RingIdStoreError(f"{self._path}: {e.strerror}") from None
        try:
            value = int(text)
        except ValueError:
            raise RingIdStoreError(f"{self._path}: not an integer: {text!r}") from None
        if not 1 <= value < 2**63:
            raise RingIdStoreError(f"{self._path}: high-water mark {value} outside 1..2^63-1")
        return value

    @property
    def next_id(self) -> int:
        return self._next

    def __call__(self) -> int:
        if self._next >= self._reserved_to:
            high = self._next + self._block
            write_atomic(self._path, f"{high}\n".encode(), 0o644)  # durable before any id of the block is used
            self._reserved_to = high
        ring_id = self._next
        self._next += 1
        return ring_id

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
