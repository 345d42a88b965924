"""Two (or more) edge drivers in one event loop on 127.0.0.1 with fake rings (unit-level tests)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from swactor.edge.config import EdgeConfig
from swactor.edge.driver import Driver
from swactor.edge.identity import create_identity
from swactor.edge.peers import StaticPeerDirectory
from swactor.edge.watchers import Watcher
from swactor.v1 import edge_pb2
from tests.edge.fakering import FakeRingSource


@dataclasses.dataclass
class Node:
    node_id: int
    driver: Driver
    rings: FakeRingSource
    watcher: Watcher
    endpoint: str


async def start_nodes(tmp: Path, n: int = 2, **cfg: object) -> list[Node]:
    peers_file = tmp / "peers.toml"
    peers_file.write_text("")
    nodes: list[Node] = []
    entries = []
    for i in range(n):
        node_id = 100 + i
        ident = create_identity(tmp / f"n{i}" / "cert.pem", tmp / f"n{i}" / "key.pem", node_id)
        config = dataclasses.replace(EdgeConfig(), bind="127.0.0.1:0", **cfg)  # type: ignore[arg-type]
        rings = FakeRingSource()
        driver = Driver(
            node_id=node_id, config=config, identity=ident, directory=StaticPeerDirectory(peers_file), rings=rings
        )
        host, port = driver.start()
        entries.append(f'[[peer]]\nnode_id = {node_id}\nendpoint = "{host}:{port}"\nfingerprint = "{ident.fingerprint}"\n')
        nodes.append(Node(node_id, driver, rings, driver.watch(set(), False), f"{host}:{port}"))
    peers_file.write_text("\n".join(entries))
    return nodes


async def stop_nodes(nodes: list[Node]) -> None:
    for node in nodes:
        await node.driver.close()


async def next_event(node: Node, kind: str, edge_id: int, timeout: float = 5.0) -> edge_pb2.EdgeEvent:
    """The next event of `kind` for `edge_id` (other events are skipped)."""
    async def wait() -> edge_pb2.EdgeEvent:
        while True:
            ev = await node.watcher.queue.get()
            assert ev is not None, "driver closed"
            if ev.WhichOneof("event") == kind and getattr(ev, kind).edge_id == edge_id:
                return ev
    return await asyncio.wait_for(wait(), timeout)


async def until(cond: Callable[[], object], what: str, timeout: float = 10.0, interval: float = 0.005) -> None:
    """Let the loop run until `cond()` holds; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def queued(watcher: Watcher) -> list[edge_pb2.EdgeEvent]:
    """Take every event the watcher has queued so far."""
    out = []
    while not watcher.queue.empty():
        ev = watcher.queue.get_nowait()
        if ev is not None:
            out.append(ev)
    return out
