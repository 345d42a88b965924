"""Tx and Rx edge lifecycles of spec §27: role-facing gates fed only coarse events.

Tx: Provisioning -> Ready -> Producing -> Ready ... -> Stopping -> Stopped, any live state -> Faulted
Rx: Provisioning -> Ready -> ObjectReady -> Ready ... -> Stopping -> Stopped, any live state -> Faulted

Rx's LoadingObject of §27 is not observable here: the worker reports only complete objects
(ObjectLoaded), never byte progress, so Rx goes Ready -> ObjectReady directly. A step consumes the
ready object (Rx back to Ready) while Tx is Producing its output until ObjectProduced.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from swactor.common.events import get_logger


class EdgeLifecycle(enum.Enum):
    PROVISIONING = "Provisioning"
    READY = "Ready"
    PRODUCING = "Producing"  # Tx only
    OBJECT_READY = "ObjectReady"  # Rx only
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    FAULTED = "Faulted"


L = EdgeLifecycle

# (state, event) -> next state; `Fault` and `StopEdge` apply to every live state (below).
_TX = {
    (L.PROVISIONING, "EdgeReady"): L.READY,
    (L.READY, "StepStarted"): L.PRODUCING,
    (L.PRODUCING, "ObjectProduced"): L.READY,
}
_RX = {
    (L.PROVISIONING, "EdgeReady"): L.READY,
    (L.READY, "ObjectLoaded"): L.OBJECT_READY,
    (L.OBJECT_READY, "StepStarted"): L.READY,
}
_LIVE = (L.PROVISIONING, L.READY, L.PRODUCING, L.OBJECT_READY)
_PER_OBJECT = {L.PRODUCING, L.OBJECT_READY}


class InvalidEdgeEvent(Exception):
    """An event the lifecycle does not allow in its current state (a protocol violation)."""


@dataclass
class EdgeActor:
    """One Tx (`kind="tx"`) or Rx (`kind="rx"`) lifecycle."""

    edge_id: int
    kind: str
    state: EdgeLifecycle = L.PROVISIONING

    def on(self, event: str) -> EdgeLifecycle:
        table = _TX if self.kind == "tx" else _RX
        new = table.get((self.state, event))
        if new is None:
            if event == "Fault" and self.state in _LIVE:
                new = L.FAULTED
            elif event == "StopEdge" and self.state in (*_LIVE, L.FAULTED):
                new = L.STOPPING
            elif event == "EdgeStopped" and self.state in (L.STOPPING, L.FAULTED, *_LIVE):
                new = L.STOPPED
            elif self.state in (L.STOPPING, L.STOPPED, L.FAULTED) and event in ("Fault", "StopEdge"):
                return self.state  # late duplicates after the edge already ended
            else:
                raise InvalidEdgeEvent(f"{self.kind} edge {self.edge_id}: {event} in state {self.state.value}")
        old, self.state = self.state, new
        log = get_logger(edge_id=self.edge_id)
        # Ready <-> Producing / ObjectReady happens per object: a journal line each would cost every token CPU
        (log.debug if L.READY in (old, new) and {old, new} & _PER_OBJECT else log.info)(
            f"{self.kind}_edge_state", old=old.value, new=new.value, trigger=event)
        return new

    @property
    def ready(self) -> bool:
        return self.state is L.READY
