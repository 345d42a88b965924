"""The orchestrator's model server: the GGUF files it holds, over HTTPS with mutual TLS.

`GET|HEAD /v1/files/<sha256>` serves a file with single-range `Range` support (206 / 416);
`GET /v1/files/<sha256>/manifest` its manifest (gzip when the client accepts it; docs/distribution.md).
The TLS context requires a client certificate from the control CA
(swactor.common.control_tls.model_server_context), so only holders of the cluster secret get past the
handshake. Threads, not the event loop: each connection has its own thread (the handshake happens
there too, never in the accept loop), and the bytes go out through ssl's sendall, which releases the
GIL. A connection stays open between requests (keep-alive, pipelined requests answered in order)
until it is idle for IDLE_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import re
import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from swactor.common.events import get_logger

SEND_BYTES = 1 << 20
HANDSHAKE_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 120.0
_PATH = re.compile(r"^/v1/files/([0-9a-f]{64})(/manifest)?$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class ServedFile:
    sha256: str
    path: Path
    size: int
    manifest: bytes


class FileTable:
    """sha256 -> ServedFile; swapped whole under a lock (the handlers read it from their threads)."""

    def __init__(self) -> None:
        self._files: dict[str, ServedFile] = {}
        self._lock = threading.Lock()
        self.bytes_served: dict[str, int] = {}

    def add(self, f: ServedFile) -> None:
        with self._lock:
            self._files = {**self._files, f.sha256: f}

    def replace_path(self, f: ServedFile) -> None:
        """Serve `f`, dropping any older version of the same path (its bytes are no longer what it named)."""
        with self._lock:
            self._files = {**{k: v for k, v in self._files.items() if v.path != f.path}, f.sha256: f}

    def remove(self, sha256: str) -> None:
        with self._lock:
            self._files = {k: v for k, v in self._files.items() if k != sha256}

    def get(self, sha256: str) -> ServedFile | None:
        return self._files.get(sha256)

    def count(self, sha256: str, n: int) -> None:
        with self._lock:
            self.bytes_served[sha256] = self.bytes_served.get(sha256, 0) + n


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, end) of a single `bytes=` range; None if it cannot be satisfied (416)."""
    m = _RANGE.match(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):  # suffix: the last n bytes
        n = int(m.group(2))
        return (max(0, size - n), size) if n > 0 and size > 0 else None
    start = int(m.group(1))
    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    return (start, end) if start < size and start < end else None


@functools.lru_cache(maxsize=16)
def _gzipped(manifest: bytes) -> bytes:
    """A manifest as gzip (its hex digests take half the bytes: fewer round trips of a fresh connection's slow
    start), made once per manifest (the bytes are the key; their hash is computed once per object)."""
    return gzip.compress(manifest, 6, mtime=0)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ModelServer

    def log_message(self, format: str, *args: object) -> None:  # access lines go to structlog, not stderr
        return

    def _plain(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        m = _PATH.match(self.path)
        f = self.server.files.get(m.group(1)) if m else None
        if f is None:
            self._plain(404, f"no such file here: {self.path}")
            return
        if m is not None and m.group(2):
            if "gzip" in (self.headers.get("Accept-Encoding") or "").lower():
                self._bytes(_gzipped(f.manifest), "application/json", "gzip")
            else:
                self._bytes(f.manifest, "application/json")
            return
        try:
            fd = os.open(f.path, os.O_RDONLY)
        except OSError as e:
            self._plain(503, f"the file is not readable on the orchestrator: {e.strerror}")
            return
        try:
            size = os.fstat(fd).st_size
            if size != f.size:
                self._plain(503, f"the file changed on the orchestrator ({size} bytes, served as {f.size})")
                return
            self._file(fd, f)
        finally:
            os.close(fd)

    def _bytes(self, data: bytes, ctype: str, encoding: str = "") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _file(self, fd: int, f: ServedFile) -> None:
        header = self.headers.get("Range")
        if header is None:
            start, end, status = 0, f.size, 200
        else:
            rng = parse_range(header, f.size)
            if rng is None:
                self._plain(416, f"range {header!r} is not satisfiable (single ranges only)",
                            {"Content-Range": f"bytes */{f.size}"})
                return
            (start, end), status = rng, 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        self.wfile.flush()
        buf = bytearray(SEND_BYTES)
        view = memoryview(buf)
        pos = start
        try:
            while pos < end:
                n = os.preadv(fd, [view[:min(SEND_BYTES, end - pos)]], pos)
                if n <= 0:
                    self.close_connection = True  # the file shrank under us: the client sees a short body
                    return
                self.connection.sendall(view[:n])
                pos += n
        finally:
            self.server.files.count(f.sha256, pos - start)


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], files: FileTable, context: ssl.SSLContext) -> None:
        self.files = files
        self.context = context
        self.handshakes = 0  # TLS handshakes completed: connections that got as far as HTTP
        self._count_lock = threading.Lock()
        self.log = get_logger(component="model_server")
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (getfqdn), which can wait on DNS for seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def finish_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:  # type: ignore[override]
        """Runs on the connection's thread: the TLS handshake, then HTTP."""
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            self.log.info("model_server_handshake_refused", peer=client_address[0], detail=str(e))
            return
        with self._count_lock:
            self.handshakes += 1
        tls.settimeout(IDLE_TIMEOUT_S)
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.close()

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        with contextlib.suppress(OSError):
            request.close()

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        # A peer that goes away mid-body is routine (a stage stopped, a fetch cancelled).
        self.log.info("model_server_connection_ended", peer=client_address[0])

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def start_server(address: str, files: FileTable, context: ssl.SSLContext) -> tuple[ModelServer, threading.Thread]:
    """Bind `host:port` (port 0 = any) and serve on a thread; `server.shutdown()` stops it."""
    host, _, port = address.rpartition(":")
    server = ModelServer((host.strip("[]") or "0.0.0.0", int(port)), files, context)
    thread = threading.Thread(target=server.serve_forever, name="model-server", daemon=True)
    thread.start()
    return server, thread

