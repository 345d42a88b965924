"""The local link: edges whose two ends are on this host, carried inside the driver process.

A send edge whose consumer node is this driver's own node (the orchestrator's token edge to stage 0
on its host, two stages of one run on two GPUs of one host) needs no QUIC to itself: no TLS, no
packets on loopback UDP, no congestion control between two rings of one arena. `LocalLink` gives
the edge table what a QUIC connection gives it, as two `StreamPort` ends of one in-process
connection: `sender` (the send pumps' connection) and `receiver` (where their streams arrive).
Both name this node as their peer, so the rendezvous takes the streams as from the planned producer.

What the cores rely on from QUIC holds here too (tests/edge/memlink.py is the same model for the
core tests):

* stream ids are numbered as a client's uni-streams (2, 6, 10, ...), and always go sender → receiver;
* bytes are delivered only up to the receiver's credit (its MAX_STREAM_DATA: `initial_window` for a
  stream no edge has claimed yet, then what the recv pump `grant`s);
* `queued()` is what the sender handed over and the receiver has not been given yet, so the send
  pump's `queue_limit` bounds what the link holds per stream; a delivery is its acknowledgement
  (`on_progress` to the sender);
* FIN comes after the last byte; STOP_SENDING is answered by RESET_STREAM with the same code, and a
  reset drops what was not delivered.

Nothing is delivered synchronously: the table must not be re-entered while it runs an input. Data
calls only queue; `transmit()` (which the driver calls after every input), `grant`, `stop_stream`
and `reset_stream` schedule one coalesced delivery pass on the loop. A pass hands each stream's
queued bytes within credit to the listener (the driver), acknowledges them, then delivers stop and
reset, each as a fresh input; if those inputs queued more that can move, it schedules the next pass.
Each byte is copied once on the way (the send pump's ring span into a bytes object, as aioquic's
stream buffer does), plus the part of a chunk a short credit cuts off.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from swactor.edge.streamport import StreamPort, new_uid


class LinkListener(Protocol):
    """What the link tells the driver: the events a QUIC connection's would, on the link's ends."""

    def on_stream_data(self, conn: StreamPort, stream_id: int, data: bytes, end: bool) -> None: ...

    def on_stream_reset(self, conn: StreamPort, stream_id: int, error_code: int) -> None: ...

    def on_stop_sending(self, conn: StreamPort, stream_id: int, error_code: int) -> None: ...

    def on_progress(self, conn: StreamPort) -> None: ...

    def on_connection_lost(self, conn: StreamPort, reason: str, not_authorized: bool) -> None: ...


@dataclass(eq=False)
class _Stream:
    stream_id: int
    max_data: int  # the receiver's credit: the highest stream offset it may be given
    chunks: deque[bytes] = field(default_factory=deque)  # queued by the sender, not yet delivered
    head: int = 0  # bytes of chunks[0] delivered already (a short credit split it)
    queued: int = 0  # undelivered bytes: what the send pump counts against its queue limit
    delivered: int = 0  # stream offset handed to the receiver
    fin: bool = False
    stop_code: int | None = None  # STOP_SENDING not yet delivered to the sender
    reset_code: int | None = None  # RESET_STREAM not yet delivered to the receiver

    def movable(self) -> bool:
        """A pass would deliver something now."""
        return (self.stop_code is not None or self.reset_code is not None
                or (bool(self.chunks) and self.delivered < self.max_data) or (self.fin and not self.chunks))


class LocalEnd:
    """One end of the local link, as the table and pumps see a connection."""

    def __init__(self, link: LocalLink, node_id: int) -> None:
        self.uid = new_uid()
        self.closed = False
        self._link = link
        self._node_id = node_id

    @property
    def peer_node_id(self) -> int | None:
        return self._node_id

    def open_stream(self, first: bytes) -> int:
        return self._link.open_stream(first)

    def send(self, stream_id: int, data: bytes | memoryview, end: bool = False) -> None:
        self._link.send(stream_id, data, end)

    def queued(self, stream_id: int) -> int:
        return self._link.queued(stream_id)

    def reset_stream(self, stream_id: int, code: int) -> None:
        self._link.reset_stream(stream_id, code)

    def credit(self, stream_id: int) -> tuple[int, int]:
        return self._link.credit(stream_id)

    def grant(self, stream_id: int, limit: int) -> bool:
        return self._link.grant(stream_id, limit)

    def stop_stream(self, stream_id: int, code: int) -> None:
        self._link.stop_stream(stream_id, code)

    def transmit(self) -> None:
        self._link.schedule()


class LocalLink:
    def __init__(self, *, node_id: int, listener: LinkListener, initial_window: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.listener = listener
        self.initial_window = initial_window
        self.loop = loop
        self.sender = LocalEnd(self, node_id)
        self.receiver = LocalEnd(self, node_id)
        self.closed = False
        # What the link carried since the driver started (its bytes are never QUIC `traffic`).
        self.streams_opened = 0
        self.delivered_bytes = 0  # preambles included
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(2, 4)
        # Stops for streams already finished, answered with a reset so the receiving table forgets
        # the stream (it keeps a stopped stream's entry until its reset comes).
        self._late_resets: list[tuple[int, int]] = []
        self._pass: asyncio.Handle | None = None

    # ---- the sender's side ----

    def open_stream(self, first: bytes) -> int:
        sid = next(self._ids)
        if not self.closed:
            s = self._streams[sid] = _Stream(sid, self.initial_window)
            self._queue(s, bytes(first))
            self.streams_opened += 1
        return sid

    def send(self, stream_id: int, data: bytes | memoryview, end: bool = False) -> None:
        s = self._streams.get(stream_id)
        if s is None or s.reset_code is not None:
            return  # reset or finished: QUIC drops what is written after, so do we
        if data:
            self._queue(s, bytes(data))  # the caller releases its ring span when this returns
        s.fin = s.fin or end

    def queued(self, stream_id: int) -> int:
        s = self._streams.get(stream_id)
        return 0 if s is None else s.queued

    def reset_stream(self, stream_id: int, code: int) -> None:
        s = self._streams.get(stream_id)
        if s is None or s.reset_code is not None:
            return  # as aioquic: the first reset (or the answer to a stop) wins
        s.reset_code = code
        self._drop(s)
        self.schedule()

    # ---- the receiver's side ----

    def credit(self, stream_id: int) -> tuple[int, int]:
        s = self._streams.get(stream_id)
        return (0, 0) if s is None or s.reset_code is not None else (s.max_data, s.delivered)

    def grant(self, stream_id: int, limit: int) -> bool:
        s = self._streams.get(stream_id)
        if s is None or limit <= s.max_data:
            return False
        s.max_data = limit
        if s.chunks:
            # The credit's receiver may be the end a pass is delivering to: the driver does not
            # transmit that end afterwards, so the waiting bytes must not depend on it.
            self.schedule()
        return True

    def stop_stream(self, stream_id: int, code: int) -> None:
        if self.closed:
            return
        s = self._streams.get(stream_id)
        if s is None:
            self._late_resets.append((stream_id, code))
        elif s.stop_code is None and s.reset_code is None:
            s.stop_code = code
        self.schedule()

    # ---- delivery ----

    def schedule(self) -> None:
        """Deliver what can move in a pass of its own on the loop (one pending at a time)."""
        if self._pass is None and not self.closed:
            self._pass = self.loop.call_soon(self._run_pass)

    def _run_pass(self) -> None:
        self._pass = None
        listener = self.listener
        delivered = False
        for s in list(self._streams.values()):
            if self.closed:
                return
            if s.stop_code is None and s.reset_code is None:
                delivered = self._deliver(s) or delivered
        if delivered and not self.closed:
            listener.on_progress(self.sender)
        for s in list(self._streams.values()):
            if self.closed:
                return
            if s.stop_code is not None:
                code, s.stop_code = s.stop_code, None
                if s.reset_code is None:  # QUIC answers STOP_SENDING with RESET_STREAM
                    s.reset_code = code
                    self._drop(s)
                listener.on_stop_sending(self.sender, s.stream_id, code)
            if s.reset_code is not None and self._streams.get(s.stream_id) is s:
                del self._streams[s.stream_id]
                listener.on_stream_reset(self.receiver, s.stream_id, s.reset_code)
        late, self._late_resets = self._late_resets, []
        for stream_id, code in late:
            if self.closed:
                return
            listener.on_stream_reset(self.receiver, stream_id, code)
        if self._late_resets or any(s.movable() for s in self._streams.values()):
            self.schedule()  # the inputs of this pass queued more (the driver skips the end in progress)

    def _deliver(self, s: _Stream) -> bool:
        """Hand the receiver the stream's queued bytes within its credit, and FIN after the last."""
        moved = False
        while not self.closed and s.stop_code is None and s.reset_code is None:
            room = s.max_data - s.delivered
            if s.chunks and room > 0:
                chunk, start = s.chunks[0], s.head
                n = min(len(chunk) - start, room)
                if start + n == len(chunk):
                    s.chunks.popleft()
                    s.head = 0
                else:
                    s.head = start + n
                data = chunk if start == 0 and n == len(chunk) else chunk[start:start + n]
                s.delivered += n
                s.queued -= n
                self.delivered_bytes += n
            elif s.fin and not s.chunks:
                data = b""
            else:
                return moved
            end = s.fin and not s.chunks
            if end:
                del self._streams[s.stream_id]  # FIN delivered: nothing more to say on it
            self.listener.on_stream_data(self.receiver, s.stream_id, data, end)
            moved = True
            if end:
                return moved
        return moved

    def _queue(self, s: _Stream, data: bytes) -> None:
        s.chunks.append(data)
        s.queued += len(data)

    @staticmethod
    def _drop(s: _Stream) -> None:
        s.chunks.clear()
        s.head = s.queued = 0
        s.fin = False

    def close(self, reason: str) -> None:
        """The driver stops: both ends are lost to the table, as a QUIC connection's would be."""
        if self.closed:
            return
        self.closed = True
        if self._pass is not None:
            self._pass.cancel()
            self._pass = None
        self._streams.clear()
        self._late_resets.clear()
        for end in (self.sender, self.receiver):
            end.closed = True
        for end in (self.sender, self.receiver):
            self.listener.on_connection_lost(end, reason, False)
