"""WatchEdges fan-out: every driver event to every subscriber, bounded per subscriber.

A watcher that falls WATCH_QUEUE events behind is marked `overflowed`; the servicer then ends its
stream with RESOURCE_EXHAUSTED (the client watches again with replay). Object timings go only to
watchers that asked for them. Publishing stamps `time_us` and `node_id` on the event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from swactor.common.clock import wall_us
from swactor.v1 import edge_pb2

WATCH_QUEUE = 4096


class Watcher:
    def __init__(self, edge_ids: set[int], object_timings: bool = False, owner_id: int = 0) -> None:
        self.edge_ids = edge_ids  # empty: every edge
        self.object_timings = object_timings
        self.owner_id = owner_id  # non-zero: this stream holds that owner's edges (owners.py)
        self.queue: asyncio.Queue[edge_pb2.EdgeEvent | None] = asyncio.Queue(WATCH_QUEUE)
        self.overflowed = False

    def offer(self, event: edge_pb2.EdgeEvent, edge_id: int) -> None:
        if self.edge_ids and edge_id not in self.edge_ids:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True


class Watchers:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self._all: set[Watcher] = set()

    def __len__(self) -> int:
        return len(self._all)

    def watch(self, edge_ids: set[int], replay: Iterable[tuple[edge_pb2.EdgeEvent, int]],
              object_timings: bool = False, owner_id: int = 0) -> Watcher:
        """A new subscriber; `replay` (event, edge_id) pairs are queued to it first."""
        w = Watcher(edge_ids, object_timings, owner_id)
        for event, edge_id in replay:
            w.offer(event, edge_id)
        self._all.add(w)
        return w

    def discard(self, w: Watcher) -> None:
        self._all.discard(w)

    def watch_timings(self, edge_id: int) -> bool:
        """Whether some watcher takes `edge_id`'s object timings."""
        return any(w.object_timings and (not w.edge_ids or edge_id in w.edge_ids) for w in self._all)

    def publish(self, event: edge_pb2.EdgeEvent, edge_id: int) -> None:
        self.stamp(event)
        timings = event.HasField("objects")
        for w in self._all:
            if w.object_timings or not timings:
                w.offer(event, edge_id)

    def stamp(self, event: edge_pb2.EdgeEvent) -> edge_pb2.EdgeEvent:
        event.time_us = wall_us()
        event.node_id = self.node_id
        return event

    def close(self) -> None:
        """The driver stops: every stream ends after what it already has."""
        for w in list(self._all):
            with contextlib.suppress(asyncio.QueueFull):
                w.queue.put_nowait(None)
