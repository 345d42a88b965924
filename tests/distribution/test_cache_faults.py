"""Bad input on the stage side: a corrupted range, a full disk, a full cache, a wrong manifest,
an unreachable server. Each fails with its reason, leaves nothing unverified readable in the
cache, and the next fetch works."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.distribution.stagefetch import FetchFailed
from tests.fixtures.synth_gguf import Shape, write_gguf

from .served import pool, serve

SHAPE = Shape(layers=4, dim=512, ffn=1024, vocab=2048)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return write_gguf(tmp_path / "src" / "m.gguf", SHAPE)


def recorded(cache_dir: Path, sha: str) -> set[int]:
    held: set[int] = set()
    for line in (cache_dir / f"{sha}.ranges").read_text().splitlines()[1:]:
        rec = json.loads(line)
        held |= set(rec.get("add", []))
        held -= set(rec.get("drop", []))
    return held


def test_a_corrupted_range_names_the_tensor_and_is_dropped(model: Path, tmp_path: Path) -> None:
    s = serve(model, piece_bytes=64 << 10)
    try:
        m = s.manifest
        first, _ = m.tensors["blk.1.ffn_up.weight"]
        bad = m.pieces[first]
        original = model.read_bytes()
        st = model.stat()
        with open(model, "r+b") as f:  # bit rot on the orchestrator: same size, same mtime
            f.seek(bad.offset + 10)
            f.write(bytes([original[bad.offset + 10] ^ 0xFF]))
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
        cache = tmp_path / "cache"
        with pytest.raises(FetchFailed) as e:
            asyncio.run(pool(cache).acquire(s.request(0, 2, 4)))
        assert e.value.reason == "ChecksumMismatch" and "'blk.1.ffn_up.weight'" in e.value.detail
        assert first not in recorded(cache, m.file_sha256)
        with open(cache / f"{m.file_sha256}.gguf", "rb") as f:
            f.seek(bad.offset)
            assert f.read(bad.length) == bytes(bad.length)  # punched out: nothing corrupt is left
        model.write_bytes(original)
        lease = asyncio.run(pool(cache).acquire(s.request(0, 2, 4)))
        with open(lease.path, "rb") as f:
            f.seek(bad.offset)
            assert f.read(bad.length) == original[bad.offset:bad.end]
    finally:
        s.close()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    d = tmp_path / "tiny"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_full_disk_is_named_and_keeps_only_verified_pieces(model: Path, small_tmpfs: Path) -> None:
    s = serve(model, piece_bytes=64 << 10)
    try:
        with pytest.raises(FetchFailed) as e:
            asyncio.run(pool(small_tmpfs).acquire(s.request(0, 4, 4)))
        assert e.value.reason == "DiskFull" and str(small_tmpfs) in e.value.detail
        m = s.manifest
        held = recorded(small_tmpfs, m.file_sha256)
        with open(small_tmpfs / f"{m.file_sha256}.gguf", "rb") as f:
            for i, p in enumerate(m.pieces):  # every byte held is a verified piece's
                f.seek(p.offset)
                data = f.read(p.length)
                assert (i in held) or data == bytes(p.length), i
        used = os.statvfs(small_tmpfs)
        assert used.f_bfree * used.f_frsize < 256 << 10 or held
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
        lease = asyncio.run(pool(small_tmpfs).acquire(s.request(0, 4, 4)))
        assert lease.bytes_fetched > 0
    finally:
        s.close()


def test_the_cache_limit_evicts_unused_files_and_refuses_when_all_are_in_use(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sa = serve(write_gguf(tmp_path / "a" / "m.gguf", SHAPE, seed=1))
    sb = serve(write_gguf(tmp_path / "b" / "m.gguf", SHAPE, seed=2))
    try:
        size = sa.manifest.size
        cache = tmp_path / "cache"

        async def go():
            p = pool(cache, limit=int(size * 1.5))
            la = await p.acquire(sa.request(0, 4, 4))
            with pytest.raises(FetchFailed) as e:  # a is in use: b does not fit beside it
                await p.acquire(sb.request(0, 4, 4))
            assert e.value.reason == "CacheFull" and "in use" in e.value.detail
            p.release(la)
            lb = await p.acquire(sb.request(0, 4, 4))  # a is idle now: evicted
            assert sa.manifest.file_sha256 not in p.cache.entries
            assert not (cache / f"{sa.manifest.file_sha256}.gguf").exists()
            p.release(lb)

        asyncio.run(go())
    finally:
        sa.close()
        sb.close()


def test_a_wrong_manifest_and_an_unreachable_server(model: Path, tmp_path: Path) -> None:
    s = serve(model)
    req = s.request(0, 4, 4)
    bad = req.__class__(**{**req.__dict__, "manifest_sha256": "0" * 64})
    with pytest.raises(FetchFailed) as e:
        asyncio.run(pool(tmp_path / "c").acquire(bad))
    assert e.value.reason == "ManifestMismatch"
    s.close()
    with contextlib.suppress(Exception):
        s.server.socket.close()
    with pytest.raises(FetchFailed) as e:
        asyncio.run(pool(tmp_path / "c").acquire(req))
    assert e.value.reason == "Unreachable" and "manifest" in e.value.detail
