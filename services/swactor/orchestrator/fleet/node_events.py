"""§40 node lifecycle events (node_started, node_available, node_faulted) from the membership view.

The orchestrator sees the pool through the membership service's view; this turns each change of a
member into lifecycle events for the run store: under run id 0 (the pool's own events, `swactor
events` without a run id) and relayed into every active run's events. Every one carries the node's
worker_generation as its worker gossips it.

  first seen, or seen with a higher epoch (its services restarted)  -> node_started
  -> Available (also: Available again with a new worker generation)  -> node_available
  -> Faulted (the node says why: state_reason)                       -> node_faulted
  -> Dead / Left, or gone from the view                             -> node_faulted (RUN_FAULT_MEMBERSHIP_LOST)

Suspect is a transition, not an event: it ends in Alive (nothing happened) or Dead (node_faulted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swactor.common.events import get_logger
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb

if TYPE_CHECKING:
    from swactor.orchestrator.runs.runner import RunHandle
    from swactor.orchestrator.runs.store import RunStore

POOL_EVENTS_RUN_ID = 0  # the run id the pool's own events are stored under
_LOST = pb.RunFaultReason.Name(pb.RUN_FAULT_MEMBERSHIP_LOST)


@dataclass
class NodeEventTracker:
    last: dict[int, NodeInfo] = field(default_factory=dict)

    def observe(self, members: tuple[NodeInfo, ...], now_us: int) -> list[pb.LifecycleEvent]:
        out: list[pb.LifecycleEvent] = []
        current = {m.node_id: m for m in members}
        for node_id, m in sorted(current.items()):
            old = self.last.get(node_id)
            if m.state is NodeState.SUSPECT:
                continue  # judged when it ends: the last settled state is kept
            out += self._changed(old, m, now_us)
            self.last[node_id] = m
        for node_id, old in sorted(self.last.items()):
            if node_id not in current:
                if old.state is not NodeState.LEFT:
                    out.append(_ev(pb.NODE_FAULTED, old, now_us, reason=_LOST, component=pb.COMPONENT_MEMBERSHIP,
                                   detail="gone from the membership view"))
                del self.last[node_id]
        return out

    def _changed(self, old: NodeInfo | None, new: NodeInfo, now_us: int) -> list[pb.LifecycleEvent]:
        if new.state is NodeState.LEFT:
            if old is None or old.state is NodeState.LEFT:
                return []  # a departed member we never saw alive
            return [_ev(pb.NODE_FAULTED, new, now_us, reason=_LOST, component=pb.COMPONENT_MEMBERSHIP,
                        detail="dead or left the pool")]
        out = []
        if old is None or old.state is NodeState.LEFT or new.epoch > old.epoch:
            out.append(_ev(pb.NODE_STARTED, new, now_us, detail=new.hostname))
            old = None
        if new.state is NodeState.AVAILABLE:
            if old is None or old.state is not NodeState.AVAILABLE or new.worker_generation != old.worker_generation:
                out.append(_ev(pb.NODE_AVAILABLE, new, now_us, detail=new.control_endpoint))
        elif new.state is NodeState.FAULTED and (old is None or old.state is not NodeState.FAULTED):
            reason = new.reason or pb.RunFaultReason.Name(pb.RUN_FAULT_NODE_UNAVAILABLE)
            out.append(_ev(pb.NODE_FAULTED, new, now_us, reason=reason, component=pb.COMPONENT_MEMBERSHIP,
                           detail="the node reported itself faulted"))
        return out


def _ev(kind: int, m: NodeInfo, now_us: int, **fields: object) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(kind=kind, node_id=m.node_id, worker_generation=m.worker_generation,  # type: ignore[arg-type]
                             time_us=now_us, **fields)


def publish(events: list[pb.LifecycleEvent], store: RunStore, active: Iterable[RunHandle]) -> None:
    """Store the pool's events under POOL_EVENTS_RUN_ID, journal them, and relay them into every active run."""
    if not events:
        return
    store.append(POOL_EVENTS_RUN_ID, events)
    log = get_logger(component="orchestrator")
    for ev in events:
        log.info("lifecycle_event", kind=pb.LifecycleEventKind.Name(ev.kind), node_id=ev.node_id,
                 worker_generation=ev.worker_generation, reason=ev.reason or None, detail=ev.detail or None)
    for handle in active:
        for ev in events:
            handle.report(F.Relay(ev))
