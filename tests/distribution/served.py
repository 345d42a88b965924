"""A model server with real files and a FetchPool pointed at it (mutual TLS, loopback)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from swactor.common import control_tls
from swactor.distribution.cache import WeightsCache
from swactor.distribution.fetcher import Target
from swactor.distribution.server import FileTable, ModelServer, ServedFile, start_server
from swactor.distribution.stagefetch import FetchPool, FetchRequest
from swactor.modelfile.header import read_header
from swactor.modelfile.manifest import Manifest, build_manifest

SECRET = b"k" * 32
ORCH = 11


@dataclass
class Served:
    path: Path
    manifest: Manifest
    server: ModelServer
    files: FileTable

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}/v1/files/{self.manifest.file_sha256}"

    def request(self, layer_start: int, layer_end: int, num_layers: int, source_url: str = "") -> FetchRequest:
        m = self.manifest
        return FetchRequest(self.url, m.file_sha256, m.size, m.digest(), layer_start, layer_end, num_layers,
                            source_url=source_url)

    def served_bytes(self) -> int:
        return self.files.bytes_served.get(self.manifest.file_sha256, 0)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(path: Path, piece_bytes: int | None = None) -> Served:
    with open(path, "rb") as f:
        header = read_header(lambda n: (f.seek(0), f.read(n))[1])[0]
    manifest = build_manifest(path, header, piece_bytes)
    files = FileTable()
    files.add(ServedFile(manifest.file_sha256, path, manifest.size, manifest.encode()))
    server, _ = start_server("127.0.0.1:0", files, control_tls.model_server_context(SECRET, ORCH))
    return Served(path, manifest, server, files)


def pool(cache_dir: Path, limit: int = 1 << 40, **kw) -> FetchPool:
    ctx = control_tls.model_client_context(SECRET, 5)
    name = control_tls.orchestrator_name(ORCH)
    return FetchPool(WeightsCache(cache_dir, limit), lambda url, tls_name: Target(url, ctx, tls_name or name), **kw)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
