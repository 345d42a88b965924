"""The edge driver (spec §24-25): edges, rendezvous, pumps and their coarse events.

It is the endpoint's ConnectionListener, routes stream events to pumps, and publishes
DriverEdgeReady / StreamClosed / StreamFault / PumpStopped to WatchEdges subscribers.
One bad edge only faults that edge: every per-edge failure ends in a StreamFault event.
With `object_timing` on, every pump has an ObjectTap (objtap.py); its marks are flushed as
ObjectTimings batches at most every `object_timing_flush_s` to watchers that asked for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from swactor.common.events import get_logger
from swactor.common.systemd import notify_status
from swactor.edge import preamble
from swactor.edge.config import EdgeConfig
from swactor.edge.connection import EdgeConnection, PeerNotAuthorized, PeerUnreachable
from swactor.edge.endpoint import Endpoint
from swactor.edge.identity import EdgeIdentity
from swactor.edge.objtap import ObjectTap
from swactor.edge.peers import PeerDirectory
from swactor.edge.pumps import AppError, PumpState, RecvPump, SendPump, reason_for_remote_code
from swactor.edge.rendezvous import RejectStream, Rendezvous, StartRecvPump
from swactor.edge.ring_source import RingSource
from swactor.v1 import common_pb2, edge_pb2

log = get_logger(component="COMPONENT_EDGE_DRIVER")
WATCH_QUEUE = 4096
SEND, RECV = edge_pb2.EDGE_ROLE_SEND, edge_pb2.EDGE_ROLE_RECV
STATUS_INTERVAL = 1.0


class EdgeError(ValueError):
    """A driver request is invalid (unknown ring, duplicate edge, ...); the message says which.

    `kind` is "invalid" (bad argument), "exists" (edge already established) or "ring" (the ring
    cannot be attached or opened)."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class StreamRef:
    conn: EdgeConnection
    stream_id: int


@dataclass
class _Incoming:
    """A peer-opened stream before/while it meets its edge."""

    reader: preamble.PreambleReader = field(default_factory=preamble.PreambleReader)
    edge_id: int = 0
    eof: bool = False
    rejected: bool = False


@dataclass
class EdgeRecord:
    edge_id: int
    ring_id: int
    role: int  # edge_pb2.EdgeRole
    peer_node_id: int = 0
    recv_pump: RecvPump | None = None
    send_pump: SendPump | None = None
    ring: object | None = None  # the port, until a pump owns it
    dial: asyncio.Task[None] | None = None
    last_event: edge_pb2.EdgeEvent | None = None

    @property
    def state(self) -> str:
        pump = self.recv_pump or self.send_pump
        if pump is not None:
            return pump.state.value
        if self.last_event is not None and self.last_event.WhichOneof("event") == "fault":
            return PumpState.FAULTED.value
        return "WaitingForSpecAndStream" if self.role == edge_pb2.EDGE_ROLE_RECV else "WaitingForConnection"


class Watcher:
    def __init__(self, edge_ids: set[int], object_timings: bool = False) -> None:
        self.edge_ids = edge_ids
        self.object_timings = object_timings
        self.queue: asyncio.Queue[edge_pb2.EdgeEvent | None] = asyncio.Queue(WATCH_QUEUE)
        self.overflowed = False

    def offer(self, event: edge_pb2.EdgeEvent, edge_id: int) -> None:
        if self.edge_ids and edge_id not in self.edge_ids:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True  # the servicer ends this watch with RESOURCE_EXHAUSTED


