"""The stage node: StageController + EdgeEstablisher + GpuWorkerCtl wired to the local services.

This is the asyncio shell around I/O-free cores: it feeds them events (worker events, arena and
driver outcomes, orchestrator calls, timers) and performs the actions they return. Each decision
lives in its core:

  stage_fsm     the run's stage (§14)                 establisher  its edges (§26, edgeend/)
  admission     which ProvisionStage may take the stage, who may stop or follow a run, run history
  availability  when the node is offered (NodeAvailable §8), withdrawn, and retired after arena loss
  restarts      when a new worker generation starts, and when the node gives up
  stage_lease   when the orchestrator's hold on the run expires (no WatchStage stream)
  tracebatch    how a traced run's per-object events are grouped per sequence

What stays here is plumbing: timers, tasks, the driver subscription, the run logs that WatchStage
replays, and turning a core's action into a call (membership, ctl, stage input). Every stage event
carries the worker's generation. When the node retires (`retired`) the service exits for its manager
to restart it on the new arena.
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
from swactor.worker import availability as avail
from swactor.worker import stage_fsm
from swactor.worker.admission import Ask, RunAdmission, Slot
from swactor.worker.ctl_fsm import WorkerCrashed, WorkerFailed
from swactor.worker.ctl_port import WorkerCtlLike, WorkerRingHost
from swactor.worker.membership import MembershipPort
from swactor.worker.plan import PlanRejected, build_plan
from swactor.worker.process import wire
from swactor.worker.restarts import Restart, WorkerRestarts
from swactor.worker.stage_lease import DEFAULT_WINDOW_S, StageLease
from swactor.worker.tracebatch import PER_OBJECT_KINDS, SequenceBatches
from swactor.worker.weights import WeightsFetcher, WeightsShell


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
    updates: list[stage_pb2.StageUpdate] = field(default_factory=list)
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    traced: SequenceBatches = field(default_factory=SequenceBatches)  # per-object events (trace_objects runs)
    warm_weights: bool = False  # the run's WEIGHTS_LOADED said its weights were resident already

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
        self.admission = RunAdmission(node_id, orchestrator_node_id)
        self.runs: dict[int, RunLog] = {}  # the runs admission remembers, with what WatchStage replays
        self.availability = avail.NodeAvailability(node_id)
        self.retired = asyncio.Event()  # arena gone and no run left here: the service should exit
        self.worker_restarts = WorkerRestarts(node_id)
        self.weights = WeightsShell(weights, self._stage_input)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timing_relays: dict[int, asyncio.Task[Any]] = {}  # run_id -> relay_object_timings task
        self.lease_window_s = lease_window_s
        self.lease: StageLease | None = None  # the orchestrator's hold on the active run
        self._lease_timer: asyncio.TimerHandle | None = None
        self._clock = clock
        ctl.subscribe(self._on_worker)

    # ---- what the availability core decides (§8), read by main and tests ----

    @property
    def available(self) -> bool:
        return self.availability.available

    @property
    def worker_ready(self) -> bool:
        return self.availability.worker_ready

    @property
    def driver_up(self) -> bool:
        return self.availability.driver_up

    @property
    def arena_gone(self) -> str | None:
        return self.availability.arena_gone

    # ---- boot (§8) ----

    async def start(self) -> None:
        self.ctl.start()
        self._spawn(self._follow_driver())
        self._avail(avail.Driver(await self.edges.driver.healthy()))

    async def _follow_driver(self) -> None:
        while True:
            try:
                await self.edges.follow_driver(self._driver_seen)
            except Exception as e:  # the driver restarted or is not up yet: re-subscribe
                self._log.warning("edge_driver_watch_lost", detail=str(e))
            self._avail(avail.Driver(False))
            await asyncio.sleep(1.0)
            self._avail(avail.Driver(await self.edges.driver.healthy()))

    def _driver_seen(self, ev: Any) -> bool:
        self._avail(avail.Driver(True))
        return True

    def _avail(self, inp: avail.Input) -> None:
        for action in self.availability.handle(inp):
            match action:
                case avail.Offer():
                    if self.membership is not None:
                        self._spawn(self.membership.set_available(self.control_endpoint, self.ctl.worker_generation))
                case avail.Withdraw(reason):
                    if self.membership is not None:
                        self._spawn(self.membership.set_faulted(reason, self.ctl.worker_generation))
                case avail.FailStopRun(detail):
                    self._fail_stop_for_arena(detail)
                case avail.Retire():
                    self.retired.set()

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
        ask = Ask.of(req, caller_orchestrator)
        refused = self.admission.check(ask, self._slot(), worker_ready=self.availability.worker_ready,
                                       arena_gone=self.availability.arena_gone)
        if refused is not None:
            raise ProvisionError(refused.code, refused.detail)
        try:
            plan = build_plan(req, node_id=self.node_id, role_id=new_id())
        except PlanRejected as e:
            raise ProvisionError("INVALID_ARGUMENT", str(e)) from None
        for eid in (plan.inbound.edge_id, plan.outbound.edge_id):
            self.edges.core.forget(eid)
            if self.edges.core.state(eid) is not None:
                raise ProvisionError("FAILED_PRECONDITION", f"edge {eid} still has a live record on this node")
        for old in self.admission.admit(ask).forget:
            del self.runs[old]  # bounded history: WatchStage replays only recent finished runs
        self.runs[plan.run_id] = RunLog(plan.run_id, plan.stage_index)
        self.stage = stage_fsm.StageController(self.node_id)
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
        refused = self.admission.authorize(run_id, caller_orchestrator)
        if refused is not None:
            raise ProvisionError(refused.code, refused.detail)

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
            self._avail(avail.StageSettled(self.stage.state))

    def _stage_state(self) -> stage_fsm.StageState | None:
        return self.stage.state if self.stage is not None else None

    def _slot(self) -> Slot | None:
        if self.stage is None:
            return None
        return Slot(self.stage.plan.run_id if self.stage.plan else 0, self.stage.state)

    # ---- the arena-manager gone ----

    def arena_lost(self, detail: str) -> None:
        """The arena's hand-out connection ended (ArenaHold.on_end). The stage's rings live in a memfd
        nobody manages any more, and a new arena-manager hands out a new one that neither this process
        nor its compute process has mapped: fault the run here first (the orchestrator hears why),
        tear it down, withdraw the node, then retire (availability.py decides the order)."""
        self._avail(avail.ArenaGone(detail))

    def _fail_stop_for_arena(self, detail: str) -> None:
        run_id = self.stage.plan.run_id if self.stage is not None and self.stage.plan is not None else None
        self._log.error("arena_lost", detail=detail, run_id=run_id, reason="RUN_FAULT_NODE_UNAVAILABLE",
                        component="COMPONENT_ARENA")
        if run_id is not None:
            self._stage_input(run_id, stage_fsm.ArenaLost(detail))
            self._stage_input(run_id, stage_fsm.StopRun())
        self._avail(avail.StageSettled(self._stage_state()))

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
            log.warm_weights = bool(ev.counters.get("warm", 0))
        if ev.kind == common_pb2.STAGE_READY:
            up.ready.warm_weights = log.warm_weights
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
            self.admission.finished(ev.run_id)
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
                self._avail(avail.Worker(ready=True))
            case WorkerCrashed() | WorkerFailed():
                self._avail(avail.Worker(ready=False))
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
                    self.worker_restarts.worker_proved()
                self._stage(ev)

    def _maybe_restart_worker(self) -> None:
        """Crashed -> Restarting (§31), as restarts.py decides."""
        if isinstance(self.worker_restarts.decide(self.ctl.state, self._stage_state()), Restart):
            self.ctl.start()

    # ---- EdgeEstablisher ----

    def _est(self, inp: est.Input) -> None:
        self.edges.handle(inp)

    def _edge_outcome(self, a: EdgeOutcome) -> None:
        self._stage(a)  # the StageController takes the establisher's outcomes as they are
