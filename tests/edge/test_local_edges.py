"""Edges whose two ends are on one host, through a real edge-driver and real ring-rs rings of one memfd
arena (the harness of tests/orchestrator/inproc_edges.py): the driver carries them over its in-process
local link (locallink.py). Objects arrive intact and in order, FIN and StopEdge end both pumps, and
the endpoint opens no QUIC connection and sends no datagram; GetStatus shows the objects under this
node in `transfers`, never in QUIC `traffic`. Waits are conditions with deadlines."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import swactor_ring as sr
from swactor.common.ringport import native_layout
from swactor.edge import preamble
from swactor.edge.driver import Driver
from swactor.edge.watchers import Watcher
from swactor.v1 import common_pb2, edge_pb2
from tests.edge.fakering import wait_fd
from tests.edge.inproc import until
from tests.edge.test_object_timing import record
from tests.orchestrator.inproc_edges import DriverPortAdapter, start_drivers, stop_drivers
from tests.worker_service.harness import Arena

NODE = 31
OBJECTS = 64
EXTENT = 16 << 10


async def _event(watcher: Watcher, kind: str, edge_id: int, timeout: float = 10.0) -> edge_pb2.EdgeEvent:
    """The next event of `kind` for `edge_id` (other events are skipped)."""
    async def wait() -> edge_pb2.EdgeEvent:
        while True:
            ev = await watcher.queue.get()
            assert ev is not None, "driver closed"
            if ev.WhichOneof("event") == kind and getattr(ev, kind).edge_id == edge_id:
                return ev
    return await asyncio.wait_for(wait(), timeout)


async def _worker_end(port: DriverPortAdapter, arena: Arena, layout: Any, end: type) -> Any:
    """The worker's side of a pumped ring, on the wake eventfds the driver made for it."""
    fds = await port.wake_fds(layout.ring_id)
    assert fds is not None
    try:
        return end(arena.arena, native_layout(layout), readable_fd=fds[0], writable_fd=fds[1])
    finally:
        for fd in fds:
            os.close(fd)


async def _produce(prod: Any, data: bytes, close: bool = True) -> None:
    view = memoryview(data)
    while view:
        n = prod.write(view)
        view = view[n:]
        if view and not prod.arm_writable():
            await wait_fd(prod.writable_fd)
            prod.ack_wake()
    if close:
        prod.close()


async def _consume(cons: Any, total: int) -> bytes:
    buf, out = bytearray(1 << 16), bytearray()
    while len(out) < total:
        n = cons.read_into(buf)
        if n:
            out += buf[:n]
        elif not cons.arm_readable():
            await wait_fd(cons.readable_fd)
            cons.ack_wake()
    return bytes(out)


def _no_quic(driver: Driver) -> None:
    ep = driver.endpoint
    assert not ep.connections and not ep.traffic_totals() and ep.admission.admitted == 0 and ep.send_errors == 0
    status = driver.status()
    assert not status.connections and not status.traffic


