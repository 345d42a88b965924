"""The one HTTP range fetcher: stage hosts use it against the orchestrator's model server, the
orchestrator against an external http(s) source. Blocking I/O, meant for a worker thread (never an
event loop): one keep-alive HTTP/1.1 connection per `RangeClient`, redirects followed, every
response checked (a Range answered 200, a 416, a body cut short, a stalled link) and turned into a
`FetchError` with a stable reason and a detail naming the URL.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from swactor.common.reasons import NamedReason

MAX_REDIRECTS = 5
READ_BYTES = 1 << 20
MIN_READ = 16 << 10
FAST_READ_S, SLOW_READ_S = 0.02, 0.2
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_UNSATISFIED = re.compile(r"^bytes \*/(\d+)$")

# FetchError.reason values (stable; they end up as "WeightsFetch.<reason>" on a stage fault).
UNREACHABLE, TLS_FAILED, NOT_FOUND, HTTP_STATUS, RANGE_IGNORED, RANGE_NOT_SATISFIABLE = (
    "Unreachable", "TlsFailed", "NotFound", "HttpStatus", "RangeIgnored", "RangeNotSatisfiable")
TRUNCATED, STALLED, CANCELLED, SIZE_CHANGED, PROTOCOL = "Truncated", "Stalled", "Cancelled", "SizeChanged", "Protocol"


class FetchError(NamedReason):
    """One HTTP(S) transfer failed; `reason` is one of the names above."""


@dataclass(frozen=True)
class Target:
    url: str
    # None = the default trust store (external https); the model server passes its mTLS context.
    ssl_context: ssl.SSLContext | None = None
    # TLS name to check instead of the URL's host (the model server is dialled by address).
    server_hostname: str | None = None


class _Https(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, *, timeout: float, context: ssl.SSLContext, sni: str) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._sni = sni

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._sni)  # type: ignore[attr-defined]


class RangeClient:
    """Byte ranges of one resource. `abort()` (any thread) cancels a request in progress."""

    def __init__(self, target: Target, *, connect_timeout_s: float = 10.0, stall_timeout_s: float = 30.0,
                 read_bytes: int = READ_BYTES) -> None:
        self.target = target
        self.url = target.url
        self.connect_timeout_s = connect_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._conn_url = ""
        self._aborted = threading.Event()
        self._buf = bytearray(read_bytes)
        self.total_size: int | None = None
        self.bytes_received = 0

    # ---- connection ----

    def _connection(self, url: str) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if self._conn is not None and self._conn_url == origin:
            return self._conn
        self.close()
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchError(PROTOCOL, f"{url!r} is not an http(s) URL")
        if parts.scheme == "https":
            ctx = self.target.ssl_context or ssl.create_default_context()
            sni = self.target.server_hostname or parts.hostname
            conn: http.client.HTTPConnection = _Https(parts.hostname, parts.port, timeout=self.connect_timeout_s,
                                                      context=ctx, sni=sni)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.connect_timeout_s)
        try:
            conn.connect()
        except ssl.SSLError as e:
            conn.close()
            raise FetchError(TLS_FAILED, f"TLS handshake with {origin} failed: {e.reason or e}") from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise FetchError(UNREACHABLE, f"cannot connect to {origin}: {_os_detail(e)}") from None
        if conn.sock is not None:
            conn.sock.settimeout(self.stall_timeout_s)
        self._conn, self._conn_url = conn, origin
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._conn_url = None, ""

    def abort(self) -> None:
        self._aborted.set()
        conn = self._conn
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # ---- requests ----

    def _request(self, headers: dict[str, str]) -> http.client.HTTPResponse:
        """GET self.url (following redirects), retrying once on a connection the server closed."""
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            resp = self._send(url, headers)
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                self._drain(resp)
                if not location:
                    raise FetchError(PROTOCOL, f"{url}: redirect {resp.status} without a Location")
                url = urllib.parse.urljoin(url, location)
                self.url = url  # later ranges go to where the source lives now
                continue
            return resp
        raise FetchError(PROTOCOL, f"{self.target.url}: more than {MAX_REDIRECTS} redirects")

    def _send(self, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        parts = urllib.parse.urlsplit(url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        for attempt in (0, 1):
            self._check_aborted()
            conn = self._connection(url)
            try:
                conn.request("GET", path, headers={"Accept-Encoding": "identity", **headers})
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()  # a kept-alive connection the server dropped: one fresh try
                if attempt:
                    raise FetchError(UNREACHABLE, f"{url}: connection lost: {_os_detail(e)}") from None
            except TimeoutError:
                self.close()
                raise FetchError(STALLED, f"{url}: no response for {self.stall_timeout_s:g} s") from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                self._check_aborted()
                raise FetchError(UNREACHABLE, f"{url}: {_os_detail(e)}") from None
        raise AssertionError("unreachable")

    def _check_aborted(self) -> None:
        if self._aborted.is_set():
            self.close()
            raise FetchError(CANCELLED, f"{self.url}: cancelled")

    def _status_error(self, resp: http.client.HTTPResponse, what: str) -> FetchError:
        try:
            body = resp.read(512).decode(errors="replace").strip().splitlines()
        except (OSError, http.client.HTTPException):
            body = []
        self.close()
        hint = f" ({body[0][:200]})" if body else ""
        if resp.status == 404:
            return FetchError(NOT_FOUND, f"{self.url}: 404 Not Found{hint}")
        if resp.status == 416:
            m = _UNSATISFIED.match(resp.getheader("Content-Range") or "")
            size = f"; the file is {m.group(1)} bytes" if m else ""
            return FetchError(RANGE_NOT_SATISFIABLE, f"{self.url}: 416 for {what}{size}")
        return FetchError(HTTP_STATUS, f"{self.url}: HTTP {resp.status} {resp.reason} for {what}{hint}")

    def size(self) -> int:
        """The resource's size, from the Content-Range of a one-byte range."""
        resp = self._request({"Range": "bytes=0-0"})
        if resp.status == 200:
            resp.close()
            self.close()
            raise FetchError(RANGE_IGNORED, f"{self.url}: the server ignored a Range request (answered 200); "
                                            "only servers that honour Range are supported")
        if resp.status != 206:
            raise self._status_error(resp, "bytes=0-0")
        m = _CONTENT_RANGE.match(resp.getheader("Content-Range") or "")
        self._drain(resp)
        if not m or m.group(3) == "*":
            raise FetchError(PROTOCOL, f"{self.url}: 206 without a usable Content-Range")
        self.total_size = int(m.group(3))
        return self.total_size

    def _drain(self, resp: http.client.HTTPResponse, limit: int | None = None) -> bytes:
        """The body (at most `limit` bytes); a stall or a broken connection closes it and says which."""
        try:
            return resp.read(limit)
        except TimeoutError:
            self.close()
            raise FetchError(STALLED, f"{self.url}: no byte for {self.stall_timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise FetchError(TRUNCATED, f"{self.url}: {_os_detail(e)}") from None

    def read_range(self, start: int, end: int, sink: Callable[[memoryview], None]) -> None:
        """Bytes [start, end) to `sink`, in order, in chunks; a short 206 is continued."""
        pos = start
        while pos < end:
            what = f"bytes={pos}-{end - 1}"
            resp = self._request({"Range": what})
            if resp.status == 200:
                resp.close()
                self.close()
                raise FetchError(RANGE_IGNORED, f"{self.url}: the server ignored Range {what} (answered 200 with "
                                                f"the whole body); only servers that honour Range are supported")
            if resp.status != 206:
                raise self._status_error(resp, what)
            m = _CONTENT_RANGE.match(resp.getheader("Content-Range") or "")
            if not m or int(m.group(1)) != pos or int(m.group(2)) >= end or int(m.group(2)) < pos:
                self.close()
                raise FetchError(PROTOCOL, f"{self.url}: asked {what}, got Content-Range "
                                           f"{resp.getheader('Content-Range')!r}")
            if m.group(3) != "*":
                total = int(m.group(3))
                if self.total_size is not None and total != self.total_size:
                    self.close()
                    raise FetchError(SIZE_CHANGED, f"{self.url}: the file is now {total} bytes, was {self.total_size}")
                self.total_size = total
            pos = self._body(resp, pos, int(m.group(2)) + 1, sink)

    def _body(self, resp: http.client.HTTPResponse, pos: int, stop: int, sink: Callable[[memoryview], None]) -> int:
        """The body to `sink`. A read fills its buffer before it returns, so the size adapts: large on
        a fast link (fewer calls), small on a slow one (the sink, and so progress, hears often)."""
        view = memoryview(self._buf)
        want = min(len(view), MIN_READ)
        while pos < stop:
            self._check_aborted()
            t0 = time.monotonic()
            try:
                n = resp.readinto(view[:min(want, stop - pos)])
            except http.client.IncompleteRead:
                n = 0
            except TimeoutError:
                self.close()
                raise FetchError(STALLED, f"{self.url}: no byte for {self.stall_timeout_s:g} s at offset {pos}") from None
            except (OSError, ssl.SSLError) as e:
                self.close()
                self._check_aborted()
                raise FetchError(TRUNCATED, f"{self.url}: the body broke off at offset {pos}: {_os_detail(e)}") from None
            if not n:
                self.close()
                self._check_aborted()
                raise FetchError(TRUNCATED, f"{self.url}: the body ended at offset {pos}, {stop - pos} bytes short")
            sink(view[:n])
            pos += n
            self.bytes_received += n
            took = time.monotonic() - t0
            if took < FAST_READ_S:
                want = min(len(view), want * 2)
            elif took > SLOW_READ_S:
                want = max(MIN_READ, want // 2)
        return pos

    def get(self, limit: int) -> bytes:
        """A small whole resource (the manifest), at most `limit` bytes."""
        resp = self._request({})
        if resp.status != 200:
            raise self._status_error(resp, "GET")
        length = resp.getheader("Content-Length")
        if length is not None and int(length) > limit:
            self.close()
            raise FetchError(PROTOCOL, f"{self.url}: {length} bytes is more than {limit}")
        data = self._drain(resp, limit + 1)
        if length is not None and len(data) != int(length):
            self.close()
            raise FetchError(TRUNCATED, f"{self.url}: got {len(data)} of {length} bytes")
        return data


def _os_detail(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
