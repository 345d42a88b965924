"""The stage node: StageController + EdgeEstablisher + GpuWorkerCtl wired to the local services.

This is the asyncio shell around the I/O-free cores (stage_fsm, establisher, ctl_fsm): it feeds
them events (worker events, arena/driver outcomes, orchestrator calls) and executes the actions
they return. One run at a time per node (§43: concurrent runs on one stage chain are deferred);
a later run of the same weights re-uses them (warm ConfigureRole). NodeAvailable (§8) is reported
only once the arena is mapped, the worker said WorkerReady and the edge-driver answers. A run is held
under the orchestrator's lease (stage_lease.py): with no WatchStage stream for `lease_window_s` the
stage faults fail-stop and tears itself down. Every stage event carries the worker's generation.
When the host's arena-manager dies (`arena_lost`) the running stage faults fail-stop
(RUN_FAULT_NODE_UNAVAILABLE by COMPONENT_ARENA) and tears down, the node is withdrawn, and `retired`
is set once no run is left: the service then exits for its manager to restart it on the new arena.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from swactor.common.events import get_logger
from swactor.common.ids import new_id
from swactor.edgeend import establisher as est
from swactor.edgeend.establisher_shell import DEFAULT_LEASE_TIMEOUT_S, EdgeOutcome, EstablisherShell
from swactor.edgeend.ports import ArenaPort, DriverPort
from swactor.edgeend.timings import relay_object_timings
from swactor.v1 import common_pb2, edge_pb2, stage_pb2
from swactor.worker import stage_fsm
from swactor.worker.ctl_fsm import CtlState, WorkerCrashed, WorkerFailed
from swactor.worker.ctl_port import WorkerCtlLike, WorkerRingHost
from swactor.worker.membership import MembershipPort
from swactor.worker.plan import PlanRejected, build_plan
from swactor.worker.process import wire
from swactor.worker.stage_lease import DEFAULT_WINDOW_S, StageLease
from swactor.worker.tracebatch import PER_OBJECT_KINDS, SequenceBatches
from swactor.worker.weights import WeightsFetcher, WeightsShell

MAX_WORKER_RESTARTS = 3
KEEP_FINISHED_RUNS = 16


class ProvisionError(Exception):
    """ProvisionStage refused: `code` is the gRPC status name the servicer answers with."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass
class RunLog:
    """Every StageUpdate of one run, for WatchStage replay and live following."""

    run_id: int
    stage_index: int
    orchestrator_node_id: int  # who provisioned it: the only caller of StopRun / WatchStage for it
    updates: list[stage_pb2.StageUpdate] = field(default_factory=list)
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    traced: SequenceBatches = field(default_factory=SequenceBatches)  # per-object events (trace_objects runs)

    def add(self, update: stage_pb2.StageUpdate) -> None:
        self.updates.append(update)
        if update.WhichOneof("update") == "stopped":
            self.done = True
        self.changed.set()
        self.changed = asyncio.Event()


def _now_us() -> int:
    return time.time_ns() // 1000


