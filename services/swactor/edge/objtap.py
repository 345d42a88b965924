"""Object timing tap (issue 7): when each object record passed a pump, never its payload.

The pumps stay byte-blind movers (§25): after moving a span they hand it to the tap, which
walks the §17 record boundaries (the 40-byte ObjectHeader, parsed by ring-rs; the `extent`
payload bytes after it are counted, never read) and stamps per object:

  first_us      first byte moved (send: read from the egress ring and handed to QUIC;
                recv: arrived from QUIC)
  last_us       last byte moved
  committed_us  recv only: the ring write that committed the last byte started (`commit`; the
                pump reads the clock before writing, because ring-rs wakes the consumer inside
                the write and a woken consumer may run before the pump reads the clock again)

Send side: a producer may commit a record's header and payload separately, so the peer can
see the first byte before the sender's last_us; only last_us -> the peer's last_us is transit.

Finished marks wait in `done` (bounded: beyond `limit` they are counted in `dropped`) until
the driver drains them on its flush timer; `on_done` is called when `done` turns non-empty.
A malformed header turns the tap off for the edge (`broken`); validation and faults stay with
the worker's parser, so the tap never raises into a pump. I/O-free: the caller passes `now_us`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import swactor_ring as sr

HEADER_LEN: int = sr.OBJECT_HEADER_LEN
DONE_LIMIT = 4096


@dataclass(slots=True)
class ObjectMark:
    object_id: int
    sequence: int
    extent: int
    first_us: int
    last_us: int = 0
    committed_us: int = 0


class ObjectTap:
    def __init__(self, *, commits: bool, on_done: Callable[[], None] | None = None, limit: int = DONE_LIMIT) -> None:
        self.commits = commits  # recv side: marks finish at `commit`, not at `feed`
        self.on_done = on_done
        self.limit = limit
        self.offset = 0  # stream bytes (after the preamble) fed so far
        self.done: list[ObjectMark] = []
        self.dropped = 0
        self.broken = ""
        self._header = bytearray()
        self._header_us = 0
        self._current: ObjectMark | None = None
        self._left = 0  # payload bytes of the current record still to come
        self._uncommitted: deque[tuple[int, ObjectMark]] = deque()  # (end offset, mark)

    def feed(self, span: bytes | memoryview, now_us: int) -> None:
        """`span` (the next stream bytes) moved at `now_us`."""
        n = len(span)
        if self._left > n and self._current is not None:  # all payload (bulk spans): count only
            self._left -= n
            self.offset += n
            return
        if self.broken or n == 0:
            return
        pos = 0
        while pos < n:
            if self._current is None:
                if not self._header:
                    self._header_us = now_us
                    if n - pos >= HEADER_LEN:  # the whole header in this span: parse it in place
                        header: bytes | memoryview | bytearray = span[pos:pos + HEADER_LEN]
                        pos += HEADER_LEN
                    else:
                        self._header += span[pos:]
                        pos = n
                        break
                else:
                    take = min(HEADER_LEN - len(self._header), n - pos)
                    self._header += span[pos:pos + take]
                    pos += take
                    if len(self._header) < HEADER_LEN:
                        break
                    header = self._header
                try:
                    h = sr.ObjectHeader.parse(header, 2**64 - 1, 1)
                except sr.ObjectError as e:
                    self.broken = f"object header at stream offset {self.offset + pos - HEADER_LEN}: {e}"
                    return
                finally:
                    self._header.clear()
                self._current = ObjectMark(h.object_id, h.sequence, h.extent, self._header_us)
                self._left = h.extent
            take = min(self._left, n - pos)
            pos += take
            self._left -= take
            if self._left == 0:
                mark, self._current = self._current, None
                mark.last_us = now_us
                if self.commits:
                    self._uncommitted.append((self.offset + pos, mark))
                else:
                    self._finish(mark)
        self.offset += n

    def commit(self, offset: int, now_us: int) -> None:
        """Stream bytes up to `offset` are committed into the ring at `now_us` (recv side)."""
        pending = self._uncommitted
        while pending and pending[0][0] <= offset:
            mark = pending.popleft()[1]
            mark.committed_us = now_us
            self._finish(mark)

    def _finish(self, mark: ObjectMark) -> None:
        if len(self.done) >= self.limit:
            self.dropped += 1
            return
        self.done.append(mark)
        if len(self.done) == 1 and self.on_done is not None:
            self.on_done()

    def drain(self) -> tuple[list[ObjectMark], int]:
        """The finished marks and the drop count since the last drain."""
        out, dropped = self.done, self.dropped
        self.done, self.dropped = [], 0
        return out, dropped
