"""A test double for the edge-drivers of several hosts in one process: it pumps the bytes of an
edge from the producer host's egress ring to the consumer host's ingress ring (both in one memfd
arena) instead of over QUIC. Same DriverPort interface as the worker's EdgeDriverPort; wake
eventfds are shared with each ring's host exactly as the real driver shares them (wake_fds)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import swactor_ring as sr
from swactor.worker import establisher as est
from swactor.worker.ringport import native_layout


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        loop.remove_reader(fd)


async def _pump(src: Any, dst: Any) -> None:
    """Move committed bytes src (we consume) -> dst (we produce), waiting on eventfds, never polling."""
    while True:
        free = dst.free()
        if not free:
            if not dst.arm_writable():
                await _readable(dst.fileno())
                dst.ack_wake()
            continue
        data = src.read(min(free, 1 << 16))
        if data:
            written = dst.write(data)
            assert written == len(data)  # one producer: free space only grows
            continue
        if src.state == sr.RingState.CLOSED:
            dst.close()
            return
        if not src.arm_readable():
            await _readable(src.fileno())
            src.ack_wake()


class LoopbackHub:
    def __init__(self, arena: Any) -> None:
        self.arena = arena  # swactor_ring.Arena shared by every host
        self.wake: dict[int, tuple[int, int]] = {}  # ring_id -> (readable, writable) eventfds
        self.sends: dict[int, Any] = {}  # edge_id -> egress layout
        self.recvs: dict[int, Any] = {}  # edge_id -> ingress layout
        self.pumps: dict[int, asyncio.Task[None]] = {}
        self.calls: list[tuple[int, str, int]] = []

    def _fds(self, ring_id: int) -> tuple[int, int]:
        if ring_id not in self.wake:
            self.wake[ring_id] = (sr.eventfd(), sr.eventfd())
        return self.wake[ring_id]

    def _maybe_pump(self, edge_id: int) -> None:
        if edge_id in self.pumps or edge_id not in self.sends or edge_id not in self.recvs:
            return
        s, d = self.sends[edge_id], self.recvs[edge_id]
        sr_fds, dr_fds = self._fds(s.ring_id), self._fds(d.ring_id)
        src = sr.Consumer(self.arena, native_layout(s), readable_fd=sr_fds[0], writable_fd=sr_fds[1])
        dst = sr.Producer(self.arena, native_layout(d), readable_fd=dr_fds[0], writable_fd=dr_fds[1])
        self.pumps[edge_id] = asyncio.create_task(_pump(src, dst))

    def close(self) -> None:
        for task in self.pumps.values():
            task.cancel()
        for r, w in self.wake.values():
            os.close(r)
            os.close(w)


class LoopbackDriver:
    """DriverPort of one host."""

    def __init__(self, hub: LoopbackHub, node_id: int) -> None:
        self.hub = hub
        self.node_id = node_id
        self.mine: set[int] = set()
        self._subscribers: list[asyncio.Queue[Any]] = []

    def _emit(self, ev: Any) -> None:
        for q in self._subscribers:
            q.put_nowait(ev)

    async def establish_send(self, edge_id: int, rx_node_id: int, layout: Any) -> None:
        self.hub.calls.append((self.node_id, "send", edge_id))
        self.hub.sends[edge_id] = layout
        self.mine.add(edge_id)
        self.hub._maybe_pump(edge_id)
        self._emit(est.DriverEdgeReady(edge_id))

    async def establish_recv(self, edge_id: int, layout: Any) -> None:
        self.hub.calls.append((self.node_id, "recv", edge_id))
        self.hub.recvs[edge_id] = layout
        self.mine.add(edge_id)
        self.hub._maybe_pump(edge_id)
        self._emit(est.DriverEdgeReady(edge_id))

    async def stop_edge(self, edge_id: int) -> bool:
        self.hub.calls.append((self.node_id, "stop", edge_id))
        if edge_id not in self.mine:
            return False
        self.mine.discard(edge_id)
        task = self.hub.pumps.pop(edge_id, None)
        if task is not None:
            task.cancel()
        self._emit(est.PumpStopped(edge_id))
        return True

    async def events(self) -> AsyncIterator[Any]:
        q: asyncio.Queue[Any] = asyncio.Queue()
        self._subscribers.append(q)
        try:
            while True:
                yield await q.get()
        finally:
            self._subscribers.remove(q)

    async def wake_fds(self, ring_id: int) -> tuple[int, int] | None:
        r, w = self.hub._fds(ring_id)
        return os.dup(r), os.dup(w)

    async def healthy(self) -> bool:
        return True
