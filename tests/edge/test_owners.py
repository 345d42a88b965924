"""Edge owners (swactor.edge.owners): a dead owner's edges are stopped; the arena-manager gone
makes the driver refuse new edges and retire once its owners stopped theirs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swactor.edge import driver as driver_mod
from swactor.edge.owners import OwnerStreams
from swactor.edge.table import EdgeError
from tests.edge.fakering import FakeRing
from tests.edge.inproc import next_event, queued, start_nodes, stop_nodes


def test_owner_is_gone_only_when_its_last_stream_ends() -> None:
    owners = OwnerStreams()
    owners.opened(7)
    owners.opened(7)
    owners.opened(0)  # unowned watchers are not counted
    assert owners.holds(7) and not owners.holds(0) and len(owners) == 1
    assert owners.closed(7) is False
    assert owners.closed(7) is True
    assert owners.closed(7) is False  # a stray second end is not a second death
    assert owners.closed(0) is False
    assert not owners.holds(7) and len(owners) == 0


def test_owner_gone_stops_only_its_edges_and_releases_their_rings(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            mine = [a.rings.add(FakeRing(11, 64 << 10)), a.rings.add(FakeRing(12, 64 << 10))]
            other = a.rings.add(FakeRing(13, 64 << 10))
            # before the owner's first stream: its stream may arrive after its first Establish
            await a.driver.establish_send(1, b.node_id, 11, None, owner_id=42)
            dead = a.driver.watch(set(), False, owner_id=42)
            alive = a.driver.watch(set(), False, owner_id=43)
            await a.driver.establish_recv(2, 12, b.node_id, None, owner_id=42)
            await a.driver.establish_send(3, b.node_id, 13, None, owner_id=43)
            await next_event(a, "ready", 1)
            queued(a.watcher)
            a.driver.unwatch(dead)  # the owner's last stream ended: it exited
            stopped = {ev.pump_stopped.edge_id: ev.pump_stopped.ring_id for ev in queued(a.watcher)
                       if ev.WhichOneof("event") == "pump_stopped"}
            assert stopped == {1: 11, 2: 12}
            assert all(r.released for r in mine) and not other.released
            assert set(a.driver.table.edges) == {(3, driver_mod.SEND)}
            a.driver.unwatch(alive)
            assert other.released and not a.driver.table.edges
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_arena_lost_refuses_new_edges_and_retires_after_the_owners_stop_theirs(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            ring = a.rings.add(FakeRing(11, 64 << 10))
            await a.driver.establish_send(1, b.node_id, 11, None)
            a.driver.arena_lost("hand-out connection closed")
            assert not a.driver.retired.is_set()  # the owner tears its edge down first
            with pytest.raises(EdgeError, match="arena-manager is gone"):
                await a.driver.establish_send(2, b.node_id, 12, None)
            a.driver.stop_edge(1)
            assert ring.released and a.driver.retired.is_set()
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_arena_lost_grace_stops_what_owners_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "ARENA_LOST_GRACE_S", 0.05)

    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            ring = a.rings.add(FakeRing(11, 64 << 10))
            await a.driver.establish_send(1, b.node_id, 11, None)
            a.driver.arena_lost("hand-out connection closed")
            await asyncio.wait_for(a.driver.retired.wait(), 5)
            assert ring.released and not a.driver.table.edges
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())
