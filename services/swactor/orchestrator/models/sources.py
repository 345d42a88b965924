"""Where the orchestrator gets a model's GGUF: a local path on its host, or an http(s) URL.

`read_header()` reads just the header (from the file, or by Range from the URL) so the model can
be judged before anything else happens. `materialise()` brings a URL source into the
orchestrator's model cache with the same range fetcher the stage hosts use: resumable (a `.part`
file and a record of the bytes it holds, as a contiguous prefix), checked against the configured
SHA-256 when there is one, and renamed to `<sha256>.gguf` when complete. Blocking I/O: run these on
a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swactor.common.reasons import NamedReason
from swactor.distribution import fetcher
from swactor.modelfile.header import GgufHeader, read_header

RECORD_EVERY_BYTES = 64 << 20


class SourceError(NamedReason):
    """The source cannot be read; `reason` is stable (fetcher reasons, NotFound, ChecksumMismatch, ...)."""


@dataclass(frozen=True)
class ModelSource:
    name: str
    location: str
    # Expected SHA-256 of the file (lowercase hex), or "" (then the file's own hash is its identity).
    sha256: str = ""

    @property
    def is_url(self) -> bool:
        return self.location.startswith(("http://", "https://"))

    @property
    def path(self) -> Path:
        return Path(self.location)

    @classmethod
    def parse(cls, name: str, text: str) -> ModelSource:
        """`SOURCE` or `SOURCE sha256=HEX` (SOURCE: an absolute path, which may hold spaces, or an http(s) URL)."""
        location, sha = text.strip(), ""
        head, sep, last = location.rpartition(" ")
        if sep and last.startswith("sha256="):
            value = last.removeprefix("sha256=")
            if len(value) != 64 or any(c not in "0123456789abcdef" for c in value.lower()):
                raise ValueError(f"model {name!r}: {last!r} is not 'sha256=<64 hex digits>'")
            location, sha = head.rstrip(), value.lower()
        if not location:
            raise ValueError(f"model {name!r}: empty source")
        src = cls(name, location, sha)
        if not src.is_url and not src.path.is_absolute():
            raise ValueError(f"model {name!r}: source {location!r} is neither an absolute path nor an http(s) URL")
        return src

    def describe(self) -> str:
        return self.location + (f" sha256={self.sha256}" if self.sha256 else "")

    # ---- reading ----

    def client(self, **kw: float) -> fetcher.RangeClient:
        return fetcher.RangeClient(fetcher.Target(self.location), **kw)

    def read_header(self, stall_timeout_s: float = 30.0) -> tuple[GgufHeader, int]:
        """(header, file size), without reading any tensor byte."""
        if not self.is_url:
            try:
                size = self.path.stat().st_size
                with open(self.path, "rb") as f:
                    return read_header(lambda n: (f.seek(0), f.read(n))[1])[0], size
            except FileNotFoundError:
                raise SourceError("NotFound", f"model file {self.path} does not exist") from None
            except OSError as e:
                raise SourceError("Unreadable", f"model file {self.path}: {e.strerror or e}") from None
        client = self.client(stall_timeout_s=stall_timeout_s)
        try:
            size = client.size()

            def prefix(n: int) -> bytes:
                out = bytearray()
                client.read_range(0, min(n, size), out.extend)
                return bytes(out)

            return read_header(prefix)[0], size
        except fetcher.FetchError as e:
            raise SourceError(e.reason, e.detail) from None
        finally:
            client.close()

    # ---- materialising a URL source ----

    def materialise(self, cache_dir: Path, progress: Callable[[int, int], None] | None = None,
                    stall_timeout_s: float = 30.0) -> Path:
        """The complete local copy of a URL source (fetched, or resumed, as needed)."""
        cache_dir.mkdir(parents=True, exist_ok=True)
        key = hashlib.sha256(self.location.encode()).hexdigest()[:16]
        record_path = cache_dir / f"{key}.source.json"
        done = self._known_copy(cache_dir, record_path)
        if done is not None:
            return done
        part = cache_dir / f"{key}.gguf.part"
        client = self.client(stall_timeout_s=stall_timeout_s)
        try:
            size = client.size()
            held = self._resume_point(record_path, part, size)
            fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o640)
            try:
                os.ftruncate(fd, held)
                self._fetch_rest(client, fd, held, size, record_path, progress)
            finally:
                os.close(fd)
        except fetcher.FetchError as e:
            raise SourceError(e.reason, e.detail) from None
        except OSError as e:
            raise SourceError("CacheIo", f"{part}: {e.strerror or e}") from None
        finally:
            client.close()
        sha = _file_sha256(part)
        if self.sha256 and sha != self.sha256:
            for p in (part, record_path):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            raise SourceError("ChecksumMismatch", f"{self.location}: sha256 {sha} != configured {self.sha256}; "
                                                  "the download was discarded")
        final = cache_dir / f"{sha}.gguf"
        os.replace(part, final)
        _write_json(record_path, {"url": self.location, "size": size, "sha256": sha, "complete": True})
        return final

    def _known_copy(self, cache_dir: Path, record_path: Path) -> Path | None:
        try:
            rec = json.loads(record_path.read_text())
        except (OSError, ValueError):
            return None
        if rec.get("url") != self.location or not rec.get("complete"):
            return None
        final = cache_dir / f"{rec.get('sha256')}.gguf"
        if self.sha256 and rec.get("sha256") != self.sha256:
            return None
        if final.exists() and final.stat().st_size == rec.get("size"):
            return final
        return None

    def _resume_point(self, record_path: Path, part: Path, size: int) -> int:
        try:
            rec = json.loads(record_path.read_text())
            if rec.get("url") == self.location and rec.get("size") == size and part.exists():
                return min(int(rec.get("held", 0)), part.stat().st_size)
        except (OSError, ValueError):
            pass
        return 0

    def _fetch_rest(self, client: fetcher.RangeClient, fd: int, held: int, size: int, record_path: Path,
                    progress: Callable[[int, int], None] | None) -> None:
        pos, last = held, held
        last_t = time.monotonic()

        def sink(chunk: memoryview) -> None:
            nonlocal pos, last, last_t
            n = 0
            while n < len(chunk):
                n += os.pwrite(fd, chunk[n:], pos + n)
            pos += n
            if pos - last >= RECORD_EVERY_BYTES or time.monotonic() - last_t >= 1.0:
                os.fdatasync(fd)  # the record never claims bytes that are not on disk
                _write_json(record_path, {"url": self.location, "size": size, "held": pos})
                last, last_t = pos, time.monotonic()
                if progress is not None:
                    progress(pos, size)

        try:
            if pos < size:
                client.read_range(pos, size, sink)
        finally:
            os.fdatasync(fd)
            _write_json(record_path, {"url": self.location, "size": size, "held": pos})
        if progress is not None:
            progress(pos, size)


def _write_json(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        while n := f.readinto(buf):
            h.update(memoryview(buf)[:n])
    return h.hexdigest()
