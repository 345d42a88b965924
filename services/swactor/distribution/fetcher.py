"""The one HTTP range fetcher: stage hosts use it against the orchestrator's model server, the
orchestrator against an external http(s) source. Blocking I/O, meant for a worker thread (never an
event loop): one keep-alive HTTP/1.1 connection per `RangeClient`, redirects followed, every
response checked (a Range answered 200, a 416, a body cut short, a stalled link) and turned into a
`FetchError` with a stable reason and a detail naming the URL. A client whose last response was read
to its end can be pointed at another resource of the same origin (`retarget`) and keeps its
connection: connections.py hands such clients from one request to the next (the manifest, the
header, the stage's spans) so that a fetch pays the TCP and TLS handshakes and slow start once.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import re
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def origin_key(target: Target) -> tuple[object, ...]:
    """What a connection made for `target` can serve: the same scheme, host and port, TLS context and TLS name."""
    parts = urllib.parse.urlsplit(target.url)
    return (parts.scheme, parts.netloc.lower(), target.ssl_context, target.server_hostname)


class _SocketFile:
    """A response's file that reads from the socket only what it is asked for. http.client's own (makefile("rb"))
    buffers, and could swallow the start of the next response, which is on its way already when its request was
    pipelined (RangeClient.ahead); each response here leaves the next one's bytes in the socket. Reads fill what
    they are given (as a buffered file's do), but for a header line, read a byte at a time."""

    def __init__(self, raw: io.RawIOBase) -> None:
        self._raw = raw  # socket.SocketIO: holds the socket open until closed, as makefile's buffered file does

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        got = 0
        while got < len(view):
            n = self._raw.readinto(view[got:])
            if not n:
                break
            got += n
        return got

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            out = bytearray()
            while chunk := self.read(1 << 16):
                out += chunk
            return bytes(out)
        buf = bytearray(n)
        return bytes(buf[:self.readinto(buf)])

    def read1(self, n: int = -1) -> bytes:
        buf = bytearray(n if n >= 0 else 1 << 16)
        got = self._raw.readinto(buf)
        return bytes(buf[:got or 0])

    def readline(self, limit: int = -1) -> bytes:
        out, one = bytearray(), bytearray(1)
        while (limit < 0 or len(out) < limit) and self._raw.readinto(one):
            out += one
            if one[0] == 0x0A:
                break
        return bytes(out)

    def close(self) -> None:
        self._raw.close()

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._raw.fileno()


class _Sock:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def makefile(self, mode: str, *args: object, **kw: object) -> _SocketFile:
        return _SocketFile(self._sock.makefile(mode, buffering=0))  # type: ignore[arg-type]


class _Response(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, *args: Any, **kw: Any) -> None:
        super().__init__(_Sock(sock), *args, **kw)  # type: ignore[arg-type]


class _Http(http.client.HTTPConnection):
    response_class = _Response


class _Https(http.client.HTTPSConnection):
    response_class = _Response

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
        self._resp: http.client.HTTPResponse | None = None  # the last response (reusable once read to its end)
        # Pipelining: with `ahead` set, once a range's response is known whole (a 206 for all of it, the connection
        # kept), `ahead()` names the next range, (start, end) or None, and its request goes out before this body is
        # read: the server starts on it the moment this one ends, no round trip idle in between. The next
        # read_range must be for that range (`_asked`: start, end, URL).
        self.ahead: Callable[[], tuple[int, int] | None] | None = None
        self._asked: tuple[int, int, str] | None = None
        self._aborted = threading.Event()
        self.connections_opened = 0  # TCP (+ TLS) connections this client made
        self._buf = bytearray(read_bytes)
        self.total_size: int | None = None
        self.bytes_received = 0

    # ---- connection ----

    def _connection(self, url: str) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(url)
        origin = _origin(url)
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
            conn = _Http(parts.hostname, parts.port, timeout=self.connect_timeout_s)
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
        self.connections_opened += 1
        return conn

    def connect(self) -> None:
        """Make the connection (TCP, TLS) now rather than at the first request: a lane opened ahead of its work."""
        self._check_aborted()
        self._connection(self.url)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._conn_url, self._resp, self._asked = None, "", None, None

    @property
    def reusable(self) -> bool:
        """Connected, not aborted, and nothing left unread of the last response: the next request can go now."""
        return (self._conn is not None and not self._aborted.is_set() and self._asked is None
                and (self._resp is None or self._resp.isclosed()))

    def retarget(self, target: Target) -> None:
        """Ask for `target` from now on, keeping the connection when `target` has the same origin (origin_key)."""
        if target == self.target:
            return  # the same resource: where it redirected to, and its size, still hold
        if origin_key(target) != origin_key(self.target):
            self.close()
        self.target, self.url, self.total_size = target, target.url, None

    def abort(self) -> None:
        self._aborted.set()
        conn = self._conn
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # ---- requests ----

    def _request(self, headers: dict[str, str], asked: bool = False) -> http.client.HTTPResponse:
        """GET self.url (following redirects), retrying once on a connection the server closed. `asked`: the
        request went out already (pipelined): its response is the next on the connection."""
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            resp = self._send(url, headers, asked)
            asked = False
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

    def _send(self, url: str, headers: dict[str, str], asked: bool = False) -> http.client.HTTPResponse:
        path = _path(url)
        for attempt in (0, 1):
            self._check_aborted()
            kept = self._conn is not None and self._conn_url == _origin(url)
            conn = self._connection(url)
            try:
                if not (asked and kept and not attempt):
                    conn.request("GET", path, headers={"Accept-Encoding": "identity", **headers})
                self._resp = conn.getresponse()
                return self._resp
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
                if kept and not attempt:
                    continue  # whatever broke a connection kept from an earlier request: one fresh try
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

    def _ask_ahead(self) -> None:
        """The next range's request, pipelined behind the response being read (see `ahead`)."""
        nxt = self.ahead() if self.ahead is not None else None
        if nxt is None or self._conn is None:
            return
        start, end = nxt
        self._asked = (start, end, self.url)
        try:
            self._conn.request("GET", _path(self.url), headers={"Accept-Encoding": "identity",
                                                                "Range": f"bytes={start}-{end - 1}"})
        except (OSError, http.client.HTTPException):
            # The connection broke while this body is still to be read: that read says how; the next range then
            # goes on a fresh connection (an unanswered request is never taken for another's answer).
            self._asked = (start, end, "")

    def _was_asked(self, start: int, end: int) -> bool:
        """Whether [start, end)'s request went out already (pipelined) on this connection."""
        asked, self._asked = self._asked, None
        if asked is None:
            return False
        if asked != (start, end, self.url) or self._resp is None or not self._resp.isclosed():
            self.close()  # an answer to another request is on its way: the connection is of no more use
            return False
        return True

    def read_range(self, start: int, end: int, sink: Callable[[memoryview], None]) -> None:
        """Bytes [start, end) to `sink`, in order, in chunks; a short 206 is continued. With `ahead` set, the next
        range's request goes out as soon as this one's response is known whole."""
        pos = start
        asked = self._was_asked(start, end)
        while pos < end:
            what = f"bytes={pos}-{end - 1}"
            resp = self._request({"Range": what}, asked)
            asked = False
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
            stop = int(m.group(2)) + 1
            if stop == end and not resp.will_close:
                self._ask_ahead()
            pos = self._body(resp, pos, stop, sink)

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
        """A small whole resource (the manifest), at most `limit` bytes. Asked for gzip too: a manifest's hex
        digests come in half as many bytes, so in fewer round trips of a new connection's slow start."""
        resp = self._request({"Accept-Encoding": "gzip, identity"})
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
        encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding == "gzip":
            return self._gunzip(data, limit)
        if encoding != "identity":
            raise FetchError(PROTOCOL, f"{self.url}: Content-Encoding {encoding!r} was not asked for")
        return data

    def _gunzip(self, data: bytes, limit: int) -> bytes:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = d.decompress(data, limit + 1)
        except zlib.error as e:
            raise FetchError(PROTOCOL, f"{self.url}: the gzip body does not decompress: {e}") from None
        if len(out) > limit:
            raise FetchError(PROTOCOL, f"{self.url}: more than {limit} bytes once decompressed")
        if not d.eof:
            raise FetchError(TRUNCATED, f"{self.url}: the gzip body is cut short")
        if d.unused_data:
            raise FetchError(PROTOCOL, f"{self.url}: bytes follow the gzip body")
        return out


def _path(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + ("?" + parts.query if parts.query else "")


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _os_detail(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
