"""Receive demux rendezvous (spec §25) with the producer check (spec §4, §39): an edge's local spec
and its arriving stream meet here, and only a stream from the edge's planned producer node does.

I/O-free: inputs carry `now`, outputs are actions. Either half may come first:

    establish_recv(spec, producer) -> StartRecvPump if the producer's stream waits, else the spec
                                      is stored; streams parked for the edge from other nodes are
                                      rejected (WRONG_PRODUCER)
    stream_arrived(stream, node)   -> StartRecvPump if the spec waits and `node` is its producer;
                                      RejectStream if `node` is not (WRONG_PRODUCER) or the edge
                                      has its stream already (UNKNOWN_EDGE); else the stream parks
    expire(now)                    -> RejectStream(RENDEZVOUS_TIMEOUT) for streams parked too long;
                                      ProducerMissing for an edge that refused a foreign stream and
                                      whose planned producer did not come within the timeout

Before EstablishRecv nobody here knows the edge's producer, so streams park per (edge, node): a
node that is not the producer cannot take the edge's place by arriving first. A parked stream is
not read, so QUIC flow control stalls its sender at the initial window.
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
    node_id: int = 0  # the node that opened the stream


@dataclass(frozen=True)
class ProducerMissing(Generic[P]):
    """The edge refused a stream from a foreign node and its planned producer never came."""

    edge_id: int
    spec: P
    reason: int  # StreamFaultReason WRONG_PRODUCER
    detail: str


@dataclass
class _Parked(Generic[S]):
    stream: S
    since: float
    buffered: list[bytes] = field(default_factory=list)


@dataclass
class _Spec(Generic[P]):
    spec: P
    producer: int


@dataclass(frozen=True)
class _Refused:
    node_id: int  # the first foreign node refused while the spec waited
    since: float


class Rendezvous(Generic[S, P]):
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.recv_specs: dict[int, _Spec[P]] = {}
        self.pending_streams: dict[int, dict[int, _Parked[S]]] = {}  # edge -> producer node -> stream
        self.parked = 0  # streams in pending_streams
        self.matched: dict[int, int] = {}  # edge -> the producer node whose stream is pumped
        self.refused: dict[int, _Refused] = {}  # waiting specs that refused a foreign stream

    def establish_recv(self, edge_id: int, producer: int, spec: P,
                       now: float) -> list[StartRecvPump[S, P] | RejectStream[S]]:
        if edge_id in self.recv_specs or edge_id in self.matched:
            raise ValueError(f"edge {edge_id} is already established for receiving")
        parked = self.pending_streams.pop(edge_id, {})
        self.parked -= len(parked)
        mine = parked.pop(producer, None)
        out: list[StartRecvPump[S, P] | RejectStream[S]] = [
            self._wrong_producer(edge_id, node, p.stream, producer) for node, p in parked.items()]
        if mine is not None:
            self.matched[edge_id] = producer
            out.append(StartRecvPump(edge_id, spec, mine.stream, b"".join(mine.buffered)))
        else:
            self.recv_specs[edge_id] = _Spec(spec, producer)
            if parked:
                self.refused[edge_id] = _Refused(next(iter(parked)), now)
        return out

    def stream_arrived(
        self, edge_id: int, node_id: int, stream: S, now: float, initial: bytes = b""
    ) -> StartRecvPump[S, P] | RejectStream[S] | None:
        producer = self.matched.get(edge_id)
        if producer is not None:
            if producer != node_id:
                return self._wrong_producer(edge_id, node_id, stream, producer)
            return RejectStream(edge_id, stream, common_pb2.STREAM_FAULT_UNKNOWN_EDGE,
                                f"a second stream for edge {edge_id}", node_id)
        waiting = self.recv_specs.get(edge_id)
        if waiting is not None:
            if waiting.producer != node_id:
                if edge_id not in self.refused:
                    self.refused[edge_id] = _Refused(node_id, now)
                return self._wrong_producer(edge_id, node_id, stream, waiting.producer)
            del self.recv_specs[edge_id]
            self.refused.pop(edge_id, None)
            self.matched[edge_id] = node_id
            return StartRecvPump(edge_id, waiting.spec, stream, initial)
        by_node = self.pending_streams.setdefault(edge_id, {})
        if node_id in by_node:
            return RejectStream(edge_id, stream, common_pb2.STREAM_FAULT_UNKNOWN_EDGE,
                                f"a second stream for edge {edge_id} from node {node_id}", node_id)
        by_node[node_id] = _Parked(stream, now, [initial] if initial else [])
        self.parked += 1
        return None

    @staticmethod
    def _wrong_producer(edge_id: int, node_id: int, stream: S, producer: int) -> RejectStream[S]:
        return RejectStream(edge_id, stream, common_pb2.STREAM_FAULT_WRONG_PRODUCER,
                            f"stream for edge {edge_id} from node {node_id}: the plan's producer is node {producer}",
                            node_id)

    def parked_data(self, edge_id: int, node_id: int, data: bytes) -> bool:
        """Bytes for a parked stream (bounded by its initial credit); False if not parked."""
        parked = self.pending_streams.get(edge_id, {}).get(node_id)
        if parked is None:
            return False
        parked.buffered.append(data)
        return True

    def stream_gone(self, edge_id: int, node_id: int) -> None:
        """The parked stream was reset or its connection died before rendezvous."""
        by_node = self.pending_streams.get(edge_id)
        if by_node is not None and by_node.pop(node_id, None) is not None:
            self.parked -= 1
            if not by_node:
                del self.pending_streams[edge_id]

    def stop(self, edge_id: int) -> list[S]:
        """Forget the edge; returns parked streams the caller must reject."""
        self.recv_specs.pop(edge_id, None)
        self.matched.pop(edge_id, None)
        self.refused.pop(edge_id, None)
        parked = self.pending_streams.pop(edge_id, {})
        self.parked -= len(parked)
        return [p.stream for p in parked.values()]

    def expire(self, now: float) -> list[RejectStream[S] | ProducerMissing[P]]:
        out: list[RejectStream[S] | ProducerMissing[P]] = []
        for edge_id, by_node in list(self.pending_streams.items()):
            for node_id, parked in list(by_node.items()):
                if now - parked.since >= self.timeout:
                    self.stream_gone(edge_id, node_id)
                    out.append(RejectStream(edge_id, parked.stream, common_pb2.STREAM_FAULT_RENDEZVOUS_TIMEOUT,
                                            f"no EstablishRecv for edge {edge_id} within {self.timeout} s", node_id))
        for edge_id, refused in list(self.refused.items()):
            if now - refused.since >= self.timeout:
                del self.refused[edge_id]
                waiting = self.recv_specs.pop(edge_id)
                out.append(ProducerMissing(
                    edge_id, waiting.spec, common_pb2.STREAM_FAULT_WRONG_PRODUCER,
                    f"edge {edge_id} refused a stream from node {refused.node_id}; its planned producer, "
                    f"node {waiting.producer}, did not open the stream within {self.timeout} s"))
        return out

    def next_deadline(self) -> float | None:
        times = [p.since for by_node in self.pending_streams.values() for p in by_node.values()]
        times += [r.since for r in self.refused.values()]
        return min(times) + self.timeout if times else None
