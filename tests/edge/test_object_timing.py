"""Per-object pump timings (issue 7): the ObjectTap core, and both drivers' ObjectTimings over loopback QUIC."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import swactor_ring as sr
from swactor.edge.objtap import ObjectTap
from swactor.v1 import edge_pb2
from tests.edge.fakering import FakeRing, produce_all, wait_fd
from tests.edge.inproc import next_event, queued, start_nodes, stop_nodes


def record(object_id: int, sequence: int, extent: int) -> bytes:
    return bytes(sr.ObjectHeader(object_id, sequence, extent, 0).encode()) + os.urandom(extent)


def chop(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=60, deadline=None)
@given(extents=st.lists(st.integers(1, 300), min_size=1, max_size=6), cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_tap_marks_every_record_however_the_stream_is_split(extents: list[int], cuts: list[int]) -> None:
    data = b"".join(record(1000 + i, i, e) for i, e in enumerate(extents))
    tap = ObjectTap(commits=True)
    ends, off = [], 0
    for e in extents:
        off += sr.OBJECT_HEADER_LEN + e
        ends.append(off)
    committed = 0
    for t, span in enumerate(chop(data, cuts), start=1):
        tap.feed(memoryview(span), now_us=10 * t)
        assert not tap.done or tap.done[-1].committed_us, "recv marks finish only when committed"
        committed = min(len(data), committed + len(span) // 2 + 1)  # the ring lags the stream
        tap.commit(committed, now_us=10 * t + 5)
    tap.commit(len(data), now_us=10**6)
    marks, dropped = tap.drain()
    assert dropped == 0 and not tap.broken
    assert [(m.object_id, m.sequence, m.extent) for m in marks] == [(1000 + i, i, e) for i, e in enumerate(extents)]
    for m in marks:
        assert 0 < m.first_us <= m.last_us < m.committed_us


def test_tap_send_side_finishes_at_feed_and_bounds_its_buffer() -> None:
    calls: list[int] = []
    tap = ObjectTap(commits=False, on_done=lambda: calls.append(1), limit=2)
    tap.feed(b"".join(record(9, s, 8) for s in range(3)), now_us=7)
    marks, dropped = tap.drain()
    assert [m.sequence for m in marks] == [0, 1] and dropped == 1
    assert all(m.first_us == m.last_us == 7 and m.committed_us == 0 for m in marks)
    assert calls == [1]  # once, when `done` turned non-empty


def test_tap_turns_off_on_a_malformed_header_without_raising() -> None:
    tap = ObjectTap(commits=False)
    tap.feed(record(1, 0, 4), 1)
    tap.feed(b"XXXX" + bytes(36) + b"payload", 2)
    tap.feed(record(2, 1, 4), 3)
    marks, _ = tap.drain()
    assert [m.sequence for m in marks] == [0]
    assert "stream offset 44" in tap.broken


async def _drain(ring: FakeRing, total: int) -> None:
    got = 0
    while got < total:
        chunk = ring.read(4096)  # a slow consumer: the recv ring fills and commits lag arrivals
        got += len(chunk)
        if not chunk and not ring.arm_readable():
            await wait_fd(ring.readable_fd)
            ring.ack_readable()
        await asyncio.sleep(0)


async def _timings(node, edge_id: int, role: int, want: int) -> list[edge_pb2.ObjectTiming]:
    got: list[edge_pb2.ObjectTiming] = []
    while len(got) < want:
        ev = await asyncio.wait_for(node.timings.queue.get(), 10)
        assert ev is not None
        if ev.WhichOneof("event") != "objects":
            continue  # the watcher also gets the edge's coarse events
        assert ev.objects.edge_id == edge_id and ev.objects.role == role and ev.objects.dropped == 0
        assert ev.node_id == node.node_id
        got.extend(ev.objects.objects)
    return got


async def _edge_5(a, b) -> tuple[FakeRing, FakeRing]:
    """Edge 5 from a to b, ready: a's egress ring and b's ingress ring (smaller than a large object)."""
    tx = a.rings.add(FakeRing(11, 64 << 10))
    rx = b.rings.add(FakeRing(21, 16 << 10))
    await b.driver.establish_recv(5, 21, a.node_id, None)
    await a.driver.establish_send(5, b.node_id, 11, None)
    await next_event(a, "ready", 5)
    return tx, rx


def test_drivers_report_object_timings_for_each_record(tmp_path: Path) -> None:
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        a.timings = a.driver.watch({5}, False, object_timings=True)  # type: ignore[attr-defined]
        b.timings = b.driver.watch({5}, False, object_timings=True)  # type: ignore[attr-defined]
        try:
            tx, rx = await _edge_5(a, b)
            extents = [4, 2304, 9000, 40000, 2304]  # decode-sized, and larger than the recv ring
            data = b"".join(record(70 + i, i, e) for i, e in enumerate(extents))
            await asyncio.wait_for(asyncio.gather(produce_all(tx, data), _drain(rx, len(data))), 30)
            sent = await _timings(a, 5, edge_pb2.EDGE_ROLE_SEND, len(extents))
            recv = await _timings(b, 5, edge_pb2.EDGE_ROLE_RECV, len(extents))
            for marks in (sent, recv):
                assert [(m.object_id, m.sequence, m.extent) for m in marks] == [
                    (70 + i, i, e) for i, e in enumerate(extents)]
            for s, r in zip(sent, recv, strict=True):
                assert 0 < s.first_us <= s.last_us and s.committed_us == 0
                assert s.first_us <= r.first_us <= r.last_us <= r.committed_us  # one machine clock
            assert recv[3].committed_us > recv[3].first_us  # 40 kB: many datagrams, through a 16 kB ring
            assert all(ev.WhichOneof("event") != "objects" for ev in queued(a.watcher) + queued(b.watcher)), \
                "watchers that did not ask for timings get none"
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())


def test_a_timings_watcher_that_comes_after_the_objects_still_gets_them(tmp_path: Path) -> None:
    """A traced run's owner subscribes while its edges come up; on a loaded host its first objects can pass first."""
    async def main() -> None:
        a, b = await start_nodes(tmp_path)
        try:
            tx, rx = await _edge_5(a, b)
            extents = [4, 2304, 9000]
            data = b"".join(record(70 + i, i, e) for i, e in enumerate(extents))
            await asyncio.wait_for(asyncio.gather(produce_all(tx, data), _drain(rx, len(data))), 30)
            await asyncio.sleep(2 * a.driver.config.object_timing_flush_s)  # flushed with nobody watching
            a.timings = a.driver.watch({5}, False, object_timings=True)  # type: ignore[attr-defined]
            b.timings = b.driver.watch({5}, False, object_timings=True)  # type: ignore[attr-defined]
            for node, role in ((a, edge_pb2.EDGE_ROLE_SEND), (b, edge_pb2.EDGE_ROLE_RECV)):
                marks = await _timings(node, 5, role, len(extents))
                assert [(m.object_id, m.sequence) for m in marks] == [(70 + i, i) for i in range(len(extents))]
        finally:
            await stop_nodes([a, b])

    asyncio.run(main())
