"""ArenaHold.on_end: the holder hears when the arena-manager's end of the hand-out connection closes."""

from __future__ import annotations

import asyncio
import os
import socket

from swactor.arena.client import ArenaHold


def _hold() -> tuple[ArenaHold, socket.socket]:
    ours, arenas = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    memfd = os.memfd_create("test-arena")
    return ArenaHold(1, memfd, 4096, 4096, 4242, ours), arenas


def test_on_end_fires_once_when_the_arena_side_closes_and_ignores_chatter() -> None:
    async def main() -> None:
        hold, arena = _hold()
        ended: list[str] = []
        hold.on_end(ended.append)
        arena.send(b"unexpected")  # not the protocol: ignored, not taken for the end
        for _ in range(5):
            await asyncio.sleep(0)
        assert ended == []
        arena.close()
        for _ in range(50):
            if ended:
                break
            await asyncio.sleep(0.01)
        assert ended == ["arena-manager (pid 4242) closed the hand-out connection"]
        await asyncio.sleep(0.02)
        assert len(ended) == 1
        hold.close()

    asyncio.run(main())


def test_close_stops_watching() -> None:
    async def main() -> None:
        hold, arena = _hold()
        ended: list[str] = []
        hold.on_end(ended.append)
        hold.close()  # our own close is not the arena's end
        arena.close()
        await asyncio.sleep(0.02)
        assert ended == [] and hold.closed

    asyncio.run(main())