class Driver:
    def __init__(
        self,
        *,
        node_id: int,
        config: EdgeConfig,
        identity: EdgeIdentity,
        directory: PeerDirectory,
        rings: RingSource,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.identity = identity
        self.directory = directory
        self.rings = rings
        self.endpoint = Endpoint(node_id=node_id, identity=identity, config=config, directory=directory, listener=self)
        self.endpoint.on_refused = self._on_refused
        self.rendezvous: Rendezvous[StreamRef, EdgeRecord] = Rendezvous(config.rendezvous_timeout)
        # Keyed by (edge_id, role): both ends of an edge may live on one host (a self edge).
        self.edges: dict[tuple[int, int], EdgeRecord] = {}
        self.watchers: set[Watcher] = set()
        self.refused_peers = 0
        self._incoming: dict[tuple[int, int], _Incoming | RecvPump] = {}
        self._blocked: dict[int, set[SendPump]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._status_timer: asyncio.TimerHandle | None = None
        self._status_sent = ""
        self._taps: dict[tuple[int, int], tuple[ObjectTap, int]] = {}  # (edge_id, role) -> (tap, ring_id)
        self._flush_timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    # ---- lifecycle ----

    def start(self) -> tuple[str, int]:
        return self.endpoint.bind(self.config.bind)

    async def close(self) -> None:
        for edge_id in {k[0] for k in self.edges}:
            self.stop_edge(edge_id)
        for timer in (self._expiry, self._status_timer, self._flush_timer):
            if timer is not None:
                timer.cancel()
        await self.endpoint.close()
        for w in list(self.watchers):
            with contextlib.suppress(asyncio.QueueFull):
                w.queue.put_nowait(None)

    # ---- requests (gRPC servicer) ----

    async def establish_send(self, edge_id: int, rx_node_id: int, ring_id: int, layout: object) -> None:
        self._check_new(edge_id, ring_id, SEND)
        if rx_node_id == 0:
            raise EdgeError("rx_node_id must be set")
        try:
            ring = await self.rings.open_consumer(ring_id, layout)
        except Exception as e:
            raise EdgeError(f"edge {edge_id}: cannot open egress ring {ring_id}: {e}", "ring") from e
        if (edge_id, SEND) in self.edges:  # a concurrent establish won while we attached
            ring.release()
            raise EdgeError(f"edge {edge_id} is already established on this driver", "exists")
        rec = EdgeRecord(edge_id, ring_id, SEND, peer_node_id=rx_node_id)
        rec.send_pump = SendPump(
            edge_id=edge_id,
            ring=ring,
            queue_limit=self.config.send_queue_limit,
            on_end=self._pump_ended,
            on_blocked=self._sender_blocked,
            tap=self._tap(edge_id, SEND, ring_id),
        )
        self.edges[(edge_id, SEND)] = rec
        rec.dial = asyncio.ensure_future(self._connect_send(rec))
        log.info("edge.establish_send", edge_id=edge_id, ring_id=ring_id, rx_node_id=rx_node_id)
        self._status()

    async def _connect_send(self, rec: EdgeRecord) -> None:
        try:
            conn = await self.endpoint.connection_to(rec.peer_node_id)
        except PeerNotAuthorized as e:
            self._fault(rec, common_pb2.STREAM_FAULT_PEER_NOT_AUTHORIZED, str(e))
            return
        except (PeerUnreachable, OSError) as e:
            self._fault(rec, common_pb2.STREAM_FAULT_PEER_UNREACHABLE, str(e))
            return
        pump = rec.send_pump
        if pump is None or self.edges.get((rec.edge_id, SEND)) is not rec:
            return
        self._emit(rec, edge_pb2.EdgeEvent(ready=edge_pb2.DriverEdgeReady(edge_id=rec.edge_id)))
        pump.attach(conn)

    async def establish_recv(self, edge_id: int, ring_id: int, layout: object) -> None:
        self._check_new(edge_id, ring_id, RECV)
        try:
            ring = await self.rings.open_producer(ring_id, layout)
        except Exception as e:
            raise EdgeError(f"edge {edge_id}: cannot open ingress ring {ring_id}: {e}", "ring") from e
        if (edge_id, RECV) in self.edges:
            ring.release()
            raise EdgeError(f"edge {edge_id} is already established on this driver", "exists")
        rec = EdgeRecord(edge_id, ring_id, RECV, ring=ring)
        self.edges[(edge_id, RECV)] = rec
        log.info("edge.establish_recv", edge_id=edge_id, ring_id=ring_id)
        self._emit(rec, edge_pb2.EdgeEvent(ready=edge_pb2.DriverEdgeReady(edge_id=edge_id)))
        action = self.rendezvous.establish_recv(edge_id, rec)
        if action is not None:
            self._start_recv(action)
        self._status()

    def _check_new(self, edge_id: int, ring_id: int, role: int) -> None:
        if edge_id == 0 or ring_id == 0:
            raise EdgeError("edge_id and ring_id must be non-zero")
        if (edge_id, role) in self.edges:
            raise EdgeError(f"edge {edge_id} is already established on this driver", "exists")

    def stop_edge(self, edge_id: int) -> bool:
        """Stop both ends this host has of `edge_id`; False when it has none."""
        recs = [r for r in (self.edges.pop((edge_id, SEND), None), self.edges.pop((edge_id, RECV), None)) if r]
        for rec in recs:
            self._stop_record(rec)
        if recs:
            self._status()
        return bool(recs)

    def _stop_record(self, rec: EdgeRecord) -> None:
        edge_id = rec.edge_id
        if rec.dial is not None and not rec.dial.done():
            rec.dial.cancel()
        parked = self.rendezvous.stop(edge_id) if rec.role == RECV else None
        if parked is not None:
            self._reject_stream(parked, AppError.EDGE_STOPPED)
        if rec.send_pump is not None:
            self._blocked.get(rec.send_pump.conn.uid if rec.send_pump.conn else 0, set()).discard(rec.send_pump)
            rec.send_pump.stop()
        elif rec.recv_pump is not None:
            self._incoming.pop((rec.recv_pump.conn.uid, rec.recv_pump.stream_id), None)
            rec.recv_pump.stop()
        elif rec.ring is not None:
            rec.ring.release()  # type: ignore[attr-defined]
        self._emit(rec, edge_pb2.EdgeEvent(pump_stopped=edge_pb2.PumpStopped(edge_id=edge_id, ring_id=rec.ring_id)))

    # ---- rendezvous ----

    def _start_recv(self, action: StartRecvPump[StreamRef, EdgeRecord]) -> None:
        rec, ref = action.spec, action.stream
        key = (ref.conn.uid, ref.stream_id)
        incoming = self._incoming.get(key)
        eof = isinstance(incoming, _Incoming) and incoming.eof
        if ref.conn.closed:
            self._fault(rec, common_pb2.STREAM_FAULT_CONNECTION_LOST, "connection closed before rendezvous")
            return
        assert rec.ring is not None
        pump = RecvPump(
            edge_id=rec.edge_id,
            ring=rec.ring,  # type: ignore[arg-type]
            conn=ref.conn,
            stream_id=ref.stream_id,
            window=self.config.stream_window,
            on_end=self._pump_ended,
            tap=self._tap(rec.edge_id, RECV, rec.ring_id),
        )
        rec.ring = None
        rec.recv_pump = pump
        rec.peer_node_id = ref.conn.peer_node_id or 0
        self._incoming[key] = pump
        log.info("edge.recv_pump_started", edge_id=rec.edge_id, ring_id=rec.ring_id, peer_node_id=rec.peer_node_id)
        pump.on_data(action.initial, eof)
        ref.conn.transmit()

    # ---- object timings (objtap.py) ----

    def _tap(self, edge_id: int, role: int, ring_id: int) -> ObjectTap | None:
        if not self.config.object_timing:
            return None
        self._flush_timings()  # a previous end of this edge id: its marks go out first
        tap = ObjectTap(commits=role == RECV, on_done=self._arm_flush)
        self._taps[(edge_id, role)] = (tap, ring_id)
        return tap

    def _arm_flush(self) -> None:
        if self._flush_timer is None:
            self._flush_timer = self._loop.call_later(self.config.object_timing_flush_s, self._flush_timings)

    def _flush_timings(self) -> None:
        """Publish the taps' finished marks (one ObjectTimings per edge end); forget ended ones."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        wanted = [w for w in self.watchers if w.object_timings]
        for key, (tap, ring_id) in list(self._taps.items()):
            marks, dropped = tap.drain()
            rec = self.edges.get(key)
            pump = rec and (rec.recv_pump or rec.send_pump)
            if pump is None or pump.tap is not tap or tap.broken:
                del self._taps[key]  # the pump is gone (this was its last batch) or its tap turned off
                if tap.broken:
                    log.warning("edge.object_timing_off", edge_id=key[0], ring_id=ring_id, detail=tap.broken)
            if not wanted or not (marks or dropped):
                continue
            event = edge_pb2.EdgeEvent(objects=edge_pb2.ObjectTimings(
                edge_id=key[0], ring_id=ring_id, role=key[1], dropped=dropped,  # type: ignore[arg-type]
                objects=[edge_pb2.ObjectTiming(object_id=m.object_id, sequence=m.sequence, extent=m.extent,
                                               first_us=m.first_us, last_us=m.last_us, committed_us=m.committed_us)
                         for m in marks]))
            event.time_us = time.time_ns() // 1000
            event.node_id = self.node_id
            for w in wanted:
                w.offer(event, key[0])

    def _reject_stream(self, ref: StreamRef, code: AppError) -> None:
        entry = self._incoming.get((ref.conn.uid, ref.stream_id))
        if isinstance(entry, _Incoming):
            entry.rejected = True
        if not ref.conn.closed:
            with contextlib.suppress(ValueError):
                ref.conn.quic.stop_stream(ref.stream_id, code)
            ref.conn.transmit_soon()

    def _arm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        deadline = self.rendezvous.next_deadline()
        if deadline is not None:
            self._expiry = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        for rej in self.rendezvous.expire(self._loop.time()):
            self._reject_stream(rej.stream, AppError.RENDEZVOUS_TIMEOUT)
            self._fault_event(rej.edge_id, rej.reason, rej.detail)
        self._arm_expiry()

    # ---- ConnectionListener ----

    def on_stream_data(self, conn: EdgeConnection, stream_id: int, data: bytes, end: bool) -> None:
        key = (conn.uid, stream_id)
        entry = self._incoming.get(key)
        if isinstance(entry, RecvPump):
            entry.on_data(data, end)
            return
        if entry is None:
            entry = self._incoming[key] = _Incoming()
        if entry.rejected:
            return
        if entry.edge_id:  # parked, waiting for EstablishRecv
            self.rendezvous.parked_data(entry.edge_id, data)
            entry.eof = entry.eof or end
            return
        try:
            got = entry.reader.feed(data)
            if got is None and end:
                raise preamble.MalformedPreamble("stream ended inside the preamble")
        except preamble.MalformedPreamble as e:
            entry.rejected = True
            self._reject_stream(StreamRef(conn, stream_id), AppError.MALFORMED_PREAMBLE)
            self._fault_event(0, common_pb2.STREAM_FAULT_MALFORMED_PREAMBLE, f"from node {conn.peer_node_id}: {e}")
            return
        if got is None:
            return
        edge_id, rest = got
        entry.edge_id = edge_id
        entry.eof = end
        action = self.rendezvous.stream_arrived(edge_id, StreamRef(conn, stream_id), self._loop.time(), rest)
        if isinstance(action, StartRecvPump):
            self._start_recv(action)
        elif isinstance(action, RejectStream):
            entry.rejected = True
            self._reject_stream(action.stream, AppError.DUPLICATE_STREAM)
            log.warning("edge.stream_rejected", edge_id=edge_id, reason=common_pb2.StreamFaultReason.Name(action.reason), detail=action.detail)
        else:
            log.info("edge.stream_parked", edge_id=edge_id, peer_node_id=conn.peer_node_id or 0)
            self._arm_expiry()

    def on_stream_reset(self, conn: EdgeConnection, stream_id: int, error_code: int) -> None:
        entry = self._incoming.pop((conn.uid, stream_id), None)
        if isinstance(entry, RecvPump):
            entry.fault(reason_for_remote_code(error_code), f"peer reset the stream (code {error_code:#x})")
        elif isinstance(entry, _Incoming) and entry.edge_id and not entry.rejected:
            self.rendezvous.stream_gone(entry.edge_id)

    def on_stop_sending(self, conn: EdgeConnection, stream_id: int, error_code: int) -> None:
        for rec in self.edges.values():
            pump = rec.send_pump
            if pump is not None and pump.conn is conn and pump.stream_id == stream_id:
                pump.fault(reason_for_remote_code(error_code), f"peer stopped the stream (code {error_code:#x})")
                return

    def on_progress(self, conn: EdgeConnection) -> None:
        blocked = self._blocked.pop(conn.uid, None)
        if blocked:
            for pump in blocked:
                pump.step()

    def on_connection_lost(self, conn: EdgeConnection, reason: str, not_authorized: bool) -> None:
        code = common_pb2.STREAM_FAULT_PEER_NOT_AUTHORIZED if not_authorized else common_pb2.STREAM_FAULT_CONNECTION_LOST
        self._blocked.pop(conn.uid, None)
        for key in [k for k in self._incoming if k[0] == conn.uid]:
            entry = self._incoming.pop(key)
            if isinstance(entry, RecvPump):
                entry.fault(code, f"connection to node {conn.peer_node_id} lost: {reason}")
            elif entry.edge_id and not entry.rejected:
                self.rendezvous.stream_gone(entry.edge_id)
        for rec in list(self.edges.values()):
            pump = rec.send_pump
            if pump is not None and pump.conn is conn:
                pump.fault(code, f"connection to node {conn.peer_node_id} lost: {reason}")
        self._status()

    def _on_refused(self, addr: tuple[str, int], why: str) -> None:
        self.refused_peers += 1
        log.warning(
            "edge.peer_refused",
            peer=f"{addr[0]}:{addr[1]}",
            reason=common_pb2.StreamFaultReason.Name(common_pb2.STREAM_FAULT_PEER_NOT_AUTHORIZED),
            detail=why,
            component=common_pb2.Component.Name(common_pb2.COMPONENT_EDGE_DRIVER),
        )

    # ---- pump callbacks ----

    def _sender_blocked(self, pump: SendPump) -> None:
        assert pump.conn is not None
        self._blocked.setdefault(pump.conn.uid, set()).add(pump)

    def _pump_ended(self, pump: RecvPump | SendPump, clean: bool, reason: int, detail: str) -> None:
        rec = self.edges.get((pump.edge_id, RECV if isinstance(pump, RecvPump) else SEND))
        if rec is None or (rec.recv_pump is not pump and rec.send_pump is not pump):
            return
        if isinstance(pump, RecvPump):
            self._incoming.pop((pump.conn.uid, pump.stream_id), None)
        if clean:
            log.info("edge.stream_closed", edge_id=rec.edge_id, ring_id=rec.ring_id, bytes=pump.bytes)
            self._emit(rec, edge_pb2.EdgeEvent(closed=edge_pb2.StreamClosed(edge_id=rec.edge_id)))
        else:
            self._fault(rec, reason, detail)

    # ---- events ----

    def _fault(self, rec: EdgeRecord, reason: int, detail: str) -> None:
        pump = rec.recv_pump or rec.send_pump
        if pump is not None and pump.state not in (PumpState.FAULTED, PumpState.STOPPED, PumpState.CLOSED):
            pump.fault(reason, detail)  # calls back into _pump_ended -> _fault once more, then stops
            return
        if rec.last_event is not None and rec.last_event.WhichOneof("event") == "fault":
            return
        self._fault_event(rec.edge_id, reason, detail, rec)
        self._status()

    def _fault_event(self, edge_id: int, reason: int, detail: str, rec: EdgeRecord | None = None) -> None:
        log.warning(
            "edge.stream_fault",
            edge_id=edge_id,
            ring_id=rec.ring_id if rec else 0,
            reason=common_pb2.StreamFaultReason.Name(reason),
            component=common_pb2.Component.Name(common_pb2.COMPONENT_EDGE_DRIVER),
            detail=detail,
        )
        event = edge_pb2.EdgeEvent(fault=edge_pb2.StreamFault(edge_id=edge_id, reason=reason, detail=detail))  # type: ignore[arg-type]
        if rec is not None:
            self._emit(rec, event, logged=True)
        else:
            self._publish(event, edge_id)

    def _emit(self, rec: EdgeRecord, event: edge_pb2.EdgeEvent, logged: bool = False) -> None:
        kind = event.WhichOneof("event")
        if not logged:
            log.info(f"edge.{kind}", edge_id=rec.edge_id, ring_id=rec.ring_id)
        if kind != "pump_stopped":
            rec.last_event = event
        self._publish(event, rec.edge_id)

    def _publish(self, event: edge_pb2.EdgeEvent, edge_id: int) -> None:
        if event.WhichOneof("event") in ("closed", "fault", "pump_stopped"):
            self._flush_timings()  # timings of an edge reach watchers before its end
        event.time_us = time.time_ns() // 1000
        event.node_id = self.node_id
        for w in self.watchers:
            w.offer(event, edge_id)

    def watch(self, edge_ids: set[int], replay_current: bool, object_timings: bool = False) -> Watcher:
        w = Watcher(edge_ids, object_timings)
        if replay_current:
            for rec in self.edges.values():
                if rec.last_event is not None:
                    w.offer(rec.last_event, rec.edge_id)
        self.watchers.add(w)
        return w

    # ---- status ----

    def status(self) -> edge_pb2.EdgeDriverStatus:
        st = edge_pb2.EdgeDriverStatus(
            node_id=self.node_id,
            endpoint=f"{self.endpoint.address[0]}:{self.endpoint.address[1]}" if self.endpoint.address else "",
            cert_fingerprint=self.identity.fingerprint,
            pending_streams=len(self.rendezvous.pending_streams),
        )
        for conn in self.endpoint.connections:
            if conn.closed:
                continue
            st.connections.append(
                edge_pb2.ConnectionStatus(
                    peer_node_id=conn.peer_node_id or 0,
                    peer_address=f"{conn.peer_addr[0]}:{conn.peer_addr[1]}" if conn.peer_addr else "",
                    initiated_here=conn.initiated_here,
                    streams=len(conn.quic._streams),
                    max_datagram_size=conn.max_datagram_size,
                )
            )
        for rec in self.edges.values():
            pump = rec.recv_pump or rec.send_pump
            st.edges.append(
                edge_pb2.EdgeStatus(
                    edge_id=rec.edge_id,
                    ring_id=rec.ring_id,
                    role=rec.role,  # type: ignore[arg-type]
                    state=rec.state,
                    peer_node_id=rec.peer_node_id,
                    bytes=pump.bytes if pump else 0,
                )
            )
        return st

    def status_line(self) -> str:
        conns = sum(1 for c in self.endpoint.connections if not c.closed and c.handshake.done())
        faulted = sum(1 for r in self.edges.values() if r.state == PumpState.FAULTED.value)
        return f"{conns} connections, {len(self.edges)} edges ({faulted} faulted), {len(self.rendezvous.pending_streams)} parked streams"

    def _status(self) -> None:
        """Coalesced STATUS= update: at most one per STATUS_INTERVAL, only when the line changed."""
        if self._status_timer is None:
            self._status_timer = self._loop.call_later(STATUS_INTERVAL, self._send_status)

    def _send_status(self) -> None:
        self._status_timer = None
        line = self.status_line()
        if line != self._status_sent:
            self._status_sent = line
            notify_status(line)
