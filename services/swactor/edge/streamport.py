"""What the pumps and the edge table need from a QUIC connection (spec §23-25), and the codes
two drivers exchange when they end a stream early.

`StreamPort` is the seam between the I/O-free cores (pumps, edge table) and aioquic: the shell's
`connection.EdgeConnection` implements it over one aioquic connection, `locallink.LocalEnd` in the
driver's process for edges whose two ends are on its host, the core tests in memory
(tests/edge/memlink.py). Data calls (`open_stream`, `send`, `grant`) only queue work in
the connection; whoever called the core transmits afterwards (the core says when: its inputs
return True). Control calls (`stop_stream`, `reset_stream`) schedule their own transmit.
"""

from __future__ import annotations

import enum
import itertools
from typing import Protocol

from swactor.v1 import common_pb2


class StreamPort(Protocol):
    uid: int  # unique per connection in this process: routing key of its streams
    closed: bool

    @property
    def peer_node_id(self) -> int | None: ...

    # ---- sending (send pump) ----
    def open_stream(self, first: bytes) -> int:
        """Open a uni-stream, queue `first` (the preamble) on it; its stream id."""
        ...

    def send(self, stream_id: int, data: bytes | memoryview, end: bool = False) -> None:
        """Queue a copy of `data` (and FIN with `end`) on the stream."""
        ...

    def queued(self, stream_id: int) -> int:
        """Bytes handed to the stream and not yet acknowledged by the peer."""
        ...

    def reset_stream(self, stream_id: int, code: int) -> None: ...

    # ---- receiving (recv pump) ----
    def credit(self, stream_id: int) -> tuple[int, int]:
        """(MAX_STREAM_DATA announced to the peer, highest offset received); (0, 0) when gone."""
        ...

    def grant(self, stream_id: int, limit: int) -> bool:
        """Raise the stream's MAX_STREAM_DATA to `limit`; True when it moved."""
        ...

    def stop_stream(self, stream_id: int, code: int) -> None:
        """STOP_SENDING: ask the peer to stop (a stream already gone is no error)."""
        ...


_uids = itertools.count(1)


def new_uid() -> int:
    """A connection uid no other connection of this process has, QUIC connection or local link end
    (locallink.py): one table routes the streams of both kinds by (uid, stream id)."""
    return next(_uids)


class AppError(enum.IntEnum):
    """QUIC application error codes on RESET_STREAM / STOP_SENDING between edge drivers."""

    EDGE_STOPPED = 0x1
    RENDEZVOUS_TIMEOUT = 0x2
    MALFORMED_PREAMBLE = 0x3
    RING_FAULT = 0x4
    DUPLICATE_STREAM = 0x5
    DRIVER_STOPPING = 0x6
    WRONG_PRODUCER = 0x7  # the stream's node is not the edge's planned producer (spec §4, §39)


_REMOTE_REASONS = {
    AppError.RENDEZVOUS_TIMEOUT: common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT,
    AppError.MALFORMED_PREAMBLE: common_pb2.STREAM_FAULT_MALFORMED_PREAMBLE,
    AppError.DUPLICATE_STREAM: common_pb2.STREAM_FAULT_UNKNOWN_EDGE,
    AppError.WRONG_PRODUCER: common_pb2.STREAM_FAULT_WRONG_PRODUCER,
    # the peer's own end (its owner stopped the edge, its ring faulted, its driver is stopping): what faulted the peer
    # is the peer stage's to report, so the orchestrator waits briefly for that report (runs/fsm.py ECHO_GRACE_S)
    AppError.EDGE_STOPPED: common_pb2.STREAM_FAULT_PEER_STOPPED,
    AppError.RING_FAULT: common_pb2.STREAM_FAULT_PEER_STOPPED,
    AppError.DRIVER_STOPPING: common_pb2.STREAM_FAULT_PEER_STOPPED,
}


def reason_for_remote_code(code: int) -> int:
    """StreamFaultReason for a reset/stop the peer sent with application error `code`."""
    return _REMOTE_REASONS.get(code, common_pb2.STREAM_FAULT_STREAM_RESET)  # type: ignore[call-overload]
