"""Edge owners: which local process holds each edge, and when it is gone (I/O-free core).

An owner (the stage node's worker service, the orchestrator's token endpoints) picks one owner_id
per process, holds WatchEdges streams with it and names it in EstablishSend / EstablishRecv. Its
streams are its liveness: when its process exits, the kernel closes its connection to the
driver's socket and gRPC ends every stream on it. When an owner's *last* stream ends, the owner is
gone and every edge it established is stopped as StopEdge would stop it (pump stopped, ring hold
dropped). Without that the pumps of a dead owner's edges keep their rings attached, so the
arena can never reclaim them (docs/faults.md, SIGKILL of the worker service).

Why streams and not the caller's pid: gRPC does not hand a servicer the peer credentials of the
Unix socket, a pid claimed in the request is neither checked nor meaningful across pid namespaces,
and the owner already keeps a stream open to follow its edges: an owner that lost its stream has
lost its edges' events too, so stopping them is the fail-stop answer either way.

An owner's edges are stopped when its stream count drops to zero, whenever they were established:
an Establish* may reach the driver before the owner's first stream does (two calls on one channel
are not ordered), or in the second an owner takes to watch again after its stream broke; it is
covered from the moment the owner holds a stream. owner_id 0 is "unowned": such edges end only by
StopEdge (tools and tests that drive the driver by hand).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field


class EdgeStopCause(enum.Enum):
    """Why the driver stopped an edge's pump (logged with edge.pump_stopped)."""

    STOP_EDGE = "StopEdge"  # its owner (or anyone) asked
    OWNER_GONE = "OwnerGone"  # its owner's last WatchEdges stream ended
    DRIVER_CLOSING = "DriverClosing"  # the driver shuts down
    ARENA_LOST = "ArenaLost"  # the host's arena-manager is gone and the grace for owners passed


@dataclass
class OwnerStreams:
    """Open WatchEdges streams per owner_id."""

    _open: Counter[int] = field(default_factory=Counter)

    def opened(self, owner_id: int) -> None:
        if owner_id:
            self._open[owner_id] += 1

    def closed(self, owner_id: int) -> bool:
        """One of the owner's streams ended; True when it was its last one (the owner is gone)."""
        if not owner_id or self._open[owner_id] <= 0:
            return False
        self._open[owner_id] -= 1
        if self._open[owner_id]:
            return False
        del self._open[owner_id]
        return True

    def holds(self, owner_id: int) -> bool:
        return self._open[owner_id] > 0 if owner_id else False

    def __len__(self) -> int:
        return len(self._open)
