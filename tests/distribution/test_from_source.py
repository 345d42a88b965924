"""A stage host fetching its ranges straight from the model's own URL (FetchRequest.source_url): the
manifest from the model server, every piece from the source, verified; the model server when the
source fails (docs/distribution.md "Straight from the source")."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from swactor.distribution import fetcher
from swactor.modelfile import support
from tests.fixtures.http_source import HttpSource
from tests.fixtures.synth_gguf import Shape, write_gguf

from .served import Served, pool, serve

SHAPE = Shape(layers=6, dim=512, ffn=1024, vocab=2048)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return write_gguf(tmp_path / "src" / "m.gguf", SHAPE)


@pytest.fixture
def served(model: Path) -> Iterator[Served]:
    s = serve(model, piece_bytes=64 << 10)
    yield s
    s.close()


def stage_pieces(s: Served, start: int, end: int, layers: int) -> list[int]:
    names = support.stage_tensors(support.ARCHITECTURES["llama"], set(s.manifest.tensors), start, end, layers)
    return s.manifest.pieces_for(names)


def stage_bytes(s: Served, start: int, end: int, layers: int = SHAPE.layers) -> int:
    return sum(s.manifest.pieces[i].length for i in stage_pieces(s, start, end, layers))


class Ranges:
    """A client factory recording every byte range its clients asked for (over all their requests)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int]] = []

    def __call__(self, target: fetcher.Target) -> fetcher.RangeClient:
        asked = self.asked

        class Recording(fetcher.RangeClient):
            def read_range(self, start: int, end: int, sink: Callable[[memoryview], None]) -> None:
                asked.append((self.target.url, start, end))
                super().read_range(start, end, sink)

        return Recording(target)

    def overlaps(self) -> list[tuple[int, int, int, int]]:
        spans = sorted((a, b) for _, a, b in self.asked)
        return [(*x, *y) for x, y in itertools.pairwise(spans) if y[0] < x[1]]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fallbacks(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e.get("event") == "weights_source_fallback"]


def test_every_piece_comes_from_the_source_and_none_from_the_model_server(model: Path, served: Served,
                                                                         tmp_path: Path) -> None:
    src = HttpSource(model)
    try:
        async def go():
            p = pool(tmp_path / "cache")
            return await p.acquire(served.request(2, 4, 6, src.url()))

        with capture_logs() as logs:
            lease = asyncio.run(go())
        want = stage_bytes(served, 2, 4)
        assert lease.bytes_fetched == want
        assert served.served_bytes() == 0  # the model server gave the manifest only
        deadline = time.monotonic() + 10  # the server counts a range after its last byte left: the client may be first
        while src.bytes_sent < want and time.monotonic() < deadline:
            time.sleep(0.01)
        assert want <= src.bytes_sent < want + (1 << 20)  # gaps read through: padding only
        assert all(r is not None for path, r in src.requests) and {path for path, _ in src.requests} == {"/model.gguf"}
        assert not fallbacks(logs)
        # A middle stage's tensors are its blocks, needed whatever the header says: one job with the header's pieces.
        assert [e["origin"] for e in logs if e.get("event") == "weights_fetch_started"] == ["source"]
        data, cached = model.read_bytes(), Path(lease.path).read_bytes()
        for i in stage_pieces(served, 2, 4, 6):
            piece = served.manifest.pieces[i]
            assert cached[piece.offset:piece.end] == data[piece.offset:piece.end], i
    finally:
        src.close()


def test_an_unreachable_source_falls_back_to_the_model_server_once(model: Path, served: Served, tmp_path: Path) -> None:
    source_url = f"http://127.0.0.1:{closed_port()}/m.gguf"

    async def go():
        p = pool(tmp_path / "cache")
        return await p.acquire(served.request(0, 3, 6, source_url))

    with capture_logs() as logs:
        lease = asyncio.run(go())
    want = stage_bytes(served, 0, 3)
    assert lease.bytes_fetched == want and served.served_bytes() == want
    [event] = fallbacks(logs)  # the header's fetch fell back; the stage's tensors went to the server directly
    assert event["reason"] == fetcher.UNREACHABLE and event["source"] == source_url and event["server"] == served.url
    assert source_url.rsplit("/", 1)[0] in event["detail"]


def test_after_the_fallback_a_model_server_failure_faults_the_stage_by_name(served: Served, tmp_path: Path) -> None:
    """Once: the source is unreachable, the model server then fails its ranges too: the stage's fault is the
    server's (NotFound here), not a loop between the two, and the fallback was logged once."""
    from swactor.distribution.stagefetch import FetchFailed

    class ServerGone(fetcher.RangeClient):
        def read_range(self, start: int, end: int, sink: Callable[[memoryview], None]) -> None:
            if self.target.url == served.url:
                raise fetcher.FetchError(fetcher.NOT_FOUND, f"{self.url}: 404 Not Found")
            super().read_range(start, end, sink)

    async def go():
        p = pool(tmp_path / "cache", client_factory=ServerGone)
        return await p.acquire(served.request(0, 3, 6, f"http://127.0.0.1:{closed_port()}/m.gguf"))

    with capture_logs() as logs, pytest.raises(FetchFailed) as e:
        asyncio.run(go())
    assert e.value.reason == fetcher.NOT_FOUND and served.url in e.value.detail
    assert [f["reason"] for f in fallbacks(logs)] == [fetcher.UNREACHABLE]


