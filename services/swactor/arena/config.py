"""`[arena]` table of /etc/swactor/swactor.toml; every key can also be given on the command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swactor.common import sockets
from swactor.common.config import DEFAULT_STATE_DIR

GIB = 1 << 30


@dataclass(frozen=True)
class ArenaConfig:
    # gRPC API (Unix socket).
    socket: Path = sockets.ARENA
    # fd hand-out socket: SCM_RIGHTS memfd + holder liveness.
    fd_socket: Path = sockets.ARENA_FD
    # Where the never-reused ring id high-water mark lives.
    state_dir: Path = DEFAULT_STATE_DIR
    # Sparse size of the memfd: address space, not memory (untouched pages cost nothing).
    ceiling_bytes: int = 64 * GIB
    # Extra group whose members may receive the memfd (besides root and the service's own uid).
    group: str = "swactor"
    # Seconds a graceful stop waits for in-flight RPCs.
    shutdown_grace_s: float = 2.0
