"""Real edge-drivers (swactor.edge.driver.Driver: aioquic over 127.0.0.1) for several hosts in one
process, pumping real ring-rs rings of one shared memfd arena. Only the arena-manager is left out:
rings come from the test harness arena, so the ring source opens handles without AttachRing.
`DriverPortAdapter` gives the worker/orchestrator the DriverPort they use over gRPC in production."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from swactor.common.ringport import ConsumerEnd, ProducerEnd, open_consumer, open_producer
from swactor.edge.config import EdgeConfig
from swactor.edge.driver import Driver
from swactor.edge.identity import create_identity
from swactor.edge.peers import StaticPeerDirectory
from swactor.edge.ring_source import WakeFds
from swactor.edgeend import establisher as est
from swactor.v1 import common_pb2


class HarnessRingSource:
    """edge RingSource over an already-mapped arena (fresh wake eventfds per pumped ring)."""

    def __init__(self, arena: Any) -> None:
        self.arena = arena
        self.wake = WakeFds()

    async def open_producer(self, ring_id: int, layout: common_pb2.RingLayout) -> ProducerEnd:
        rfd, wfd = self.wake.create(ring_id)
        return open_producer(self.arena, layout, readable_fd=rfd, writable_fd=wfd, on_release=self.wake.drop)

    async def open_consumer(self, ring_id: int, layout: common_pb2.RingLayout) -> ConsumerEnd:
        rfd, wfd = self.wake.create(ring_id)
        return open_consumer(self.arena, layout, readable_fd=rfd, writable_fd=wfd, on_release=self.wake.drop)


class DriverPortAdapter:
    """The worker's DriverPort over an in-process Driver (EdgeDriverPort does the same over gRPC)."""

    def __init__(self, driver: Driver, source: HarnessRingSource) -> None:
        self.driver = driver
        self.source = source
        self.calls: list[tuple[str, int]] = []

    async def establish_send(self, edge_id: int, rx_node_id: int, layout: Any) -> None:
        self.calls.append(("send", edge_id))
        await self.driver.establish_send(edge_id, rx_node_id, layout.ring_id, layout.to_pb())

    async def establish_recv(self, edge_id: int, tx_node_id: int, layout: Any) -> None:
        self.calls.append(("recv", edge_id))
        await self.driver.establish_recv(edge_id, layout.ring_id, tx_node_id, layout.to_pb())

    async def stop_edge(self, edge_id: int, ring_id: int) -> bool:
        self.calls.append(("stop", edge_id))
        return self.driver.stop_edge(edge_id, ring_id)

    async def events(self) -> AsyncIterator[Any]:
        watcher = self.driver.watch(set(), True)
        try:
            while True:
                ev = await watcher.queue.get()
                if ev is None:
                    return
                match ev.WhichOneof("event"):
                    case "ready":
                        yield est.DriverEdgeReady(ev.ready.edge_id, ev.ready.ring_id)
                    case "closed":
                        yield est.StreamClosed(ev.closed.edge_id, ev.closed.ring_id)
                    case "fault":
                        yield est.StreamFault(ev.fault.edge_id, ev.fault.ring_id, ev.fault.reason, ev.fault.detail)
                    case "pump_stopped":
                        yield est.PumpStopped(ev.pump_stopped.edge_id, ev.pump_stopped.ring_id)
        finally:
            self.driver.watchers.discard(watcher)

    async def wake_fds(self, ring_id: int) -> tuple[int, int] | None:
        fds = self.source.wake.by_ring.get(ring_id)
        return None if fds is None else (os.dup(fds[0]), os.dup(fds[1]))

    async def healthy(self) -> bool:
        return True

    def for_new_owner(self) -> Any:
        return self  # in-process: nothing outlives the test's own teardown


async def start_drivers(tmp: Path, node_ids: list[int], arena: Any) -> dict[int, DriverPortAdapter]:
    peers_file = tmp / "peers.toml"
    peers_file.write_text("")
    ports: dict[int, DriverPortAdapter] = {}
    entries = []
    for node_id in node_ids:
        ident = create_identity(tmp / f"edge-{node_id}" / "cert.pem", tmp / f"edge-{node_id}" / "key.pem", node_id)
        source = HarnessRingSource(arena)
        driver = Driver(node_id=node_id, config=dataclasses.replace(EdgeConfig(), bind="127.0.0.1:0"), identity=ident,
                        directory=StaticPeerDirectory(peers_file), rings=source)
        host, port = driver.start()
        entries.append(f'[[peer]]\nnode_id = {node_id}\nendpoint = "{host}:{port}"\nfingerprint = "{ident.fingerprint}"\n')
        ports[node_id] = DriverPortAdapter(driver, source)
    peers_file.write_text("\n".join(entries))
    return ports


async def stop_drivers(ports: dict[int, DriverPortAdapter]) -> None:
    for p in ports.values():
        await p.driver.close()