def test_a_source_whose_bytes_differ_is_not_trusted_the_rest_comes_from_the_model_server(
        model: Path, served: Served, tmp_path: Path) -> None:
    """The origin changed the file (one byte of blk.2.attn_q): that piece fails its hash, is punched out, and the
    pieces not yet verified come from the orchestrator's copy, which is the verified one."""
    changed = tmp_path / "changed.gguf"
    shutil.copyfile(model, changed)
    first, _ = served.manifest.tensors["blk.2.attn_q.weight"]
    bad = served.manifest.pieces[first]
    with open(changed, "r+b") as f:
        f.seek(bad.offset + 7)
        byte = f.read(1)
        f.seek(bad.offset + 7)
        f.write(bytes([byte[0] ^ 0xFF]))
    src = HttpSource(changed)
    try:
        ranges = Ranges()

        async def go():
            p = pool(tmp_path / "cache", client_factory=ranges)
            return await p.acquire(served.request(2, 4, 6, src.url()))

        with capture_logs() as logs:
            lease = asyncio.run(go())
        want = stage_bytes(served, 2, 4)
        [event] = fallbacks(logs)
        assert event["reason"] == "ChecksumMismatch" and "blk.2.attn_q.weight" in event["detail"]
        assert "differ from the manifest" in event["why"]
        assert 0 < served.served_bytes() <= want  # the rest, the bad piece among it, from the model server
        assert any(url == served.url and a <= bad.offset < b for url, a, b in ranges.asked)
        data, cached = model.read_bytes(), Path(lease.path).read_bytes()
        for i in stage_pieces(served, 2, 4, 6):
            piece = served.manifest.pieces[i]
            assert cached[piece.offset:piece.end] == data[piece.offset:piece.end], i
    finally:
        src.close()


@pytest.mark.slow
def test_three_hosts_fetch_their_stages_of_a_1gib_model_from_the_source_at_once(tmp_path: Path) -> None:
    """Three stage hosts (three pools, three cache dirs) fetch a sparse 1.09 GiB llama-shaped model from one
    plain HTTP source at the same time: each gets its stage's pieces verified, none asks for a byte twice, and the
    model server sends none."""
    shape = Shape(layers=9, dim=4096, ffn=11008, vocab=32000, heads=32, kv_heads=32)
    (tmp_path / "src").mkdir()
    big = write_gguf(tmp_path / "src" / "big.gguf", shape, qtype="Q4_0", tied=False, sparse=True)
    assert big.stat().st_size >= 1 << 30 and big.stat().st_blocks * 512 < 16 << 20  # sparse: header only on disk
    t0 = time.monotonic()
    s = serve(big)
    src = HttpSource(big)
    try:
        ranges = [Ranges() for _ in range(3)]
        pools = [pool(tmp_path / f"host{k}", client_factory=ranges[k]) for k in range(3)]
        reqs = [s.request(3 * k, 3 * k + 3, 9, src.url()) for k in range(3)]

        async def go():
            return await asyncio.gather(*(p.acquire(r) for p, r in zip(pools, reqs, strict=True)))

        t1 = time.monotonic()
        with capture_logs() as logs:
            leases = asyncio.run(go())
        t2 = time.monotonic()
        assert not fallbacks(logs) and s.served_bytes() == 0
        for k, (p, lease, rec) in enumerate(zip(pools, leases, ranges, strict=True)):
            mine = stage_pieces(s, 3 * k, 3 * k + 3, 9)
            assert lease.bytes_fetched == lease.bytes_total == stage_bytes(s, 3 * k, 3 * k + 3, 9)
            assert p.cache.entries[s.manifest.file_sha256].verified >= set(mine)
            assert not rec.overlaps(), (k, rec.overlaps()[:3])  # no byte asked for twice by one host
            assert p.received_bytes < lease.bytes_fetched + (4 << 20)  # padding read through only
        print(f"\n1 host set-up (manifest of {s.manifest.size / 2**30:.2f} GiB) {t1 - t0:.1f} s; three hosts "
              f"{sum(lease.bytes_fetched for lease in leases) / 1e9:.2f} GB at once in {t2 - t1:.1f} s")
    finally:
        src.close()
        s.close()
        for k in range(3):  # 1.2 GB of written zeros: not left for pytest's kept temporary directories
            shutil.rmtree(tmp_path / f"host{k}", ignore_errors=True)
