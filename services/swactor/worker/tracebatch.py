"""The per-object events of a traced run (runtime.trace_objects), one message per sequence (issue 16).

A stage node sees six per-object events per sequence: its StageController's object_loaded, execute_step_started,
object_produced and step_completed, and its edge-driver's timings of the inbound RECV end (edge_object_received) and
the outbound SEND end (edge_object_sent), the driver's arriving up to its flush interval later. Relaying each as its
own StageUpdate cost the node and the orchestrator a gRPC message and a run-FSM step apiece; grouped, a sequence is
one `StageUpdate.events`. A group goes out when it holds all six kinds, and with it every older group still open (an
event that never comes, e.g. a timing the driver dropped, holds nothing up for long); `flush` sends the rest (the
stage stopped). I/O-free.
"""

from __future__ import annotations

from swactor.v1 import common_pb2 as pb

PER_OBJECT_KINDS = frozenset({pb.OBJECT_LOADED, pb.EXECUTE_STEP_STARTED, pb.OBJECT_PRODUCED, pb.STEP_COMPLETED,
                              pb.EDGE_OBJECT_RECEIVED, pb.EDGE_OBJECT_SENT})


class SequenceBatches:
    def __init__(self) -> None:
        self._open: dict[int, list[pb.LifecycleEvent]] = {}

    def add(self, ev: pb.LifecycleEvent) -> list[list[pb.LifecycleEvent]]:
        """Group `ev` (a PER_OBJECT_KINDS event with a sequence); the groups now ready, oldest first."""
        seq = ev.sequence
        group = self._open.setdefault(seq, [])
        group.append(ev)
        if {e.kind for e in group} < PER_OBJECT_KINDS:
            return []
        ready = [s for s in sorted(self._open) if s <= seq]
        return [self._open.pop(s) for s in ready]

    def flush(self) -> list[list[pb.LifecycleEvent]]:
        out = [self._open[s] for s in sorted(self._open)]
        self._open.clear()
        return out
