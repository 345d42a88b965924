"""A stage's fetch keeps its link busy (issue 22): one connection per lane for the manifest and every span, the
lanes opened while the manifest is on its way, each next span's request pipelined behind the body being read,
and spans that shrink toward the end so the lanes finish together."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from swactor.distribution import fetcher, job, server
from swactor.distribution.connections import Connections
from swactor.distribution.fetcher import RangeClient, Target
from swactor.distribution.job import MAX_SPAN, MIN_SPAN, SpanQueue, spans
from tests.fixtures.http_source import HttpSource
from tests.fixtures.synth_gguf import Shape, write_gguf

from .served import pool, serve

SHAPE = Shape(layers=6, dim=512, ffn=1024, vocab=2048)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return write_gguf(tmp_path / "src" / "m.gguf", SHAPE)


def stage_pieces(served, start: int, end: int) -> set[int]:
    from swactor.modelfile import support

    names = support.stage_tensors(support.ARCHITECTURES["llama"], set(served.manifest.tensors), start, end, SHAPE.layers)
    return set(served.manifest.pieces_for(names))


def piece_bytes(served, pieces: set[int]) -> int:
    return sum(served.manifest.pieces[i].length for i in pieces)


@pytest.mark.parametrize("lanes", [1, 4])
def test_a_fetch_makes_one_connection_per_lane_for_the_manifest_and_every_span(
        model: Path, tmp_path: Path, lanes: int) -> None:
    """Before: a connection for the manifest, one for the header's job, then one per lane for the stage's job (6
    TLS handshakes with 4 lanes), each a TCP and a TLS round trip and a slow start over a WAN. Now the manifest
    and every span of the fetch, and of the next stage's fetch on the same host, share `lanes` connections."""
    s = serve(model, piece_bytes=64 << 10)  # many pieces: many requests per lane
    try:
        async def go():
            p = pool(tmp_path / "cache", lanes=lanes)
            first = await p.acquire(s.request(0, 3, 6))
            after_first = s.server.handshakes
            second = await p.acquire(s.request(3, 6, 6))  # another stage, on the connections the first left
            return p, first, second, after_first

        p, first, second, after_first = asyncio.run(go())
        assert after_first == lanes, f"{after_first} TLS handshakes for one fetch over {lanes} lane(s)"
        assert s.server.handshakes == lanes  # the second fetch made none
        assert p.connections.reused >= 2
        # Nothing asked twice: the server sent each piece once (the header and the tied embedding to the first).
        assert first.bytes_fetched == piece_bytes(s, stage_pieces(s, 0, 3))
        assert second.bytes_fetched == piece_bytes(s, stage_pieces(s, 3, 6) - stage_pieces(s, 0, 3))
        assert s.served_bytes() == first.bytes_fetched + second.bytes_fetched
    finally:
        s.close()


