"""A stage host fetching its ranges: only its tensors, verified, resumable, shared, bounded."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from swactor.distribution import fetcher
from swactor.distribution.request import FetchProgress, FetchStarted
from tests.fixtures.synth_gguf import Shape, write_gguf

from .served import pool, serve

SHAPE = Shape(layers=6, dim=512, ffn=1024, vocab=2048)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return write_gguf(tmp_path / "src" / "m.gguf", SHAPE)


def run(coro):
    return asyncio.run(coro)


def stage_bytes(served, start: int, end: int) -> int:
    from swactor.modelfile import support

    names = support.stage_tensors(support.ARCHITECTURES["llama"], set(served.manifest.tensors), start, end, SHAPE.layers)
    return sum(served.manifest.pieces[i].length for i in served.manifest.pieces_for(names))


def test_a_stage_fetches_exactly_its_ranges_and_the_loader_maps_them(model: Path, tmp_path: Path) -> None:
    s = serve(model, piece_bytes=64 << 10)
    try:
        started: list[FetchStarted] = []
        progress: list[FetchProgress] = []

        async def go():
            p = pool(tmp_path / "cache", progress_interval_s=0.0)
            return await p.acquire(s.request(2, 4, 6), started.append, progress.append)

        lease = run(go())
        want = stage_bytes(s, 2, 4)
        assert lease.bytes_total == want and lease.bytes_fetched == want
        assert started == [FetchStarted(want, 0)]
        assert progress[-1].bytes_done == want and progress[-1].eta_s == 0.0
        assert s.served_bytes() == want  # the header, then blk.2 and blk.3: nothing else crossed
        st = os.stat(lease.path)
        assert st.st_size == s.manifest.size and st.st_blocks * 512 < want + (1 << 20)  # sparse
        original, cached = GGUFReader(model), GGUFReader(lease.path)
        orig = {t.name: t for t in original.tensors}
        for t in cached.tensors:
            if t.name.startswith(("blk.2.", "blk.3.")):
                assert np.asarray(t.data).tobytes() == np.asarray(orig[t.name].data).tobytes(), t.name
            elif t.name == "token_embd.weight":
                assert not np.asarray(t.data).any()  # a hole: never fetched
    finally:
        s.close()


class Counting:
    """A client factory counting the bytes every client received (what crossed into this host)."""

    def __init__(self, inner: Callable[[fetcher.Target], fetcher.RangeClient] | None = None) -> None:
        self.inner = inner or (lambda t: fetcher.RangeClient(t))
        self.clients: list[fetcher.RangeClient] = []

    def __call__(self, target: fetcher.Target) -> fetcher.RangeClient:
        c = self.inner(target)
        self.clients.append(c)
        return c

    @property
    def received(self) -> int:
        return sum(c.bytes_received for c in self.clients)


class Gate:
    """A client factory whose fetches pause after `after` bytes until released or aborted (a link
    cut mid-fetch, or one slow enough for a second run to arrive)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.reached = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.total = 0  # over every connection of the fetch

    def __call__(self, target: fetcher.Target) -> fetcher.RangeClient:
        gate = self

        class Gated(fetcher.RangeClient):
            def read_range(self, start: int, end: int, sink: Callable[[memoryview], None]) -> None:
                def held(chunk: memoryview) -> None:
                    sink(chunk)
                    with gate.lock:
                        gate.total += len(chunk)
                    if gate.total >= gate.after and not gate.release.is_set():
                        gate.reached.set()
                        while not (gate.release.wait(0.05) or self._aborted.is_set()):
                            pass
                        self._check_aborted()
                super().read_range(start, end, held)

        return Gated(target, read_bytes=16 << 10)


