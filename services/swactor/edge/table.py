"""The edge table (spec §24-25): the driver's I/O-free core — its edges, their pumps, the receive
demux and rendezvous, and where every QUIC stream event goes.

Inputs are method calls with the time passed in (`now`: monotonic seconds for the rendezvous,
`now_us`: wall-clock µs for object taps). Outputs wait in two fields the shell drains after each
input: `outbox` (DriverEdgeReady / StreamClosed / StreamFault / PumpStopped, each with its record,
in order) and `transmit` (connections the cores queued data on). Connections are `StreamPort`s and
rings `ringport` ends, so the core tests run two tables linked in memory (tests/edge/memlink.py).

One bad edge only faults that edge: every per-edge failure ends in exactly one closed or fault
event (the pump's way into Closed or Faulted), and StopEdge in PumpStopped. Streams are admitted in
`_stream_arrived` through the rendezvous: one stream per edge, and only from the edge's planned
producer node (EstablishRecv's `tx_node_id`, spec §4, §39). A stream from another node is stopped
with AppError.WRONG_PRODUCER (its sender faults with STREAM_FAULT_WRONG_PRODUCER) and logged as
`edge.stream_refused` (once per edge; later ones are counted in `streams_wrong_producer`); the edge
waits on for its producer and faults with WRONG_PRODUCER if it does not come within the rendezvous
timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swactor.common.events import get_logger
from swactor.common.ringport import ConsumerEnd, ProducerEnd
from swactor.edge import preamble
from swactor.edge.objtap import ObjectTap
from swactor.edge.owners import EdgeStopCause
from swactor.edge.pumpstate import RecvState, SendState
from swactor.edge.recvpump import RecvPump
from swactor.edge.rendezvous import ProducerMissing, RejectStream, Rendezvous, StartRecvPump
from swactor.edge.sendpump import SendPump
from swactor.edge.streamport import AppError, StreamPort, reason_for_remote_code
from swactor.v1 import common_pb2, edge_pb2

log = get_logger(component="COMPONENT_EDGE_DRIVER")
SEND, RECV = edge_pb2.EDGE_ROLE_SEND, edge_pb2.EDGE_ROLE_RECV


class EdgeError(ValueError):
    """A driver request is invalid (unknown ring, duplicate edge, ...); the message says which.

    `kind` is "invalid" (bad argument), "exists" (edge already established) or "ring" (the ring
    cannot be attached or opened)."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class StreamRef:
    conn: StreamPort
    stream_id: int


@dataclass
class Incoming:
    """A peer-opened stream before (and while) it meets its edge: the §25 edge demux reader."""

    reader: preamble.PreambleReader = field(default_factory=preamble.PreambleReader)
    edge_id: int = 0  # known once the preamble is complete; then parked or rejected
    eof: bool = False
    rejected: bool = False


@dataclass(eq=False)
class _Edge:
    edge_id: int
    ring_id: int
    peer_node_id: int = 0
    owner_id: int = 0  # the local process that established it (owners.py); 0: unowned
    last_event: edge_pb2.EdgeEvent | None = None  # replayed to new watchers
    ended: bool = False  # its closed / fault / pump_stopped event is out

    @property
    def state(self) -> str:
        return str(self.pump.state.value)  # type: ignore[attr-defined]


@dataclass(eq=False)
class SendEdge(_Edge):
    pump: SendPump = field(kw_only=True)
    role = SEND


@dataclass(eq=False)
class RecvEdge(_Edge):
    producer_node_id: int = 0  # the plan's producer: the only node whose stream is taken
    pump: RecvPump = field(kw_only=True)
    role = RECV


EdgeRecord = SendEdge | RecvEdge
Outgoing = tuple[edge_pb2.EdgeEvent, int, EdgeRecord | None]  # (event, edge_id, its record)