class StageNode:
    def __init__(self, node_id: int, ctl: WorkerCtlLike, arena: ArenaPort, driver: DriverPort,
                 membership: MembershipPort | None = None, *, control_endpoint: str = "",
                 orchestrator_node_id: int | None = None, weights: WeightsFetcher | None = None,
                 lease_window_s: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 arena_pressure_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S) -> None:
        self.node_id = node_id
        self.ctl = ctl
        self.membership = membership
        self.control_endpoint = control_endpoint
        self.orchestrator_node_id = orchestrator_node_id
        self._log = get_logger(node_id=node_id, component="stage_node")
        self.edges = EstablisherShell(arena, driver, WorkerRingHost(ctl), self._edge_outcome, self._spawn, self._log,
                                      lease_timeout_s=arena_pressure_timeout_s)
        self.stage: stage_fsm.StageController | None = None
        self.runs: dict[int, RunLog] = {}
        self.worker_ready = False
        self.driver_up = False
        self.available = False
        self.arena_gone: str | None = None  # why, once the arena-manager's hand-out connection ended
        self.retired = asyncio.Event()  # arena gone and no run left here: the service should exit
        self.restarts = 0
        self.warm_weights = False
        self.weights = WeightsShell(weights, self._stage_input)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timing_relays: dict[int, asyncio.Task[Any]] = {}  # run_id -> relay_object_timings task
        self.lease_window_s = lease_window_s
        self.lease: StageLease | None = None  # the orchestrator's hold on the active run
        self._lease_timer: asyncio.TimerHandle | None = None
        self._clock = clock
        ctl.subscribe(self._on_worker)

    # ---- boot (§8) ----

    async def start(self) -> None:
        self.ctl.start()
        self._spawn(self._follow_driver())
        self.driver_up = await self.edges.driver.healthy()
        self._check_available()

    async def _follow_driver(self) -> None:
        while True:
            try:
                await self.edges.follow_driver(self._driver_seen)
            except Exception as e:  # the driver restarted or is not up yet: re-subscribe
                self._log.warning("edge_driver_watch_lost", detail=str(e))
            self.driver_up = False
            self._check_available()
            await asyncio.sleep(1.0)
            self.driver_up = await self.edges.driver.healthy()
            self._check_available()

    def _driver_seen(self, ev: Any) -> bool:
        if not self.driver_up:
            self.driver_up = True
            self._check_available()
        return True

    def _check_available(self) -> None:
        if self.arena_gone is not None and not self.retired.is_set():
            return  # withdrawn once retired: membership must not beat the stage's own fault report
        now = self.worker_ready and self.driver_up and self.arena_gone is None
        if now == self.available:
            return
        self.available = now
        self._log.info("node_available" if now else "node_unavailable", worker_ready=self.worker_ready,
                       driver_up=self.driver_up, arena_up=self.arena_gone is None)
        if self.membership is not None:
            generation = self.ctl.worker_generation
            if now:
                self._spawn(self.membership.set_available(self.control_endpoint, generation))
            else:
                reason = common_pb2.RUN_FAULT_WORKER_CRASHED if not self.worker_ready else common_pb2.RUN_FAULT_NODE_UNAVAILABLE
                self._spawn(self.membership.set_faulted(reason, generation))

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("stage_node_task_failed", detail=repr(task.exception()))

    async def close(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        self.weights.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ---- orchestrator calls ----

    def provision(self, req: stage_pb2.ProvisionStageRequest, caller_orchestrator: int | None) -> None:
        if caller_orchestrator is None:
            raise ProvisionError("PERMISSION_DENIED", "the caller's certificate names no orchestrator")
        if self.orchestrator_node_id is not None and caller_orchestrator != self.orchestrator_node_id:
            raise ProvisionError("PERMISSION_DENIED", f"orchestrator {caller_orchestrator} is not the authorised "
                                                      f"orchestrator {self.orchestrator_node_id}")
        if req.orchestrator_node_id != caller_orchestrator:
            raise ProvisionError("PERMISSION_DENIED", f"orchestrator_node_id {req.orchestrator_node_id} is not the "
                                                      f"caller ({caller_orchestrator})")
        if req.node_id != self.node_id:
            raise ProvisionError("PERMISSION_DENIED", f"plan is addressed to node {req.node_id}, this is node {self.node_id}")
        if req.run_id in self.runs:
            raise ProvisionError("ALREADY_EXISTS", f"run {req.run_id} is already provisioned on this node")
        if self.stage is not None and self.stage.state is not stage_fsm.StageState.STOPPED:
            run = self.stage.plan.run_id if self.stage.plan else 0
            if self.stage.state in (stage_fsm.StageState.FAULTED, stage_fsm.StageState.STOPPING):
                # ABORTED: a conflict that ends by itself (the teardown is bounded): the caller may try again
                raise ProvisionError("ABORTED", f"run {run} is still tearing down here")
            raise ProvisionError("FAILED_PRECONDITION", f"run {run} is still active here")
        if not self.worker_ready:
            raise ProvisionError("FAILED_PRECONDITION", "the GPU worker is not ready (WorkerReady not seen)")
        if self.arena_gone is not None:
            raise ProvisionError("FAILED_PRECONDITION", f"the node's arena-manager is gone: {self.arena_gone}")
        try:
            plan = build_plan(req, node_id=self.node_id, role_id=new_id())
        except PlanRejected as e:
            raise ProvisionError("INVALID_ARGUMENT", str(e)) from None
        for eid in (plan.inbound.edge_id, plan.outbound.edge_id):
            self.edges.core.forget(eid)
            if self.edges.core.state(eid) is not None:
                raise ProvisionError("FAILED_PRECONDITION", f"edge {eid} still has a live record on this node")
        for old in [r for r, log in self.runs.items() if log.done][:-KEEP_FINISHED_RUNS or None]:
            del self.runs[old]  # bounded history: WatchStage replays only recent finished runs
        self.runs[plan.run_id] = RunLog(plan.run_id, plan.stage_index, caller_orchestrator)
        self.stage = stage_fsm.StageController(self.node_id)
        self.warm_weights = False
        if plan.trace:  # the edge timings of this run's ends: only a traced run reports them
            ends = {plan.inbound.edge_id: edge_pb2.EDGE_ROLE_RECV, plan.outbound.edge_id: edge_pb2.EDGE_ROLE_SEND}
            self._timing_relays[plan.run_id] = self._spawn(relay_object_timings(  # type: ignore[assignment]
                self.edges.driver, ends, run_id=plan.run_id, node_id=self.node_id, stage_index=plan.stage_index,
                emit=self._relay_timing, log=get_logger(component="stage_node")))
        self._stage(stage_fsm.Provision(plan))
        self.lease = StageLease.grant(plan.run_id, self.lease_window_s, self._clock())
        self._arm_lease()

    def authorize(self, run_id: int, caller_orchestrator: int | None) -> None:
        """StopRun / WatchStage for `run_id` come only from the orchestrator that provisioned it
        (spec §4); ProvisionError PERMISSION_DENIED otherwise. An unknown run passes (the call
        itself answers known=false / NOT_FOUND)."""
        if caller_orchestrator is None:
            raise ProvisionError("PERMISSION_DENIED", "the caller's certificate names no orchestrator")
        log = self.runs.get(run_id)
        if log is not None and log.orchestrator_node_id != caller_orchestrator:
            self._log.warning("run_call_refused", run_id=run_id, caller=caller_orchestrator,
                              provisioned_by=log.orchestrator_node_id)
            raise ProvisionError("PERMISSION_DENIED", f"run {run_id} was provisioned by orchestrator "
                                                      f"{log.orchestrator_node_id}, not {caller_orchestrator}")

    def stop_run(self, run_id: int) -> bool:
        if run_id not in self.runs:
            return False
        if self.stage is not None and self.stage.plan is not None and self.stage.plan.run_id == run_id:
            self._stage(stage_fsm.StopRun())
        return True

    async def watch(self, run_id: int) -> AsyncIterator[stage_pb2.StageUpdate]:
        log = self.runs.get(run_id)
        if log is None:
            raise KeyError(run_id)
        lease = self.lease if self.lease is not None and self.lease.run_id == run_id else None
        if lease is not None:
            lease.attach(self._clock())
            self._arm_lease()
        try:
            i = 0
            while True:
                changed = log.changed
                while i < len(log.updates):
                    yield log.updates[i]
                    i += 1
                if log.done:
                    return
                await changed.wait()
        finally:  # also when the orchestrator went away: grpc cancels the stream
            if lease is not None:
                lease.detach(self._clock())
                self._arm_lease()

    # ---- the orchestrator's lease (stage_lease.py) ----

    def _arm_lease(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None
        deadline = self.lease.deadline() if self.lease is not None else None
        if deadline is not None:
            delay = max(0.0, deadline - self._clock())
            self._lease_timer = asyncio.get_running_loop().call_later(delay, self._lease_tick)

    def _lease_tick(self) -> None:
        self._lease_timer = None
        if self.lease is None:
            return
        for expired in self.lease.tick(self._clock()):
            self._log.warning("stage_lease_expired", run_id=expired.run_id, unwatched_s=round(expired.unwatched_s, 3),
                              detail=expired.detail)
            self._stage_input(expired.run_id, stage_fsm.ControlLost(expired.detail))
            self._stage_input(expired.run_id, stage_fsm.StopRun())
        self._arm_lease()

    # ---- StageController ----

    def _stage(self, inp: stage_fsm.Input) -> None:
        if self.stage is None:
            return
        for action in self.stage.handle(inp):
            match action:
                case stage_fsm.ProvisionEdge(edge):
                    self._est(est.Provision(edge, new_id()))
                case stage_fsm.StopEdge(edge_id):
                    self._est(est.StopEdge(edge_id))
                case stage_fsm.FetchWeights(request):
                    assert self.stage.plan is not None
                    self.weights.fetch(self.stage.plan.run_id, request)
                case stage_fsm.CancelFetch():
                    self.weights.cancel()
                case stage_fsm.ToWorker(cmd):
                    self.ctl.send(cmd)
                case stage_fsm.Report(event, cause, detail):
                    self._report(event, cause, detail)
        if self.stage.state is stage_fsm.StageState.STOPPED:
            self._maybe_restart_worker()
            self._check_retired()

    # ---- the arena-manager gone ----

    def arena_lost(self, detail: str) -> None:
        """The arena's hand-out connection ended (ArenaHold.on_end). The stage's rings live in a memfd
        nobody manages any more, and a new arena-manager hands out a new one that neither this process
        nor its compute process has mapped: fault the run here first (the orchestrator hears why),
        tear it down, withdraw the node, then retire."""
        if self.arena_gone is not None:
            return
        self.arena_gone = detail
        run_id = self.stage.plan.run_id if self.stage is not None and self.stage.plan is not None else None
        self._log.error("arena_lost", detail=detail, run_id=run_id, reason="RUN_FAULT_NODE_UNAVAILABLE",
                        component="COMPONENT_ARENA")
        if run_id is not None:
            self._stage_input(run_id, stage_fsm.ArenaLost(detail))
            self._stage_input(run_id, stage_fsm.StopRun())
        self._check_retired()

    def _check_retired(self) -> None:
        idle = self.stage is None or self.stage.state in (stage_fsm.StageState.STOPPED,
                                                          stage_fsm.StageState.UNPROVISIONED)
        if self.arena_gone is not None and idle and not self.retired.is_set():
            self._log.info("node_retiring", detail=self.arena_gone)
            self.retired.set()
            self._check_available()

    def _report(self, ev: common_pb2.LifecycleEvent, cause: str = "", detail: str = "") -> None:
        ev.time_us = _now_us()
        ev.worker_generation = self.ctl.worker_generation  # §40: the generation this stage's worker runs
        log = self.runs.get(ev.run_id)
        if ev.kind in PER_OBJECT_KINDS:  # a traced run's: batched per sequence, not logged (several per token)
            if log is not None:
                self._add_traced(log, ev)
            return
        self._log.info("lifecycle", kind=common_pb2.LifecycleEventKind.Name(ev.kind), run_id=ev.run_id,
                       stage_index=ev.stage_index, edge_id=ev.edge_id or None, ring_id=ev.ring_id or None,
                       sequence=ev.sequence if ev.HasField("sequence") else None, step_id=ev.step_id or None,
                       reason=ev.reason or None, component=common_pb2.Component.Name(ev.component),
                       worker_generation=ev.worker_generation)
        if log is None:
            return
        up = stage_pb2.StageUpdate(run_id=ev.run_id, node_id=self.node_id, stage_index=ev.stage_index,
                                   time_us=ev.time_us)
        if ev.kind == common_pb2.WEIGHTS_LOADED:
            self.warm_weights = bool(ev.counters.get("warm", 0))
        if ev.kind == common_pb2.STAGE_READY:
            up.ready.warm_weights = self.warm_weights
        elif ev.kind == common_pb2.STAGE_FAULTED:
            up.fault.reason = common_pb2.RunFaultReason.Value(ev.reason)
            up.fault.component = ev.component
            up.fault.cause = cause
            up.fault.detail = detail
            if ev.reason == "RUN_FAULT_WEIGHTS_LOAD_FAILED" and ev.component == common_pb2.COMPONENT_WORKER:
                self.weights.distrust(ev.run_id)  # the cache copy may be what failed: re-checked before the next run
        elif ev.kind == common_pb2.STAGE_STOPPED:
            if self.lease is not None and self.lease.run_id == ev.run_id:
                self.lease.end()
                self._arm_lease()
            for batch in log.traced.flush():  # what a traced run still held goes out before `stopped`
                self._add_batch(log, batch)
            self.weights.release(ev.run_id)
            relay = self._timing_relays.pop(ev.run_id, None)
            if relay is not None:
                relay.cancel()
            up.stopped.SetInParent()
        else:
            up.event.CopyFrom(ev)
        log.add(up)

    def _relay_timing(self, ev: common_pb2.LifecycleEvent) -> None:
        """An EDGE_OBJECT_* event of a traced run here, with the driver's stamp (edgeend/timings.py)."""
        log = self.runs.get(ev.run_id)
        if log is not None and not log.done:
            self._add_traced(log, ev)

    def _add_traced(self, log: RunLog, ev: common_pb2.LifecycleEvent) -> None:
        for batch in log.traced.add(ev):
            self._add_batch(log, batch)

    def _add_batch(self, log: RunLog, batch: list[common_pb2.LifecycleEvent]) -> None:
        if batch and not log.done:
            log.add(stage_pb2.StageUpdate(run_id=log.run_id, node_id=self.node_id, stage_index=log.stage_index,
                                          time_us=batch[-1].time_us, events=stage_pb2.EventBatch(events=batch)))

    def _stage_input(self, run_id: int, inp: stage_fsm.Input) -> None:
        """An input for run `run_id`'s StageController, dropped if that run is no longer the one here."""
        if self.stage is not None and self.stage.plan is not None and self.stage.plan.run_id == run_id:
            self._stage(inp)

    # ---- worker events ----

    def _on_worker(self, ev: Any) -> None:
        match ev:
            case wire.WorkerReady():
                self.worker_ready = True
                self._check_available()
            case WorkerCrashed() | WorkerFailed():
                self.worker_ready = False
                self._check_available()
                reason = common_pb2.RUN_FAULT_WORKER_CRASHED if isinstance(ev, WorkerCrashed) else common_pb2.RUN_FAULT_WORKER_FATAL
                self._stage(stage_fsm.WorkerGone(reason, ev.detail))
                self._maybe_restart_worker()
            case wire.RingInstalled(ring_id=rid):
                self._est(est.RingInstalled(rid))
            case wire.RingFault(ring_id=rid, reason=r, detail=d):
                self._est(est.RingFault(rid, r, d))
            case wire.RingQuiesced(ring_id=rid):
                self._est(est.RingQuiesced(rid))
            case wire.WorkerStopped() | wire.DeviceObjectReleased() | wire.ReleaseFailed():
                self._log.info("worker_event", worker_event=type(ev).__name__)
            case (wire.RoleProgress() | wire.RoleConfigured() | wire.RoleFailed() | wire.ObjectLoaded()
                  | wire.ObjectFailed() | wire.ObjectProduced() | wire.StepCompleted() | wire.StepFailed()):
                if isinstance(ev, wire.RoleConfigured | wire.StepCompleted):
                    self.restarts = 0
                self._stage(ev)

    def _maybe_restart_worker(self) -> None:
        """Crashed -> Restarting (§31): a new generation, once no stage still depends on the old one."""
        busy = self.stage is not None and self.stage.state is not stage_fsm.StageState.STOPPED
        if busy or self.ctl.state not in (CtlState.FAILED, CtlState.STOPPED):
            return
        if self.restarts >= MAX_WORKER_RESTARTS:
            self._log.error("worker_restart_limit", restarts=self.restarts)
            return
        self.restarts += 1
        self._log.info("worker_restarting", attempt=self.restarts)
        self.ctl.start()

    # ---- EdgeEstablisher ----

    def _est(self, inp: est.Input) -> None:
        self.edges.handle(inp)

    def _edge_outcome(self, a: EdgeOutcome) -> None:
        self._stage(a)  # the StageController takes the establisher's outcomes as they are