@pytest.mark.serial  # the server's idle timeout against the client's pace: alone on the box (tests/run.sh)
def test_a_kept_connection_the_server_closed_costs_one_fresh_try(model: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The model server ends idle connections (server.IDLE_TIMEOUT_S); a fetch that takes a kept connection the
    server has closed since goes on over a fresh one: no failure, no byte asked twice. (Both of the first fetch's
    connections are kept the moment it is done: a job hands them back before it says so.)"""
    # long enough that a stalled client thread does not see them closed before they are counted kept
    monkeypatch.setattr(server, "IDLE_TIMEOUT_S", 2.0)
    s = serve(model, piece_bytes=64 << 10)
    try:
        async def go():
            p = pool(tmp_path / "cache", lanes=2)
            first = await p.acquire(s.request(0, 3, 6))
            kept = p.connections.idle_count()
            await asyncio.sleep(4.5)  # the server closes them meanwhile
            second = await p.acquire(s.request(3, 6, 6))
            return first, second, kept

        first, second, kept = asyncio.run(go())
        assert kept == 2
        assert s.server.handshakes == 4  # two lanes, twice
        assert s.served_bytes() == first.bytes_fetched + second.bytes_fetched
    finally:
        s.close()


def test_an_acquire_returns_once_its_jobs_handed_their_connections_back(model: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's pieces are all verified when its last one is recorded, before its thread is out; the acquire waits for
    the rest (handing the connections back), so the next stage's fetch takes them. A slow thread (a busy host) is
    played by a hand-back that lingers."""
    hand_back = job.Job._hand_back

    def lingering(self: job.Job) -> None:
        time.sleep(0.3)
        hand_back(self)

    monkeypatch.setattr(job.Job, "_hand_back", lingering)
    s = serve(model, piece_bytes=64 << 10)
    try:
        async def go():
            p = pool(tmp_path / "cache", lanes=2)
            await p.acquire(s.request(0, 3, 6))
            return p.connections.idle_count()

        assert asyncio.run(go()) == 2
    finally:
        s.close()


def test_pipelined_ranges_arrive_whole_over_one_connection(tmp_path: Path) -> None:
    """With `ahead` set, the next range's request goes out before this range's body is read (the server has it
    while the client is still reading), and every body still reaches its own range intact: a response never
    swallows the start of the next one."""
    path = tmp_path / "model.gguf"
    data = bytes(range(256)) * 4096 * 2  # 2 MiB
    path.write_bytes(data)
    src = HttpSource(path)
    try:
        ranges = [(0, 40_000), (40_000, 40_001), (50_000, 700_000), (700_000, 700_100), (1_000_000, 2_097_152)]
        c = RangeClient(Target(src.url()), read_bytes=16 << 10)
        todo = list(ranges[1:])
        c.ahead = lambda: todo.pop(0) if todo else None
        seen_second = threading.Event()

        def first_sink(out: bytearray):
            def sink(chunk: memoryview) -> None:
                if not out:  # the first chunk of the first body: the second request is at the server already
                    with src.seen:
                        seen_second.set() if src.seen.wait_for(lambda: len(src.requests) >= 2, 5) else None
                out.extend(chunk)
            return sink

        got = []
        for k, (a, b) in enumerate(ranges):
            out = bytearray()
            c.read_range(a, b, first_sink(out) if k == 0 else out.extend)
            got.append(bytes(out))
        assert seen_second.is_set(), src.requests
        assert got == [data[a:b] for a, b in ranges]
        assert c.connections_opened == 1 and c.reusable
        assert [r for _, r in src.requests] == [f"bytes={a}-{b - 1}" for a, b in ranges]
        c.close()
    finally:
        src.close()


def test_a_range_other_than_the_pipelined_one_goes_on_a_fresh_connection(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    data = bytes(range(256)) * 4096
    path.write_bytes(data)
    src = HttpSource(path)
    try:
        c = RangeClient(Target(src.url()))
        c.ahead = lambda: (10, 20)
        out = bytearray()
        c.read_range(0, 10, out.extend)
        c.ahead = None
        assert not c.reusable  # an answer is still on its way: nobody else may take this connection
        out2 = bytearray()
        c.read_range(100, 200, out2.extend)  # not what was asked ahead: that answer is never taken for this one
        assert bytes(out) == data[:10] and bytes(out2) == data[100:200]
        assert c.connections_opened == 2
        c.close()
    finally:
        src.close()


def test_spans_shrink_toward_the_end_and_cover_every_piece_once(model: Path) -> None:
    s = serve(model, piece_bytes=16 << 10)
    try:
        m = s.manifest
        pieces = list(range(len(m.pieces)))
        q = SpanQueue(m, pieces, lanes=4)
        got = []
        while (span := q.take()) is not None:
            got.append(span)
        assert [i for _, _, members in got for i in members] == pieces
        for start, end, members in got:
            assert start == m.pieces[members[0]].offset and end == m.pieces[members[-1]].end
            assert end - start <= MAX_SPAN
        sizes = [end - start for start, end, _ in got]
        assert len(got) > len(spans(m, pieces))  # cut finer than the coalesced spans
        assert sizes[0] >= 2 * max(sizes[-4:])  # large first, small last
        assert max(sizes[-4:]) <= MIN_SPAN + max(p.length for p in m.pieces)
    finally:
        s.close()


def test_a_failed_warm_connection_is_the_waiting_lanes_failure(tmp_path: Path) -> None:
    """Lanes waiting for connections `warm` is opening get its failure, not a second connect timeout of their own."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    target = Target(f"http://127.0.0.1:{port}/m.gguf")

    class SlowRefused(RangeClient):  # a connect that takes a while to fail (a host far away, or gone)
        def connect(self) -> None:
            time.sleep(0.3)
            super().connect()

    conns = Connections(SlowRefused)
    conns.warm(target, 2)
    t0 = time.monotonic()
    with pytest.raises(fetcher.FetchError) as e:
        conns.take(target)
    assert e.value.reason == fetcher.UNREACHABLE and time.monotonic() - t0 < 5
    assert conns.idle_count() == 0


def test_the_manifest_comes_gzipped_to_a_client_that_asks_and_verifies_the_same(model: Path) -> None:
    """Fewer bytes for the first request of a fresh connection (its slow start): the fetcher asks for gzip and
    hands on the manifest's own bytes; a client that does not ask gets them as they are."""
    import gzip
    import http.client

    from swactor.common import control_tls

    from .served import ORCH, SECRET

    s = serve(model, piece_bytes=16 << 10)
    try:
        raw = s.manifest.encode()
        ctx = control_tls.model_client_context(SECRET, 5)
        target = Target(s.url + "/manifest", ctx, control_tls.orchestrator_name(ORCH))
        c = RangeClient(target)
        assert c.get(1 << 24) == raw and c.reusable
        c.close()
        for accept, encoding in (("gzip", "gzip"), ("identity", None)):
            conn = http.client.HTTPSConnection("127.0.0.1", s.server.port, context=ctx)
            conn._context.check_hostname = False  # the test dials by address
            conn.request("GET", f"/v1/files/{s.manifest.file_sha256}/manifest", headers={"Accept-Encoding": accept})
            resp = conn.getresponse()
            body = resp.read()
            assert resp.getheader("Content-Encoding") == encoding
            assert (gzip.decompress(body) if encoding else body) == raw
            conn.close()
    finally:
        s.close()