def test_an_interrupted_fetch_resumes_from_what_was_verified(model: Path, tmp_path: Path) -> None:
    s = serve(model, piece_bytes=64 << 10)
    try:
        want = stage_bytes(s, 0, 3)
        gate = Gate(want // 2)
        first_host, second_host = Counting(gate), Counting()

        async def interrupted():
            p = pool(tmp_path / "cache", client_factory=first_host)
            task = asyncio.create_task(p.acquire(s.request(0, 3, 6)))
            assert await asyncio.to_thread(gate.reached.wait, 30)
            jobs = list(p.cache.entries[s.manifest.file_sha256].jobs)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for j in jobs:  # "the process is gone": its fetch thread is out before the next one starts
                await asyncio.to_thread(j.thread.join, 30)

        run(interrupted())
        first = gate.total  # every byte that reached the first host's writers
        assert want // 2 <= first < want

        async def resumed():  # a new process: the record is re-checked from disk, not trusted blindly
            return await pool(tmp_path / "cache", client_factory=second_host).acquire(s.request(0, 3, 6))

        lease = run(resumed())
        refetched = first + second_host.received - want
        assert second_host.received == lease.bytes_fetched
        assert 0 <= refetched <= 0.05 * want, (refetched, want)
    finally:
        s.close()


def test_two_runs_needing_the_same_ranges_share_one_fetch(model: Path, tmp_path: Path) -> None:
    s = serve(model, piece_bytes=64 << 10)
    try:
        want = stage_bytes(s, 3, 6)
        gate = Gate(want // 3)

        async def both():
            p = pool(tmp_path / "cache", client_factory=gate)
            a = asyncio.create_task(p.acquire(s.request(3, 6, 6)))
            assert await asyncio.to_thread(gate.reached.wait, 30)
            b = asyncio.create_task(p.acquire(s.request(3, 6, 6)))
            entry = p.cache.entries[s.manifest.file_sha256]
            async with asyncio.timeout(30):  # until b waits on a's fetch
                while not any(j.waiters == 2 for j in entry.jobs):
                    await asyncio.sleep(0.01)
            gate.release.set()
            return await asyncio.gather(a, b)

        la, lb = run(both())
        assert s.served_bytes() == want  # one fetch served both
        assert la.bytes_fetched == want and lb.bytes_fetched == 0
    finally:
        s.close()


def test_a_cache_file_removed_or_cut_under_a_live_pool_is_named_then_refetched_once_distrusted(
        model: Path, tmp_path: Path) -> None:
    """The pool trusts what it verified; a file taken from under it is CacheIo by name (not a crash), and once
    the node distrusts it (worker/weights.py does, after a cache or load failure) the next fetch re-checks
    the copy and fetches again exactly what is gone or bad."""
    from swactor.distribution.stagefetch import FetchFailed

    s = serve(model, piece_bytes=64 << 10)
    try:
        async def go():
            p = pool(tmp_path / "cache", progress_interval_s=0.0)
            req = s.request(2, 4, 6)
            lease = await p.acquire(req)
            p.release(lease)
            os.unlink(lease.path)
            with pytest.raises(FetchFailed) as info:
                await p.acquire(req)
            p.cache.distrust(req.sha256)
            again = await p.acquire(req)  # the whole stage again: nothing was left
            p.release(again)
            os.truncate(again.path, os.path.getsize(again.path) // 2)
            p.cache.distrust(req.sha256)
            cut = await p.acquire(req)  # only what the cut took
            return info.value, lease, again, cut

        failed, first, again, cut = run(go())
        assert failed.reason == "CacheIo" and "No such file" in failed.detail
        assert again.bytes_fetched == first.bytes_fetched == stage_bytes(s, 2, 4)
        assert 0 < cut.bytes_fetched < first.bytes_fetched
        original, cached = GGUFReader(model), GGUFReader(cut.path)
        for name in ("blk.2.attn_q.weight", "blk.3.ffn_down.weight"):
            a, b = (next(t for t in r.tensors if t.name == name) for r in (original, cached))
            assert bytes(a.data.tobytes()) == bytes(b.data.tobytes()), name
    finally:
        s.close()


def test_the_pool_counts_every_byte_it_received_once(model: Path, tmp_path: Path) -> None:
    s = serve(model, piece_bytes=64 << 10)
    try:
        async def go():
            p = pool(tmp_path / "cache")
            assert p.received_bytes == 0
            first = await p.acquire(s.request(2, 4, 6))
            after_first = p.received_bytes
            again = await p.acquire(s.request(2, 4, 6))  # all cached: nothing more crosses
            return first, again, after_first, p.received_bytes

        first, again, after_first, after_again = run(go())
        assert after_first == first.bytes_fetched > 0
        assert again.bytes_fetched == 0 and after_again == after_first
    finally:
        s.close()


def test_a_warm_acquire_does_not_parse_the_header_again(model: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's stage pieces need the file's architecture: parsed from its header once per cache entry (a large
    vocabulary takes a tenth of a second of the stage's provisioning). That a warm acquire still looks for the file is
    the removed-file case above (its second acquire is a warm one)."""
    from swactor.distribution import stagefetch

    s = serve(model, piece_bytes=64 << 10)
    try:
        async def go():
            p = pool(tmp_path / "cache", progress_interval_s=0.0)
            req = s.request(2, 4, 6)
            first = await p.acquire(req)
            p.release(first)

            def parse_again(prefix: bytes) -> None:
                raise AssertionError("the header was parsed again")

            monkeypatch.setattr(stagefetch, "parse_header", parse_again)
            warm = await p.acquire(req)
            p.release(warm)
            return first, warm

        first, warm = run(go())
        assert warm.bytes_fetched == 0 and warm.bytes_total == first.bytes_total
    finally:
        s.close()
