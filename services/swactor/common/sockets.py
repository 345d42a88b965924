"""Each local service's Unix socket: the default the service listens on and its local clients dial
(every [section] that names one defaults to these)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swactor.common.config import DEFAULT_RUN_DIR

ARENA = DEFAULT_RUN_DIR / "arena.sock"
ARENA_FD = DEFAULT_RUN_DIR / "arena-fd.sock"
EDGE = DEFAULT_RUN_DIR / "edge.sock"
EDGE_WAKE = DEFAULT_RUN_DIR / "edge-wake.sock"
MEMBERSHIP = DEFAULT_RUN_DIR / "membership.sock"
ORCHESTRATOR = DEFAULT_RUN_DIR / "orchestrator.sock"


@dataclass
class EdgeEndSockets:
    """The config keys of a service that owns edge ends (swactor.edgeend: the worker's stages, the
    orchestrator's token endpoints): the local arena-manager's gRPC and memfd sockets, the edge-driver's
    gRPC socket and the socket its pumps' wake eventfds are fetched from."""

    arena_socket: Path = ARENA
    arena_fd_socket: Path = ARENA_FD
    edge_socket: Path = EDGE
    edge_wake_socket: Path = EDGE_WAKE
