"""Each local service's Unix socket: the default the service listens on and its local clients dial
(every [section] that names one defaults to these)."""

from __future__ import annotations

from swactor.common.config import DEFAULT_RUN_DIR

ARENA = DEFAULT_RUN_DIR / "arena.sock"
ARENA_FD = DEFAULT_RUN_DIR / "arena-fd.sock"
EDGE = DEFAULT_RUN_DIR / "edge.sock"
EDGE_WAKE = DEFAULT_RUN_DIR / "edge-wake.sock"
MEMBERSHIP = DEFAULT_RUN_DIR / "membership.sock"
ORCHESTRATOR = DEFAULT_RUN_DIR / "orchestrator.sock"
