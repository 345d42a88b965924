"""The range fetcher against a real HTTP server that behaves, and one that does not."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.distribution import fetcher
from swactor.distribution.fetcher import FetchError, RangeClient, Target
from tests.fixtures.http_source import HttpSource


@pytest.fixture
def source(tmp_path: Path) -> Iterator[HttpSource]:
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    src = HttpSource(path)
    yield src
    src.close()


def collect(client: RangeClient, start: int, end: int) -> bytes:
    out = bytearray()
    client.read_range(start, end, out.extend)
    return bytes(out)


def test_ranges_and_size_over_one_connection(source: HttpSource) -> None:
    data = source.path.read_bytes()
    c = RangeClient(Target(source.url()))
    assert c.size() == len(data)
    assert collect(c, 1000, 300_000) == data[1000:300_000]
    assert collect(c, len(data) - 5, len(data)) == data[-5:]
    c.close()


def test_redirects_are_followed_and_remembered(source: HttpSource) -> None:
    source.mode = "redirect"
    c = RangeClient(Target(source.url()))
    assert collect(c, 0, 10) == source.path.read_bytes()[:10]
    assert c.url.endswith("/real/model.gguf")
    c.close()


@pytest.mark.parametrize(("mode", "reason", "words"), [
    ("404", fetcher.NOT_FOUND, "404"),
    ("416", fetcher.RANGE_NOT_SATISFIABLE, "the file is 1048576 bytes"),
    ("ignore_range", fetcher.RANGE_IGNORED, "ignored Range"),
    ("truncate", fetcher.TRUNCATED, "bytes short"),
])
def test_misbehaving_servers_are_named(source: HttpSource, mode: str, reason: str, words: str) -> None:
    source.mode = mode
    c = RangeClient(Target(source.url()))
    with pytest.raises(FetchError) as e:
        collect(c, 100, 500_000)
    assert e.value.reason == reason and words in e.value.detail and source.url() in e.value.detail


def test_unreachable_and_stalled(source: HttpSource) -> None:
    port = source.server_address[1]
    source.close()
    with pytest.raises(FetchError) as e:
        collect(RangeClient(Target(f"http://127.0.0.1:{port}/m.gguf"), connect_timeout_s=2), 0, 10)
    assert e.value.reason == fetcher.UNREACHABLE and "refused" in e.value.detail.lower()


def test_a_stalled_link_times_out_and_abort_cancels(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.write_bytes(b"x" * 100_000)
    src = HttpSource(path)
    src.mode = "stall"
    try:
        with pytest.raises(FetchError) as e:
            collect(RangeClient(Target(src.url()), stall_timeout_s=0.5), 0, 1000)
        assert e.value.reason == fetcher.STALLED and "0.5 s" in e.value.detail
        c = RangeClient(Target(src.url()), stall_timeout_s=30)
        errors: list[FetchError] = []

        def run() -> None:
            try:
                collect(c, 0, 1000)
            except FetchError as err:
                errors.append(err)

        t = threading.Thread(target=run)
        t.start()
        src.wait_requests(2)
        c.abort()
        t.join(5)
        assert not t.is_alive() and errors and errors[0].reason == fetcher.CANCELLED
    finally:
        src.close()


def test_small_whole_resource(source: HttpSource) -> None:
    c = RangeClient(Target(source.url()))
    assert hashlib.sha256(c.get(2 << 20)).hexdigest() == hashlib.sha256(source.path.read_bytes()).hexdigest()
    with pytest.raises(FetchError, match="more than"):
        RangeClient(Target(source.url())).get(1000)
