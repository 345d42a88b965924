"""Receive demux rendezvous (spec §25): an edge's local spec and its arriving stream meet here.

I/O-free: inputs carry `now`, outputs are actions. Either half may come first:

    establish_recv(spec)   -> StartRecvPump if the stream waits, else the spec is stored
    stream_arrived(stream) -> StartRecvPump if the spec waits, else the stream is parked
    expire(now)            -> RejectStream(RENDEZVOUS_TIMEOUT) for streams parked too long

A parked stream is not read, so QUIC flow control stalls its sender at the initial window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from swactor.v1 import common_pb2

S = TypeVar("S")  # the stream handle type (opaque here)
P = TypeVar("P")  # the recv spec type (opaque here)


@dataclass(frozen=True)
class StartRecvPump(Generic[S, P]):
    edge_id: int
    spec: P
    stream: S
    initial: bytes  # bytes that followed the preamble while the stream was parked


@dataclass(frozen=True)
class RejectStream(Generic[S]):
    edge_id: int
    stream: S
    reason: int  # StreamFaultReason
    detail: str


@dataclass
class _Parked(Generic[S]):
    stream: S
    since: float
    buffered: list[bytes] = field(default_factory=list)


class Rendezvous(Generic[S, P]):
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.recv_specs: dict[int, P] = {}
        self.pending_streams: dict[int, _Parked[S]] = {}
        self.matched: set[int] = set()

    def establish_recv(self, edge_id: int, spec: P) -> StartRecvPump[S, P] | None:
        if edge_id in self.recv_specs or edge_id in self.matched:
            raise ValueError(f"edge {edge_id} is already established for receiving")
        parked = self.pending_streams.pop(edge_id, None)
        if parked is None:
            self.recv_specs[edge_id] = spec
            return None
        self.matched.add(edge_id)
        return StartRecvPump(edge_id, spec, parked.stream, b"".join(parked.buffered))

    def stream_arrived(
        self, edge_id: int, stream: S, now: float, initial: bytes = b""
    ) -> StartRecvPump[S, P] | RejectStream[S] | None:
        if edge_id in self.matched or edge_id in self.pending_streams:
            return RejectStream(
                edge_id, stream, common_pb2.STREAM_FAULT_UNKNOWN_EDGE, f"a second stream for edge {edge_id}"
            )
        spec = self.recv_specs.pop(edge_id, None)
        if spec is None:
            self.pending_streams[edge_id] = _Parked(stream, now, [initial] if initial else [])
            return None
        self.matched.add(edge_id)
        return StartRecvPump(edge_id, spec, stream, initial)

    def parked_data(self, edge_id: int, data: bytes) -> bool:
        """Bytes for a parked stream (bounded by its initial credit); False if not parked."""
        parked = self.pending_streams.get(edge_id)
        if parked is None:
            return False
        parked.buffered.append(data)
        return True

    def stream_gone(self, edge_id: int) -> None:
        """The parked stream was reset or its connection died before rendezvous."""
        self.pending_streams.pop(edge_id, None)

    def stop(self, edge_id: int) -> S | None:
        """Forget the edge; returns a parked stream the caller must reject."""
        self.recv_specs.pop(edge_id, None)
        self.matched.discard(edge_id)
        parked = self.pending_streams.pop(edge_id, None)
        return parked.stream if parked else None

    def expire(self, now: float) -> list[RejectStream[S]]:
        out: list[RejectStream[S]] = []
        for edge_id, parked in list(self.pending_streams.items()):
            if now - parked.since >= self.timeout:
                del self.pending_streams[edge_id]
                out.append(
                    RejectStream(
                        edge_id,
                        parked.stream,
                        common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT,
                        f"no EstablishRecv for edge {edge_id} within {self.timeout} s",
                    )
                )
        return out

    def next_deadline(self) -> float | None:
        if not self.pending_streams:
            return None
        return min(p.since for p in self.pending_streams.values()) + self.timeout
