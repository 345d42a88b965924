"""The orchestrator's token endpoints on real edges (spec §10, §13 Provisioning, §26, §38).

For one run: the token-in edge (this host produces, stage 0 consumes) and the token-out edge (the
last stage produces, this host consumes). Each edge goes through the worker's EdgeEstablisher core
— lease a ring from the local arena-manager, install it, EstablishSend / EstablishRecv on the local
edge-driver, and on close the §38 order StopPump -> ring quiesced -> release — with this process
as the ring host: InstallRing opens a ring-rs handle here, UninstallRing closes it.
`EndpointsReady` is reported once both edges are Ready and share the driver's wake eventfds.
With plan.trace_objects, the driver's object timings of this host's two edge ends are relayed as EDGE_OBJECT_SENT (token-in,
with counter produced_us: when `inject` had committed the object) and EDGE_OBJECT_RECEIVED
(token-out) lifecycle events (issue 7, swactor.edgeend.timings).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.common.ids import new_id
from swactor.common.reasons import name
from swactor.common.ringport import open_consumer, open_producer
from swactor.edgeend import establisher as est
from swactor.edgeend.establisher_shell import DEFAULT_LEASE_TIMEOUT_S, EdgeOutcome, EstablisherShell
from swactor.edgeend.ports import ArenaPort, DriverPort
from swactor.edgeend.timings import relay_object_timings
from swactor.orchestrator.fleet.fleet import FleetError, Report
from swactor.orchestrator.planning.planner import EdgePlan, RunPlan
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.tokens.token_rings import TokenReader, TokenWriter
from swactor.v1 import common_pb2 as pb
from swactor.v1 import edge_pb2

TOKEN_IN_PORT, TOKEN_OUT_PORT = 0, 1


class RingTokenEndpoints:
    """`TokenEndpoints` of one run over two leased rings and the local edge-driver."""

    def __init__(self, plan: RunPlan, report: Report, arena: ArenaPort, driver: DriverPort, arena_map: Any,
                 *, close_timeout_s: float = 20.0, lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S) -> None:
        self.plan = plan
        self.report = report
        self.arena_map = arena_map
        self.close_timeout_s = close_timeout_s
        tin, tout = plan.token_in, plan.token_out
        self.token_in_edge, self.token_out_edge = tin.edge_id, tout.edge_id
        self._plans: dict[int, EdgePlan] = {tin.edge_id: tin, tout.edge_id: tout}
        self._provisions = {
            tin.edge_id: est.EdgeProvision(tin.edge_id, "Egress", tin.consumer.node_id, TOKEN_IN_PORT, tin.object_spec,
                                           tin.ring_spec(pb.RING_DIRECTION_EGRESS)),
            tout.edge_id: est.EdgeProvision(tout.edge_id, "Ingress", tout.producer.node_id, TOKEN_OUT_PORT,
                                            tout.object_spec, tout.ring_spec(pb.RING_DIRECTION_INGRESS)),
        }
        self._ends: dict[int, Any] = {}  # ring_id -> ProducerEnd | ConsumerEnd
        self._edge_ring: dict[int, int] = {}
        self._ready: set[int] = set()
        self._stopped: set[int] = set()
        self._all_stopped = asyncio.Event()
        self._failed = False
        self._announced = False
        self.writer: TokenWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._reader_ring = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._driver_task: asyncio.Task[None] | None = None
        self._timing_task: asyncio.Task[None] | None = None
        self._committed_us: dict[int, int] = {}  # token-in sequence -> commit stamp, until its timing arrives
        self.log = get_logger(run_id=plan.run_id, component="token_endpoints")
        self.edges = EstablisherShell(arena, driver, self, self._outcome, self._spawn, self.log,
                                      lease_timeout_s=lease_timeout_s)

    # ---- lifecycle ----

    async def start(self) -> None:
        self._driver_task = asyncio.create_task(self._follow_driver())
        if self.plan.trace_objects:  # this host's edge timings: only a traced run records them
            self._timing_task = asyncio.create_task(self._follow_timings())
        for provision in self._provisions.values():
            self._est(est.Provision(provision, new_id()))

    async def inject(self, sequence: int, token_ids, flags: int = 0) -> None:
        if self.writer is None:
            raise FleetError(pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, "token-in edge is not ready")
        await self.writer.write(sequence, list(token_ids), flags)
        if self.plan.trace_objects and len(self._committed_us) < 4096:
            self._committed_us[sequence] = wall_us()

    async def close(self) -> None:
        """§38 for both edges; FleetError(RUN_FAULT_TEARDOWN_TIMEOUT) naming the edges (and their
        teardown states) not stopped within close_timeout_s -- the runner records it in run_torn_down."""
        for edge_id in self._provisions:
            self._est(est.StopEdge(edge_id))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.close_timeout_s
        try:
            await asyncio.wait_for(self._all_stopped.wait(), self.close_timeout_s)
            # An edge stopped while waiting for its lease is Stopped at once, but the arena may have
            # granted the lease meanwhile: the LeaseRing call still running delivers that grant, which
            # is then released as never installed. Cancelling it would leave the range leased.
            while self._tasks and (left := deadline - loop.time()) > 0:
                await asyncio.wait(set(self._tasks), timeout=left)
        except TimeoutError:
            pending = sorted(set(self._provisions) - self._stopped)
            self.log.warning("token_endpoints_close_timeout", pending=pending)
            states = ", ".join(f"{self._name(e)} edge {e} ({getattr(self.edges.core.state(e), 'value', 'unknown')})"
                               for e in pending)
            raise FleetError(pb.RUN_FAULT_TEARDOWN_TIMEOUT,
                             f"{states} not stopped within {self.close_timeout_s:g}s") from None
        finally:
            for task in [self._driver_task, self._timing_task, self._reader_task, *self._tasks]:
                if task is not None:
                    task.cancel()

    # ---- the establisher shell: outcomes, and this process as the ring host ----

    def _est(self, inp: est.Input) -> None:
        self.edges.handle(inp)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _outcome(self, a: EdgeOutcome) -> None:
        match a:
            case est.EdgeReady(edge_id, _ring_id):
                self._ready.add(edge_id)
                self._maybe_announce()
            case est.EdgeFailed(edge_id, reason, _component, detail):
                self._fail(reason, f"{self._name(edge_id)} edge {edge_id}: {name(pb.RunFaultReason, reason)}: {detail}")
            case est.EdgeStopped(edge_id):
                self._stopped.add(edge_id)
                if self._stopped >= set(self._provisions):
                    self._all_stopped.set()

    def install(self, edge: est.EdgeProvision, layout: Any) -> bool:
        opener = open_producer if edge.direction == "Egress" else open_consumer
        self._ends[layout.ring_id] = opener(self.arena_map, layout)
        self._edge_ring[edge.edge_id] = layout.ring_id
        return True

    def uninstall(self, ring_id: int, reason: int) -> bool:
        end = self._ends.pop(ring_id, None)
        if end is not None:
            if ring_id == self._reader_ring and self._reader_task is not None:
                self._reader_task.cancel()  # the reader never touches the ring after this
            end.release()
        return True

    def wake_fds(self, edge_id: int, ring_id: int, fds: tuple[int, int] | None) -> None:
        end = self._ends.get(ring_id)
        if fds is not None and end is not None:
            end.reopen(*fds)  # share the pump's eventfds: commits/consumes wake each other

    def _name(self, edge_id: int) -> str:
        return "token-in" if edge_id == self.token_in_edge else "token-out"

    def _fail(self, reason: int, detail: str) -> None:
        if not self._failed:
            self._failed = True
            self.report(F.EndpointFault(reason, detail))

    def _maybe_announce(self) -> None:
        edges = set(self._provisions)
        if self._announced or self._failed or not self._ready >= edges:  # Ready: with the pumps' eventfds
            return
        self._announced = True
        tin, tout = self._plans[self.token_in_edge], self._plans[self.token_out_edge]
        self.writer = TokenWriter(self._ends[self._edge_ring[tin.edge_id]], tin.object_spec, edge_id=tin.edge_id)
        self._reader_ring = self._edge_ring[tout.edge_id]
        reader = TokenReader(self._ends[self._reader_ring], tout.object_spec, edge_id=tout.edge_id)
        self._reader_task = asyncio.create_task(reader.run(self.report))
        self.report(F.EndpointsReady())
        self.log.info("token_endpoints_ready", token_in_edge=tin.edge_id, token_out_edge=tout.edge_id)

    async def _follow_driver(self) -> None:
        mine = set(self._provisions)
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await self.edges.follow_driver(lambda ev: getattr(ev, "edge_id", None) in mine)
            except Exception as e:
                # Without this stream no PumpStopped arrives and close() could only time out: say so.
                self.log.exception("edge_driver_events_lost", detail=f"{type(e).__name__}: {e}")
                self._fail(pb.RUN_FAULT_STREAM_FAULT, f"edge-driver event stream lost: {type(e).__name__}: {e}")


    async def _follow_timings(self) -> None:
        def relay(ev: pb.LifecycleEvent) -> None:
            if ev.kind == pb.EDGE_OBJECT_SENT:
                ev.counters["produced_us"] = self._committed_us.pop(ev.sequence, 0)
            self.report(F.Relay(ev))

        ends = {self.token_in_edge: edge_pb2.EDGE_ROLE_SEND, self.token_out_edge: edge_pb2.EDGE_ROLE_RECV}
        await relay_object_timings(self.edges.driver, ends, run_id=self.plan.run_id, node_id=self.plan.orchestrator_node_id,
                                   stage_index=None, emit=relay, log=self.log)


class RingEndpointFactory:
    """`EndpointFactory` for StageControlFleet: the local arena-manager and edge-driver, made on first use
    and made again after `forget` (the arena-manager they were made with is gone)."""

    def __init__(self, connect: Callable[[], Awaitable[tuple[ArenaPort, DriverPort, Any]]], *,
                 lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S) -> None:
        self._connect = connect
        self.lease_timeout_s = lease_timeout_s
        self._ports: tuple[ArenaPort, DriverPort, Any] | None = None

    def forget(self, detail: str) -> None:
        """The local arena-manager's hand-out connection ended: the next run connects to its successor
        (a new memfd, a new holder id); runs still using the old ports fail on their own."""
        if self._ports is not None:
            get_logger(component="token_endpoints").warning("arena_lost_reconnect_next_run", detail=detail)
        self._ports = None

    async def open(self, plan: RunPlan, report: Report) -> RingTokenEndpoints:
        if self._ports is None:
            try:
                self._ports = await self._connect()
            except Exception as e:
                raise FleetError(pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED,
                                 f"local arena-manager / edge-driver unreachable: {type(e).__name__}: {e}") from None
        arena, driver, arena_map = self._ports
        # One edge owner per run: a run's edges end with its own driver stream, whatever other runs do.
        endpoints = RingTokenEndpoints(plan, report, arena, driver.for_new_owner(), arena_map,
                                       lease_timeout_s=self.lease_timeout_s)
        await endpoints.start()
        return endpoints
