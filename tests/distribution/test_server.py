"""The model server: Range over mutual TLS for members, a failed handshake for everyone else."""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.common import control_tls
from swactor.distribution import fetcher
from swactor.distribution.fetcher import FetchError, RangeClient, Target
from swactor.distribution.server import FileTable, ServedFile, parse_range, start_server

SECRET = b"s" * 32
ORCH = 7


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, bytes, FileTable]]:
    data = bytes(range(256)) * 8192  # 2 MiB
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    files = FileTable()
    files.add(ServedFile(sha, path, len(data), b'{"m":1}'))
    server, _thread = start_server("127.0.0.1:0", files, control_tls.model_server_context(SECRET, ORCH))
    yield f"https://127.0.0.1:{server.port}/v1/files/{sha}", data, files
    server.shutdown()
    server.server_close()


def member(url: str, secret: bytes = SECRET, **kw) -> RangeClient:
    ctx = control_tls.model_client_context(secret, 3)
    return RangeClient(Target(url, ctx, control_tls.orchestrator_name(ORCH)), **kw)


def test_a_member_gets_ranges_and_the_manifest(served) -> None:
    url, data, files = served
    c = member(url)
    assert c.size() == len(data)
    out = bytearray()
    c.read_range(5, 1_500_000, out.extend)
    assert bytes(out) == data[5:1_500_000]
    assert member(url + "/manifest").get(1000) == b'{"m":1}'
    assert files.bytes_served[url.rsplit("/", 1)[1]] >= len(out)


def test_range_edges_and_unknown_files(served) -> None:
    url, data, _ = served
    with pytest.raises(FetchError) as e:
        member(url).read_range(len(data), len(data) + 10, lambda b: None)
    assert e.value.reason == fetcher.RANGE_NOT_SATISFIABLE and str(len(data)) in e.value.detail
    with pytest.raises(FetchError) as e:
        member(url[:-64] + "0" * 64).size()
    assert e.value.reason == fetcher.NOT_FOUND
    assert parse_range("bytes=-10", 100) == (90, 100)
    assert parse_range("bytes=10-", 100) == (10, 100)
    assert parse_range("bytes=0-1,5-6", 100) is None
    assert parse_range("bytes=100-", 100) is None


def test_non_members_fail_the_handshake(served) -> None:
    url, _, _ = served
    with pytest.raises(FetchError) as e:
        member(url, secret=b"another secret of 32 bytes......").size()
    assert e.value.reason == fetcher.TLS_FAILED
    anonymous = ssl.create_default_context()
    anonymous.check_hostname = False
    anonymous.verify_mode = ssl.CERT_NONE
    with pytest.raises(FetchError) as e:
        RangeClient(Target(url, anonymous)).size()
    assert e.value.reason in (fetcher.TLS_FAILED, fetcher.UNREACHABLE, fetcher.TRUNCATED)
