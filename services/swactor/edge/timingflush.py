"""Object-timing batches (docs/edge.md "Per-object timing"): the taps of this driver's pumps, and
the ObjectTimings events built from their finished marks. I/O-free; the driver decides when to
`drain` (a timer every `object_timing_flush_s`, and before an edge's closed / fault /
pump_stopped event, so that its timings reach watchers before its end). Every drained mark also
adds to `transfers`, per peer and direction, watched or not (GetStatus, the hosts' /metrics).

An edge end's marks that no timings watcher covers yet wait in its backlog (the last BACKLOG) for the first one that
does: a run's owner subscribes while its edges come up, and on a loaded host its first objects can pass before the
subscription lands (a traced run's first tokens had no hop timings). Untraced runs' backlogs stay bounded and are
dropped with their tap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from swactor.common.events import get_logger
from swactor.edge.objtap import ObjectMark, ObjectTap
from swactor.v1 import edge_pb2

log = get_logger(component="COMPONENT_EDGE_DRIVER")
TapKey = tuple[int, int]  # (edge_id, role)
BACKLOG = 256  # marks kept per unwatched edge end (a traced run's first tokens: a few per token)


class TimingTaps:
    def __init__(self, on_done: Callable[[], None]) -> None:
        self.on_done = on_done  # a tap has finished marks: the driver arms its flush timer
        self._taps: dict[TapKey, tuple[ObjectTap, int, int]] = {}  # -> (tap, ring_id, peer node id)
        # (peer node id, role) -> [objects, seconds first to last byte] of every drained mark, watched or not
        self.transfers: dict[tuple[int, int], list[float]] = {}
        self._backlog: dict[TapKey, tuple[deque[ObjectMark], int]] = {}  # -> (marks, dropped)

    def new_tap(self, edge_id: int, role: int, ring_id: int, peer_node_id: int = 0) -> ObjectTap:
        tap = ObjectTap(commits=role == edge_pb2.EDGE_ROLE_RECV, on_done=self.on_done)
        self._taps[(edge_id, role)] = (tap, ring_id, peer_node_id)
        self._backlog.pop((edge_id, role), None)  # an earlier end of this edge id's
        return tap

    def transfer_protos(self) -> list[edge_pb2.ObjectTransfers]:
        return [edge_pb2.ObjectTransfers(peer_node_id=peer, role=role, objects=int(n), seconds=sec)  # type: ignore[arg-type]
                for (peer, role), (n, sec) in sorted(self.transfers.items())]

    def drain(self, live: Callable[[TapKey], ObjectTap | None],
              watched: Callable[[int], bool]) -> list[tuple[edge_pb2.EdgeEvent, int]]:
        """(event, edge_id) per edge end with finished marks that a timings watcher covers (`watched(edge_id)`; the
        others go to the end's backlog); taps whose pump is gone (`live(key)` is not the tap: this was its last batch)
        or that turned off are dropped, with their backlog."""
        out: list[tuple[edge_pb2.EdgeEvent, int]] = []
        for key, (tap, ring_id, peer) in list(self._taps.items()):
            marks, dropped = tap.drain()
            if marks:
                totals = self.transfers.setdefault((peer, key[1]), [0, 0.0])
                totals[0] += len(marks)
                totals[1] += sum(max(0, m.last_us - m.first_us) for m in marks) / 1e6
            gone = live(key) is not tap or tap.broken
            if gone:
                del self._taps[key]
                if tap.broken:
                    log.warning("edge.object_timing_off", edge_id=key[0], ring_id=ring_id, role=key[1], detail=tap.broken)
            if watched(key[0]):
                if key in self._backlog:
                    kept, lost = self._backlog.pop(key)
                    marks, dropped = [*kept, *marks], lost + dropped
                if marks or dropped:
                    out.append((_event(key, ring_id, marks, dropped), key[0]))
            elif gone:
                self._backlog.pop(key, None)
            elif marks or dropped:  # extended in place: an untraced run's flush copies nothing
                kept, lost = self._backlog.get(key) or (deque(maxlen=BACKLOG), 0)
                lost += dropped + max(0, len(kept) + len(marks) - BACKLOG)
                kept.extend(marks)
                self._backlog[key] = (kept, lost)
        return out

    def take_backlog(self, edge_ids: Iterable[int]) -> list[tuple[edge_pb2.EdgeEvent, int]]:
        """(event, edge_id) of the backlogs of `edge_ids` (every edge when empty), for a new timings watcher."""
        wanted = set(edge_ids)
        keys = [k for k in self._backlog if not wanted or k[0] in wanted]
        return [(_event(k, self._taps[k][1], list(marks), dropped), k[0])
                for k in keys for marks, dropped in [self._backlog.pop(k)]]


def _event(key: TapKey, ring_id: int, marks: Iterable[ObjectMark], dropped: int) -> edge_pb2.EdgeEvent:
    return edge_pb2.EdgeEvent(objects=edge_pb2.ObjectTimings(
        edge_id=key[0], ring_id=ring_id, role=key[1], dropped=dropped,  # type: ignore[arg-type]
        objects=[edge_pb2.ObjectTiming(object_id=m.object_id, sequence=m.sequence, extent=m.extent,
                                       first_us=m.first_us, last_us=m.last_us, committed_us=m.committed_us)
                 for m in marks]))