class EdgeTable:
    def __init__(self, *, rendezvous_timeout: float, stream_window: int, send_queue_limit: int) -> None:
        self.stream_window = stream_window
        self.send_queue_limit = send_queue_limit
        # Keyed by (edge_id, role): both ends of an edge may live on one host (a self edge).
        self.edges: dict[tuple[int, int], EdgeRecord] = {}
        self.outbox: list[Outgoing] = []
        self.transmit: set[StreamPort] = set()
        self.deadline_moved = False  # the rendezvous deadline may have changed: re-arm its timer
        self.rendezvous: Rendezvous[StreamRef, RecvEdge] = Rendezvous(rendezvous_timeout)
        self._incoming: dict[tuple[int, int], Incoming | RecvEdge] = {}  # (conn uid, stream id)
        self._blocked: dict[int, set[SendEdge]] = {}  # conn uid -> send edges waiting for ACKs
        self.streams_wrong_producer = 0  # streams refused: not from the edge's planned producer
        self._refusal_logged: set[int] = set()  # edges whose first wrong-producer refusal is logged

    # ---- requests ----

    def check_new(self, edge_id: int, ring_id: int, role: int) -> None:
        if edge_id == 0 or ring_id == 0:
            raise EdgeError("edge_id and ring_id must be non-zero")
        if (edge_id, role) in self.edges:
            raise EdgeError(f"edge {edge_id} is already established on this driver", "exists")

    def add_send(self, edge_id: int, ring_id: int, rx_node_id: int, ring: ConsumerEnd, tap: ObjectTap | None,
                 owner_id: int = 0) -> SendEdge:
        """EstablishSend with its egress ring open: the pump waits for the connection."""
        self.check_new(edge_id, ring_id, SEND)
        if rx_node_id == 0:
            raise EdgeError("rx_node_id must be set")
        pump = SendPump(edge_id=edge_id, ring=ring, queue_limit=self.send_queue_limit, tap=tap)
        rec = SendEdge(edge_id, ring_id, peer_node_id=rx_node_id, owner_id=owner_id, pump=pump)
        self.edges[(edge_id, SEND)] = rec
        log.info("edge.establish_send", edge_id=edge_id, ring_id=ring_id, rx_node_id=rx_node_id, owner_id=owner_id)
        return rec

    def connected(self, rec: SendEdge, conn: StreamPort, now_us: int) -> None:
        """The send edge's connection is up (its dial may have outlived the edge)."""
        if self.edges.get((rec.edge_id, SEND)) is not rec or rec.pump.done:
            return
        self._emit(rec, edge_pb2.EdgeEvent(ready=edge_pb2.DriverEdgeReady(edge_id=rec.edge_id, ring_id=rec.ring_id)))
        self._settle(rec, rec.pump.attach(conn, now_us))

    def dial_failed(self, rec: SendEdge, reason: int, detail: str) -> None:
        if self.edges.get((rec.edge_id, SEND)) is rec:
            self._settle(rec, rec.pump.fault(reason, detail))

    def add_recv(self, edge_id: int, ring_id: int, tx_node_id: int, ring: ProducerEnd, tap: ObjectTap | None,
                 now: float, now_us: int, owner_id: int = 0) -> RecvEdge:
        """EstablishRecv with its ingress ring open: ready at once; the producer's stream may
        already wait (streams parked for the edge from other nodes are refused now)."""
        self.check_new(edge_id, ring_id, RECV)
        if tx_node_id == 0:
            raise EdgeError("tx_node_id (the edge's planned producer node) must be set")
        pump = RecvPump(edge_id=edge_id, ring=ring, window=self.stream_window, tap=tap)
        rec = RecvEdge(edge_id, ring_id, peer_node_id=tx_node_id, producer_node_id=tx_node_id, owner_id=owner_id,
                       pump=pump)
        self.edges[(edge_id, RECV)] = rec
        log.info("edge.establish_recv", edge_id=edge_id, ring_id=ring_id, tx_node_id=tx_node_id, owner_id=owner_id)
        self._emit(rec, edge_pb2.EdgeEvent(ready=edge_pb2.DriverEdgeReady(edge_id=edge_id, ring_id=ring_id)))
        for action in self.rendezvous.establish_recv(edge_id, tx_node_id, rec, now):
            if isinstance(action, StartRecvPump):
                self._start_recv(action, now_us)
            else:
                self._refuse_stream(action)
        self.deadline_moved = True
        return rec

    def stop_edge(self, edge_id: int, ring_id: int = 0,
                  cause: EdgeStopCause = EdgeStopCause.STOP_EDGE) -> list[EdgeRecord]:
        """StopEdge for the end of `edge_id` on `ring_id` (0: both ends this host has): the stopped
        records, whose rings the caller releases (an empty list: unknown edge or ring)."""
        return [rec for role in (SEND, RECV)
                if (r := self.edges.get((edge_id, role))) is not None and ring_id in (0, r.ring_id)
                and (rec := self.stop_end(edge_id, role, cause)) is not None]

    def owned_by(self, owner_id: int) -> list[tuple[int, int]]:
        """The (edge_id, role) keys of every end `owner_id` established (none for owner 0)."""
        return [key for key, rec in self.edges.items() if owner_id and rec.owner_id == owner_id]

    def stop_end(self, edge_id: int, role: int, cause: EdgeStopCause) -> EdgeRecord | None:
        """Stop one end: its pump never touches the ring again; the caller releases the ring."""
        rec = self.edges.pop((edge_id, role), None)
        if rec is None:
            return None
        pump = rec.pump
        if isinstance(rec, RecvEdge):
            for parked in self.rendezvous.stop(edge_id):
                self._reject(parked, AppError.EDGE_STOPPED)
            self.deadline_moved = True
            self._refusal_logged.discard(edge_id)
        self._unroute(rec)
        if pump.stop() and pump.conn is not None:
            self.transmit.add(pump.conn)
        rec.ended = True
        (log.info if cause is EdgeStopCause.STOP_EDGE else log.warning)(
            "edge.pump_stopped", edge_id=edge_id, ring_id=rec.ring_id, role=edge_pb2.EdgeRole.Name(role),  # type: ignore[arg-type]
            owner_id=rec.owner_id, cause=cause.value)
        self._emit(rec, edge_pb2.EdgeEvent(pump_stopped=edge_pb2.PumpStopped(edge_id=edge_id, ring_id=rec.ring_id)),
                   logged=True)
        return rec

    def ring_wake(self, rec: EdgeRecord, now_us: int) -> None:
        """The ring's other side made progress (send: bytes committed; recv: space freed)."""
        self._settle(rec, rec.pump.on_ring_wake(now_us))

    def asleep_on_rings(self) -> list[EdgeRecord]:
        """The ends whose pump sleeps on its ring's eventfd: a connected send pump with room in QUIC
        (waiting for committed bytes), a backpressured recv pump (waiting for free space)."""
        return [rec for rec in self.edges.values()
                if rec.pump.state in (SendState.WAITING_FOR_BYTES, SendState.STREAMING, RecvState.BACKPRESSURED)
                and rec.pump.conn is not None]

    # ---- QUIC stream events ----

    def stream_data(self, conn: StreamPort, stream_id: int, data: bytes, end: bool, now: float, now_us: int) -> None:
        key = (conn.uid, stream_id)
        entry = self._incoming.get(key)
        if entry.__class__ is RecvEdge:  # the hot path: a stream that met its edge
            self._settle(entry, entry.pump.on_data(data, end, now_us))  # type: ignore[union-attr]
            return
        if entry is None:
            entry = self._incoming[key] = Incoming()
        assert isinstance(entry, Incoming)
        if entry.rejected:
            if end:
                del self._incoming[key]  # the peer finished: nothing more will come
            return
        if entry.edge_id:  # parked, waiting for EstablishRecv
            self.rendezvous.parked_data(entry.edge_id, conn.peer_node_id or 0, data)
            entry.eof = entry.eof or end
            return
        try:
            got = entry.reader.feed(data)
            if got is None and end:
                raise preamble.MalformedPreamble("stream ended inside the preamble")
        except preamble.MalformedPreamble as e:
            self._reject(StreamRef(conn, stream_id), AppError.MALFORMED_PREAMBLE)
            if end:
                del self._incoming[key]
            self._fault_event(0, common_pb2.STREAM_FAULT_MALFORMED_PREAMBLE, f"from node {conn.peer_node_id}: {e}")
            return
        if got is not None:
            self._stream_arrived(StreamRef(conn, stream_id), entry, got[0], got[1], end, now, now_us)

    def stream_reset(self, conn: StreamPort, stream_id: int, code: int) -> None:
        entry = self._incoming.pop((conn.uid, stream_id), None)
        if isinstance(entry, RecvEdge):
            self._settle(entry, entry.pump.fault(reason_for_remote_code(code), f"peer reset the stream (code {code:#x})"))
        elif isinstance(entry, Incoming) and entry.edge_id and not entry.rejected:
            self.rendezvous.stream_gone(entry.edge_id, conn.peer_node_id or 0)
            self.deadline_moved = True

    def stop_sending(self, conn: StreamPort, stream_id: int, code: int) -> None:
        for rec in self.edges.values():
            pump = rec.pump
            if isinstance(rec, SendEdge) and pump.conn is conn and pump.stream_id == stream_id:
                self._settle(rec, pump.fault(reason_for_remote_code(code), f"peer stopped the stream (code {code:#x})"))
                return

    def progress(self, conn: StreamPort, now_us: int) -> None:
        """QUIC acknowledged data on `conn`: send edges waiting for queue room go on."""
        blocked = self._blocked.pop(conn.uid, None)
        if blocked:
            for rec in blocked:
                self._settle(rec, rec.pump.on_ring_wake(now_us))

    def connection_lost(self, conn: StreamPort, reason: str, not_authorized: bool) -> None:
        code = common_pb2.STREAM_FAULT_PEER_NOT_AUTHORIZED if not_authorized else common_pb2.STREAM_FAULT_CONNECTION_LOST
        detail = f"connection to node {conn.peer_node_id} lost: {reason}"
        self._blocked.pop(conn.uid, None)
        for key in [k for k in self._incoming if k[0] == conn.uid]:
            entry = self._incoming.pop(key)
            if isinstance(entry, RecvEdge):
                self._settle(entry, entry.pump.fault(code, detail))
            elif entry.edge_id and not entry.rejected:
                self.rendezvous.stream_gone(entry.edge_id, conn.peer_node_id or 0)
                self.deadline_moved = True
        for rec in list(self.edges.values()):
            if isinstance(rec, SendEdge) and rec.pump.conn is conn:
                self._settle(rec, rec.pump.fault(code, detail))

    # ---- rendezvous ----

    def _stream_arrived(self, ref: StreamRef, entry: Incoming, edge_id: int, rest: bytes, end: bool,
                        now: float, now_us: int) -> None:
        """Admit a peer's stream for `edge_id`: only from the edge's planned producer, one per edge;
        then it meets its edge or parks."""
        entry.edge_id, entry.eof = edge_id, end
        action = self.rendezvous.stream_arrived(edge_id, ref.conn.peer_node_id or 0, ref, now, rest)
        if isinstance(action, StartRecvPump):
            self._start_recv(action, now_us)
        elif isinstance(action, RejectStream):
            self._refuse_stream(action)
        else:
            log.info("edge.stream_parked", edge_id=edge_id, peer_node_id=ref.conn.peer_node_id or 0)
        self.deadline_moved = True

    def _refuse_stream(self, rej: RejectStream[StreamRef]) -> None:
        """A stream the rendezvous turned away: a duplicate, or not from the planned producer."""
        wrong = rej.reason == common_pb2.STREAM_FAULT_WRONG_PRODUCER
        self._reject(rej.stream, AppError.WRONG_PRODUCER if wrong else AppError.DUPLICATE_STREAM)
        reason = common_pb2.StreamFaultReason.Name(rej.reason)  # type: ignore[arg-type]
        if not wrong:
            log.warning("edge.stream_rejected", edge_id=rej.edge_id, reason=reason, detail=rej.detail)
            return
        self.streams_wrong_producer += 1
        first = rej.edge_id not in self._refusal_logged
        self._refusal_logged.add(rej.edge_id)
        (log.warning if first else log.debug)(
            "edge.stream_refused", edge_id=rej.edge_id, peer_node_id=rej.node_id, reason=reason, detail=rej.detail,
            refused_so_far=self.streams_wrong_producer)

    def _start_recv(self, action: StartRecvPump[StreamRef, RecvEdge], now_us: int) -> None:
        rec, ref = action.spec, action.stream
        key = (ref.conn.uid, ref.stream_id)
        incoming = self._incoming.get(key)
        eof = isinstance(incoming, Incoming) and incoming.eof
        if ref.conn.closed:
            self._settle(rec, rec.pump.fault(common_pb2.STREAM_FAULT_CONNECTION_LOST, "connection closed before rendezvous"))
            return
        rec.peer_node_id = ref.conn.peer_node_id or 0
        self._incoming[key] = rec
        self.deadline_moved = True
        log.info("edge.recv_pump_started", edge_id=rec.edge_id, ring_id=rec.ring_id, peer_node_id=rec.peer_node_id)
        self._settle(rec, rec.pump.start(ref.conn, ref.stream_id, action.initial, eof, now_us))

    def _reject(self, ref: StreamRef, code: AppError) -> None:
        entry = self._incoming.get((ref.conn.uid, ref.stream_id))
        if isinstance(entry, Incoming):
            entry.rejected = True
        if not ref.conn.closed:
            ref.conn.stop_stream(ref.stream_id, code)

    def expire(self, now: float) -> None:
        """Streams parked longer than the rendezvous timeout are stopped, with a fault each; an edge
        whose planned producer never came after a foreign stream was refused faults."""
        for out in self.rendezvous.expire(now):
            if isinstance(out, ProducerMissing):
                rec = out.spec
                if self.edges.get((rec.edge_id, RECV)) is rec:
                    self._settle(rec, rec.pump.fault(out.reason, out.detail))
                continue
            self._reject(out.stream, AppError.RENDEZVOUS_TIMEOUT)
            self._fault_event(out.edge_id, out.reason, out.detail)
        self.deadline_moved = True

    def next_deadline(self) -> float | None:
        return self.rendezvous.next_deadline()

    # ---- after each pump input ----

    def _settle(self, rec: EdgeRecord, moved: bool) -> None:
        pump = rec.pump
        if moved and pump.conn is not None:
            self.transmit.add(pump.conn)
        if pump.backpressured and isinstance(rec, SendEdge):  # waits for ACK progress on its connection
            self._blocked.setdefault(pump.conn.uid, set()).add(rec)  # type: ignore[union-attr]
        if pump.done and not rec.ended:
            rec.ended = True
            self._unroute(rec)
            if pump.fault_reason:
                self._fault_event(rec.edge_id, pump.fault_reason, pump.fault_detail, rec)
            else:
                log.info("edge.stream_closed", edge_id=rec.edge_id, ring_id=rec.ring_id, bytes=pump.bytes)
                self._emit(rec, edge_pb2.EdgeEvent(closed=edge_pb2.StreamClosed(edge_id=rec.edge_id, ring_id=rec.ring_id)), logged=True)

    def _unroute(self, rec: EdgeRecord) -> None:
        conn = rec.pump.conn
        if conn is None:
            return
        if isinstance(rec, SendEdge):
            self._blocked.get(conn.uid, set()).discard(rec)
            return
        key = (conn.uid, rec.pump.stream_id)
        if self._incoming.get(key) is not rec:
            return  # the stream is gone already (reset, connection lost)
        if rec.pump.state is RecvState.CLOSED:
            del self._incoming[key]  # FIN was the last thing this stream had to say
        else:
            # Stopped or faulted: the peer's in-flight bytes still arrive until it resets; they
            # must be dropped, not taken for a new stream's preamble.
            self._incoming[key] = Incoming(edge_id=rec.edge_id, rejected=True)

    # ---- events ----

    def _fault_event(self, edge_id: int, reason: int, detail: str, rec: EdgeRecord | None = None) -> None:
        log.warning("edge.stream_fault", edge_id=edge_id, ring_id=rec.ring_id if rec else 0,
                    reason=common_pb2.StreamFaultReason.Name(reason), detail=detail)  # type: ignore[arg-type]
        event = edge_pb2.EdgeEvent(fault=edge_pb2.StreamFault(  # type: ignore[arg-type]
            edge_id=edge_id, ring_id=rec.ring_id if rec else 0, reason=reason, detail=detail))
        if rec is not None:
            self._emit(rec, event, logged=True)
        else:
            self.outbox.append((event, edge_id, None))

    def _emit(self, rec: EdgeRecord, event: edge_pb2.EdgeEvent, logged: bool = False) -> None:
        kind = event.WhichOneof("event")
        if not logged:
            log.info(f"edge.{kind}", edge_id=rec.edge_id, ring_id=rec.ring_id)
        if kind != "pump_stopped":
            rec.last_event = event
        self.outbox.append((event, rec.edge_id, rec))

    # ---- views ----

    def streams_on(self, conn_uid: int) -> int:
        """QUIC streams of this connection the table knows: ours (send) and the peer's (recv, demux)."""
        sending = sum(1 for r in self.edges.values()
                      if isinstance(r, SendEdge) and r.pump.conn is not None and r.pump.conn.uid == conn_uid
                      and r.pump.stream_id is not None)
        return sending + sum(1 for uid, _ in self._incoming if uid == conn_uid)

    @property
    def parked_streams(self) -> int:
        return self.rendezvous.parked