def test_a_self_edge_carries_objects_in_process_without_quic(tmp_path: Path) -> None:
    async def main() -> None:
        arena = Arena(8 << 20)
        ports = await start_drivers(tmp_path, [NODE], arena.arena)
        port = ports[NODE]
        driver = port.driver
        watcher = driver.watch(set(), False)
        try:
            egress, ingress = arena.ring(64 << 10), arena.ring(32 << 10)  # many wraparounds, both full at times
            await driver.establish_recv(1, ingress.ring_id, NODE, ingress.to_pb())
            await driver.establish_send(1, NODE, egress.ring_id, egress.to_pb())
            await _event(watcher, "ready", 1)
            prod = await _worker_end(port, arena, egress, sr.Producer)
            cons = await _worker_end(port, arena, ingress, sr.Consumer)
            data = b"".join(record(i + 1, i, EXTENT) for i in range(OBJECTS))
            _, got = await asyncio.wait_for(asyncio.gather(_produce(prod, data), _consume(cons, len(data))), 60)
            assert got == data  # every record intact, in sequence order
            # the producer closed its ring: FIN after the last byte ends both pumps cleanly
            await _event(watcher, "closed", 1)
            await _event(watcher, "closed", 1)
            assert {(e.role, e.state, e.peer_node_id) for e in driver.status().edges} == {
                (edge_pb2.EDGE_ROLE_SEND, "Closed", NODE), (edge_pb2.EDGE_ROLE_RECV, "Closed", NODE)}
            assert cons.read_into(bytearray(16)) == 0 and cons.state == sr.RingState.CLOSED
            assert driver.local.delivered_bytes == preamble.PREAMBLE_LEN + len(data)
            _no_quic(driver)

            def transfers() -> dict[tuple[int, int], int]:
                return {(t.peer_node_id, t.role): t.objects for t in driver.status().transfers}
            # the objects count under this node, both ways (flushed on the driver's timing timer)
            want = {(NODE, edge_pb2.EDGE_ROLE_SEND): OBJECTS, (NODE, edge_pb2.EDGE_ROLE_RECV): OBJECTS}
            await until(lambda: transfers() == want, "the local edge's object transfers")
            for ring_id in (egress.ring_id, ingress.ring_id):
                assert driver.stop_edge(1, ring_id)
                await _event(watcher, "pump_stopped", 1)
            assert not driver.table.edges
            for end in (driver.local.sender, driver.local.receiver):
                assert driver.table.streams_on(end.uid) == 0
        finally:
            driver.watchers.discard(watcher)
            await stop_drivers(ports)
            arena.close()
        assert driver.local.sender.closed and driver.local.receiver.closed

    asyncio.run(main())


def test_stopping_the_receiving_end_faults_the_sender_and_leaves_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        arena = Arena(8 << 20)
        ports = await start_drivers(tmp_path, [NODE], arena.arena)
        port = ports[NODE]
        driver = port.driver
        watcher = driver.watch(set(), False)
        try:
            egress, ingress = arena.ring(64 << 10), arena.ring(32 << 10)
            await driver.establish_send(2, NODE, egress.ring_id, egress.to_pb())  # the stream comes first
            prod = await _worker_end(port, arena, egress, sr.Producer)
            data = b"".join(record(i + 1, i, EXTENT) for i in range(16))
            await asyncio.wait_for(_produce(prod, data, close=False), 10)  # the link took it all off the ring
            await until(lambda: driver.table.parked_streams == 1, "the stream parked for edge 2")
            await driver.establish_recv(2, ingress.ring_id, NODE, ingress.to_pb())
            recv_state = lambda: next(e.state for e in driver.status().edges if e.role == edge_pb2.EDGE_ROLE_RECV)  # noqa: E731
            await until(lambda: recv_state() == "Backpressured", "the recv pump stalled by a worker that does not read")
            # the parked stream got its initial credit, as over QUIC; the rest waits in the link (and no
            # new credit comes while the ring is full), counted against the send pump's queue limit
            held = driver.local.sender.queued(2)
            assert held == len(data) + preamble.PREAMBLE_LEN - driver.config.initial_stream_window > 0
            assert driver.stop_edge(2, ingress.ring_id)
            await _event(watcher, "pump_stopped", 2)
            fault = (await _event(watcher, "fault", 2)).fault
            assert (fault.ring_id, fault.reason) == (egress.ring_id, common_pb2.STREAM_FAULT_PEER_STOPPED)
            assert driver.stop_edge(2, egress.ring_id)
            await _event(watcher, "pump_stopped", 2)
            for end in (driver.local.sender, driver.local.receiver):
                assert driver.table.streams_on(end.uid) == 0  # the receiver forgot the stream: it was reset
            assert driver.status().pending_streams == 0
            _no_quic(driver)
        finally:
            driver.watchers.discard(watcher)
            await stop_drivers(ports)
            arena.close()

    asyncio.run(main())
