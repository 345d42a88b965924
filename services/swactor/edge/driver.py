"""The edge driver (spec §24-25): the asyncio shell around the edge table.

The table (table.py) and its pumps decide; this module does the I/O around them:

* requests from the gRPC servicer: open the edge's ring (RingSource), dial the peer (Endpoint;
  an edge to this very node goes over the in-process local link instead, locallink.py),
  StopEdge (release the rings it stopped); an owner's last WatchEdges stream ending stops every
  edge it established (owners.py);
* the host's arena-manager gone (its hand-out connection ended): no new edges; the driver
  retires (`retired`, the service exits for its manager to restart it on the new arena) once its
  owners stopped their edges, or after ARENA_LOST_GRACE_S;
* the endpoint's ConnectionListener (and the local link's, the same events): stream events into
  the table, with the time;
* ring wakes: every pumped ring's eventfd is on the loop; a wake is acked here, then goes to the
  table (RingReadable for a send pump, RingWritable for a recv pump). Every WAKE_CHECK_S the pumps
  asleep on their rings are looked at again: one whose ring can progress while its eventfd was never
  signalled lost its wake-up (`edge.ring_wake_missed`) and goes on (ringport.py: every process that
  sleeps on ring eventfds does so);
* after every input, the table's outputs: transmit the connections it queued data on, publish its
  events to watchers (watchers.py; an edge's object timings first, timingflush.py), re-arm the
  rendezvous timer, refresh systemd's STATUS= (status.py).

Connections handed to the table come from `Endpoint.connection_to` (dials) and the endpoint's
accept path, whose admission policy is `admission.ConnectionAdmission`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.common.ringport import WAKE_CHECK_S, wake_lost
from swactor.edge.config import EdgeConfig
from swactor.edge.connection import PeerNotAuthorized, PeerUnreachable
from swactor.edge.endpoint import Endpoint
from swactor.edge.identity import EdgeIdentity
from swactor.edge.locallink import LocalLink
from swactor.edge.objtap import ObjectTap
from swactor.edge.owners import EdgeStopCause, OwnerStreams
from swactor.edge.peers import PeerDirectory
from swactor.edge.ring_source import RingSource
from swactor.edge.status import StatusNotifier, driver_status, status_line
from swactor.edge.streamport import StreamPort
from swactor.edge.table import RECV, SEND, EdgeError, EdgeRecord, EdgeTable, SendEdge
from swactor.edge.timingflush import TapKey, TimingTaps
from swactor.edge.watchers import Watcher, Watchers
from swactor.v1 import common_pb2, edge_pb2

log = get_logger(component="COMPONENT_EDGE_DRIVER")
END_KINDS = frozenset({"closed", "fault", "pump_stopped"})
# After the arena is gone, how long the owners have to stop their edges (their own §38 teardown)
# before the driver stops what is left and retires.
ARENA_LOST_GRACE_S = 10.0


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
        self.table = EdgeTable(rendezvous_timeout=config.rendezvous_timeout, stream_window=config.stream_window,
                               send_queue_limit=config.send_queue_limit)
        self.watchers = Watchers(node_id)
        self.owners = OwnerStreams()
        self.arena_gone: str | None = None  # why, once the arena-manager's hand-out connection ended
        self.retired = asyncio.Event()  # arena gone and no edge left: the service should exit
        self.taps = TimingTaps(on_done=self._arm_flush)
        self._loop = asyncio.get_running_loop()
        self.local = LocalLink(node_id=node_id, listener=self, initial_window=config.initial_stream_window,
                               loop=self._loop)
        self._status = StatusNotifier(self.status_line)
        self._dials: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._ring_fds: dict[EdgeRecord, int] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at: float | None = None
        self._flush_timer: asyncio.TimerHandle | None = None
        self._wake_check: asyncio.TimerHandle | None = None

    # ---- lifecycle ----

    def start(self) -> tuple[str, int]:
        address = self.endpoint.bind(self.config.bind)
        self._wake_check = self._loop.call_later(WAKE_CHECK_S, self._check_wakes)
        return address

    async def close(self) -> None:
        for edge_id in {k[0] for k in self.table.edges}:
            self.stop_edge(edge_id, cause=EdgeStopCause.DRIVER_CLOSING)
        self.local.close("edge driver stopping")
        for timer in (self._expiry, self._flush_timer, self._wake_check):
            if timer is not None:
                timer.cancel()
        self._status.close()
        await self.endpoint.close()
        self.watchers.close()

    # ---- requests (gRPC servicer) ----

    async def establish_send(self, edge_id: int, rx_node_id: int, ring_id: int, layout: object,
                             owner_id: int = 0) -> None:
        self._check_request(edge_id, ring_id, SEND, rx_node_id)
        ring = await self._open_ring(self.rings.open_consumer, edge_id, SEND, ring_id, layout)
        tap = self._tap(edge_id, SEND, ring_id, rx_node_id)
        rec = self.table.add_send(edge_id, ring_id, rx_node_id, ring, tap, owner_id)
        self._watch_ring(rec)
        self._dials[(edge_id, SEND)] = asyncio.ensure_future(self._dial(rec))
        self._after()

    async def _dial(self, rec: SendEdge) -> None:
        if rec.peer_node_id == self.node_id:
            self._connect_local(rec)
        else:
            try:
                conn = await self.endpoint.connection_to(rec.peer_node_id)
            except PeerNotAuthorized as e:
                self.table.dial_failed(rec, common_pb2.STREAM_FAULT_PEER_NOT_AUTHORIZED, str(e))
            except (PeerUnreachable, OSError) as e:
                self.table.dial_failed(rec, common_pb2.STREAM_FAULT_PEER_UNREACHABLE, str(e))
            else:
                self.table.connected(rec, conn, wall_us())
        if self._dials.get((rec.edge_id, SEND)) is asyncio.current_task():
            del self._dials[(rec.edge_id, SEND)]
        self._after()

    def _connect_local(self, rec: SendEdge) -> None:
        """Both ends on this host: a QUIC connection to ourselves would only add TLS and loopback
        packets between two rings of one arena, so the edge goes over the local link."""
        sender = self.local.sender
        self.table.connected(rec, sender, wall_us())
        if rec.pump.conn is sender:  # not when a StopEdge came first
            log.info("edge.local_link", edge_id=rec.edge_id, ring_id=rec.ring_id, node_id=self.node_id)

    async def establish_recv(self, edge_id: int, ring_id: int, tx_node_id: int, layout: object,
                             owner_id: int = 0) -> None:
        self._check_request(edge_id, ring_id, RECV, tx_node_id)
        ring = await self._open_ring(self.rings.open_producer, edge_id, RECV, ring_id, layout)
        try:
            rec = self.table.add_recv(edge_id, ring_id, tx_node_id, ring, self._tap(edge_id, RECV, ring_id, tx_node_id),
                                      self._loop.time(), wall_us(), owner_id)
        except EdgeError:
            ring.release()
            raise
        self._watch_ring(rec)
        self._after()

    def _check_request(self, edge_id: int, ring_id: int, role: int, peer_node_id: int) -> None:
        """Refused before the ring is opened: no arena, an end already established, or no peer named."""
        self._check_arena()
        self.table.check_new(edge_id, ring_id, role)
        if peer_node_id == 0:
            raise EdgeError("rx_node_id must be set" if role == SEND
                            else "tx_node_id (the edge's planned producer node) must be set")

    async def _open_ring(self, open_end: Callable[[int, Any], Awaitable[Any]], edge_id: int, role: int,
                         ring_id: int, layout: object) -> Any:
        which = "egress" if role == SEND else "ingress"
        try:
            ring = await open_end(ring_id, layout)
        except Exception as e:
            raise EdgeError(f"edge {edge_id}: cannot open {which} ring {ring_id}: {e}", "ring") from e
        try:
            self.table.check_new(edge_id, ring_id, role)  # a concurrent establish may have won meanwhile
            self._check_arena()  # ... or the arena went away
        except EdgeError:
            ring.release()
            raise
        return ring

    def _check_arena(self) -> None:
        if self.arena_gone is not None:
            raise EdgeError(f"the host's arena-manager is gone ({self.arena_gone}); this driver is retiring", "ring")

    def stop_edge(self, edge_id: int, ring_id: int = 0, cause: EdgeStopCause = EdgeStopCause.STOP_EDGE) -> bool:
        """Stop the end of `edge_id` on `ring_id` (0: both ends this host has); False when it has none."""
        recs = self.table.stop_edge(edge_id, ring_id, cause)
        self._stopped(recs)
        return bool(recs)

    def _stopped(self, recs: list[EdgeRecord]) -> None:
        for rec in recs:
            dial = self._dials.pop((rec.edge_id, rec.role), None)
            if dial is not None:
                dial.cancel()
            self._unwatch_ring(rec)
            rec.pump.ring.release()  # the pump is Stopped: it never touches the ring again
        self._after()
        if self.arena_gone is not None and not self.table.edges:
            self.retired.set()

    def watch(self, edge_ids: set[int], replay_current: bool, object_timings: bool = False,
              owner_id: int = 0) -> Watcher:
        replay = [(r.last_event, r.edge_id) for r in self.table.edges.values()
                  if r.last_event is not None] if replay_current else []
        if object_timings:  # what its edges' pumps timed before it came (timingflush.py: the backlog)
            self._flush_timings()
            replay += [(self.watchers.stamp(ev), eid) for ev, eid in self.taps.take_backlog(edge_ids)]
        watcher = self.watchers.watch(edge_ids, replay, object_timings, owner_id)
        self.owners.opened(owner_id)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        """A WatchEdges stream ended; its owner's last one: the owner is gone, so are its edges."""
        self.watchers.discard(watcher)
        if self.owners.closed(watcher.owner_id):
            self.stop_owner(watcher.owner_id)

    def stop_owner(self, owner_id: int) -> None:
        keys = self.table.owned_by(owner_id)
        # An owner that ended its last stream after a clean teardown has no edges left: not news.
        (log.warning if keys else log.debug)("edge.owner_gone", owner_id=owner_id, edges=len(keys),
                                              cause=EdgeStopCause.OWNER_GONE.value)
        self._stopped([rec for edge_id, role in keys
                       if (rec := self.table.stop_end(edge_id, role, EdgeStopCause.OWNER_GONE)) is not None])

    # ---- the arena-manager gone ----

    def arena_lost(self, detail: str) -> None:
        """The arena's hand-out connection ended: every ring here belongs to a memfd nobody manages
        any more, and a new arena-manager hands out a new one. Refuse new edges; let the owners tear
        theirs down (they notice too), then retire."""
        if self.arena_gone is not None:
            return
        self.arena_gone = detail
        log.error("edge.arena_lost", detail=detail, edges=len(self.table.edges), cause=EdgeStopCause.ARENA_LOST.value)
        self._loop.call_later(ARENA_LOST_GRACE_S, self._arena_grace_over)
        self._stopped([])

    def _arena_grace_over(self) -> None:
        self._stopped([rec for key in list(self.table.edges)
                       if (rec := self.table.stop_end(*key, EdgeStopCause.ARENA_LOST)) is not None])
        self.retired.set()

    def status(self) -> edge_pb2.EdgeDriverStatus:
        return driver_status(self.node_id, self.identity.fingerprint, self.endpoint, self.table,
                             self.taps.transfer_protos())

    def status_line(self) -> str:
        return status_line(self.endpoint, self.table)

    # ---- ConnectionListener (called inside the endpoint's event processing, which transmits
    # the connection afterwards; the local link's delivery pass does the same for its ends) ----

    def on_stream_data(self, conn: StreamPort, stream_id: int, data: bytes, end: bool) -> None:
        table = self.table
        table.stream_data(conn, stream_id, data, end, self._loop.time(), wall_us())
        if table.outbox or table.transmit or table.deadline_moved:
            self._after(conn)

    def on_stream_reset(self, conn: StreamPort, stream_id: int, error_code: int) -> None:
        self.table.stream_reset(conn, stream_id, error_code)
        self._after(conn)

    def on_stop_sending(self, conn: StreamPort, stream_id: int, error_code: int) -> None:
        self.table.stop_sending(conn, stream_id, error_code)
        self._after(conn)

    def on_progress(self, conn: StreamPort) -> None:
        table = self.table
        table.progress(conn, wall_us())
        if table.outbox or table.transmit:
            self._after(conn)

    def on_connection_lost(self, conn: StreamPort, reason: str, not_authorized: bool) -> None:
        self.table.connection_lost(conn, reason, not_authorized)
        self._after(conn)
        self._status.changed()

    # ---- ring wakes ----

    def _watch_ring(self, rec: EdgeRecord) -> None:
        fd = rec.pump.ring.fileno()
        self._ring_fds[rec] = fd
        self._loop.add_reader(fd, self._on_ring_wake, rec)

    def _unwatch_ring(self, rec: EdgeRecord) -> None:
        fd = self._ring_fds.pop(rec, None)
        if fd is not None:
            self._loop.remove_reader(fd)

    def _on_ring_wake(self, rec: EdgeRecord) -> None:
        rec.pump.ring.ack()
        table = self.table
        table.ring_wake(rec, wall_us())
        if table.transmit or table.outbox:
            self._after()

    def _check_wakes(self) -> None:
        self._wake_check = self._loop.call_later(WAKE_CHECK_S, self._check_wakes)
        missed = [rec for rec in self.table.asleep_on_rings()
                  if rec.pump.ring.arm_wait() is None and wake_lost(rec.pump.ring, rec.pump.ring.fileno())]
        for rec in missed:
            log.warning("edge.ring_wake_missed", edge_id=rec.edge_id, ring_id=rec.ring_id,
                        role=edge_pb2.EdgeRole.Name(rec.role), state=rec.state, waited_s=WAKE_CHECK_S)  # type: ignore[arg-type]
            self.table.ring_wake(rec, wall_us())
        if missed:
            self._after()

    # ---- the table's outputs ----

    def _after(self, in_progress: StreamPort | None = None) -> None:
        """Carry out what the last input left in the table. `in_progress`: the connection whose
        events are being processed; the endpoint transmits it afterwards anyway (the local link's
        pass schedules another when its inputs queued more)."""
        table = self.table
        if table.transmit:
            for conn in table.transmit:
                if conn is not in_progress:
                    conn.transmit()  # type: ignore[attr-defined]
            table.transmit.clear()
        if table.deadline_moved:
            table.deadline_moved = False
            self._arm_expiry()
        if table.outbox:
            outbox, table.outbox = table.outbox, []
            for event, edge_id, rec in outbox:
                if event.WhichOneof("event") in END_KINDS:
                    self._flush_timings()  # an edge's timings reach watchers before its end
                    if rec is not None:
                        self._unwatch_ring(rec)
                self.watchers.publish(event, edge_id)
            self._status.changed()

    def _arm_expiry(self) -> None:
        deadline = self.table.next_deadline()
        if deadline == self._expiry_at:
            return
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = deadline
        self._expiry = None if deadline is None else self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._expiry = self._expiry_at = None
        self.table.expire(self._loop.time())
        self._after()

    # ---- object timings (objtap.py, timingflush.py) ----

    def _tap(self, edge_id: int, role: int, ring_id: int, peer_node_id: int) -> ObjectTap | None:
        if not self.config.object_timing:
            return None
        self._flush_timings()  # a previous end of this edge id: its marks go out first
        return self.taps.new_tap(edge_id, role, ring_id, peer_node_id)

    def _arm_flush(self) -> None:
        if self._flush_timer is None:
            self._flush_timer = self._loop.call_later(self.config.object_timing_flush_s, self._flush_timings)

    def _flush_timings(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        for event, edge_id in self.taps.drain(self._live_tap, self.watchers.watch_timings):
            self.watchers.publish(event, edge_id)

    def _live_tap(self, key: TapKey) -> ObjectTap | None:
        rec = self.table.edges.get(key)
        return None if rec is None else rec.pump.tap
