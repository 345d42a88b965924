"""The stage node: StageController + EdgeEstablisher + GpuWorkerCtl wired to the local services.

This is the asyncio shell around the I/O-free cores (stage_fsm, stage_scheduler, establisher, ctl_fsm): it
feeds them events (worker events, arena/driver outcomes, orchestrator calls) and executes the actions they
return. Several runs of the same weights may be here at once (runs in flight, docs/runs-in-flight.md): each
has its own StageController, edges and KV slot of the one resident role; their steps go to the compute process
through the step scheduler, which batches their decode rows. A later run of the same weights re-uses them (warm
ConfigureRole). NodeAvailable (§8) is reported only once the arena is mapped, the worker said WorkerReady and
the edge-driver answers (`node_health.py`, which also restarts a lost compute process). Which runs it takes and the
KV slot each gets are `provisioning.py`'s pure checks. Each run is held under the
orchestrator's lease (stage_lease.py): with no WatchStage stream for `lease_window_s` that run's stage faults
fail-stop and tears itself down. Every stage event carries
the worker's generation. When the host's arena-manager dies (`arena_lost`) every running stage faults fail-stop
(RUN_FAULT_NODE_UNAVAILABLE by COMPONENT_ARENA) and tears down, the node is withdrawn, and `retired` is set
once no run is left: the service then exits for its manager to restart it on the new arena.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from swactor.common.clock import wall_us
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
from swactor.worker.host_metrics import StepTotals
from swactor.worker.membership import MembershipPort
from swactor.worker.node_health import (
    Announce,
    ArenaLost,
    DriverSeen,
    NodeHealth,
    NodeHealthInput,
    RestartsExhausted,
    RestartWorker,
    Retire,
    RunsChanged,
    WorkerLost,
    WorkerReady,
    WorkerWorks,
)
from swactor.worker.plan import PlanRejected, build_plan
from swactor.worker.process import wire
from swactor.worker.provisioning import ProvisionError, WeightsIdentity, check_caller, free_slot
from swactor.worker.stage_lease import DEFAULT_WINDOW_S, StageLease
from swactor.worker.stage_scheduler import Asked, StepScheduler
from swactor.worker.step_speed import StepSpeed
from swactor.worker.tracebatch import PER_OBJECT_KINDS, SequenceBatches
from swactor.worker.weights import WeightsFetcher, WeightsShell

DEFAULT_GATHER_S = 0.010  # [worker].batch_gather_ms
KEEP_FINISHED_RUNS = 16


@dataclass
class RunLog:
    """One run's stage here: its StageController, KV slot and lease, and every StageUpdate, for WatchStage replay
    and live following."""

    run_id: int
    stage_index: int
    orchestrator_node_id: int  # who provisioned it: the only caller of StopRun / WatchStage for it
    stage: stage_fsm.StageController
    slot: int  # its KV cache slot of the resident role
    weights: WeightsIdentity
    lease: StageLease
    updates: list[stage_pb2.StageUpdate] = field(default_factory=list)
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    traced: SequenceBatches = field(default_factory=SequenceBatches)  # per-object events (trace_objects runs)
    warm_weights: bool = False
    timing_relay: asyncio.Future[Any] | None = None
    # Its decode work in layers (ProvisionStage's runtime.compute_layers, else its block count): a decode step's time
    # over it is this host's time per layer (step_speed.py) where the worker does not say its blocks' own time.
    compute_layers: float = 1.0
    blocks: int = 1  # its layer range's length: the blocks' own time (StepCompleted.layers_us) over it, where said

    @property
    def active(self) -> bool:
        return self.stage.state is not stage_fsm.StageState.STOPPED

    @property
    def leaving(self) -> bool:
        return self.stage.state in (stage_fsm.StageState.FAULTED, stage_fsm.StageState.STOPPING)

    def add(self, update: stage_pb2.StageUpdate) -> None:
        self.updates.append(update)
        if update.WhichOneof("update") == "stopped":
            self.done = True
        self.changed.set()
        self.changed = asyncio.Event()


class StageNode:
    def __init__(self, node_id: int, ctl: WorkerCtlLike, arena: ArenaPort, driver: DriverPort,
                 membership: MembershipPort | None = None, *, control_endpoint: str = "",
                 orchestrator_node_id: int | None = None, weights: WeightsFetcher | None = None,
                 lease_window_s: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 arena_pressure_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
                 batch_gather_s: float = DEFAULT_GATHER_S, device_index: int = 0, step_grants: bool = True) -> None:
        self.node_id = node_id
        self.device_index = device_index  # which of the node's stage devices this is (worker/devices.py)
        self.ctl = ctl
        self.membership = membership
        self.control_endpoint = control_endpoint
        self.orchestrator_node_id = orchestrator_node_id
        self._log = get_logger(node_id=node_id, component="stage_node", **({"device_index": device_index}
                                                                             if device_index else {}))
        self.edges = EstablisherShell(arena, driver, WorkerRingHost(ctl), self._edge_outcome, self._spawn, self._log,
                                      lease_timeout_s=arena_pressure_timeout_s)
        self.runs: dict[int, RunLog] = {}  # the runs here (active ones, then a bounded history of finished ones)
        self.scheduler = StepScheduler(gather_s=batch_gather_s)
        self.step_grants = step_grants  # [worker].step_grants: a run alone here decodes under a standing grant
        self.steps = StepTotals()  # completed compute steps per stage index (GetHostMetrics)
        self.speed = StepSpeed()  # this host's time per layer of a decode step (gossiped: NodeMetadata)
        # Says a new figure of `speed` (the worker's MembershipClientPort.set_step_speed); None: measured, not said.
        self.publish_speed: Callable[[int], Awaitable[None]] | None = None
        self._gather_timer: asyncio.TimerHandle | None = None
        self._answering = False  # a step's runs are being answered: the next step waits until all of them were
        self._run_of_edge: dict[int, int] = {}  # an active run's edge id -> run_id
        self._run_of_role: dict[int, int] = {}  # an active run's role id -> run_id
        self.health = NodeHealth()
        self.retired = asyncio.Event()  # arena gone and no run left here: the service should exit
        self.weights = WeightsShell(weights, self._stage_input)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.lease_window_s = lease_window_s
        self._lease_timer: asyncio.TimerHandle | None = None
        self._clock = clock
        ctl.subscribe(self._on_worker)

    # ---- boot (§8) ----

    async def start(self) -> None:
        self.ctl.start()
        self._spawn(self._follow_driver())
        self._health(DriverSeen(await self.edges.driver.healthy()))

    async def _follow_driver(self) -> None:
        while True:
            try:
                await self.edges.follow_driver(self._driver_seen)
            except Exception as e:  # the driver restarted or is not up yet: re-subscribe
                self._log.warning("edge_driver_watch_lost", detail=str(e))
            self._health(DriverSeen(False))
            await asyncio.sleep(1.0)
            self._health(DriverSeen(await self.edges.driver.healthy()))

    def _driver_seen(self, ev: Any) -> bool:
        if not self.health.driver_up:
            self._health(DriverSeen(True))
        return True

    # ---- availability and restarts (node_health.py) ----

    @property
    def available(self) -> bool:
        return self.health.available

    def _health(self, inp: NodeHealthInput) -> None:
        worker_down = self.ctl.state in (CtlState.FAILED, CtlState.STOPPED)
        for action in self.health.handle(inp, runs_active=len(self.active_runs()), worker_down=worker_down):
            match action:
                case Announce(available, reason):
                    h = self.health
                    self._log.info("node_available" if available else "node_unavailable", worker_ready=h.worker_ready,
                                   driver_up=h.driver_up, arena_up=h.arena_gone is None)
                    if self.membership is not None:
                        generation = self.ctl.worker_generation
                        self._spawn(self.membership.set_available(self.control_endpoint, generation) if available
                                    else self.membership.set_faulted(reason, generation))
                case RestartWorker(attempt):  # Crashed -> Restarting (§31): a new generation
                    self._log.info("worker_restarting", attempt=attempt)
                    self.ctl.start()
                case RestartsExhausted(restarts):
                    self._log.error("worker_restart_limit", restarts=restarts)
                case Retire(detail):
                    self._log.info("node_retiring", detail=detail)
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
        for timer in (self._lease_timer, self._gather_timer):
            if timer is not None:
                timer.cancel()
        self.weights.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ---- the runs here ----

    def active_runs(self) -> list[RunLog]:
        return [log for log in self.runs.values() if log.active]

    def slots_in_use(self) -> tuple[int, int]:
        """(runs active here, the KV slots of their resident role); (0, 0) when no run is active."""
        active = self.active_runs()
        return len(active), (active[0].stage.plan.role_config.get("slots", 1) if active and active[0].stage.plan else 0)

    # ---- orchestrator calls ----

    def provision(self, req: stage_pb2.ProvisionStageRequest, caller_orchestrator: int | None) -> None:
        check_caller(req, caller_orchestrator, node_id=self.node_id, orchestrator_node_id=self.orchestrator_node_id)
        if req.run_id in self.runs:
            raise ProvisionError("ALREADY_EXISTS", f"run {req.run_id} is already provisioned on this node")
        if not self.health.worker_ready:
            raise ProvisionError("FAILED_PRECONDITION", "the GPU worker is not ready (WorkerReady not seen)")
        if self.health.arena_gone is not None:
            raise ProvisionError("FAILED_PRECONDITION", f"the node's arena-manager is gone: {self.health.arena_gone}")
        try:
            plan = build_plan(req, node_id=self.node_id, role_id=new_id())
        except PlanRejected as e:
            raise ProvisionError("INVALID_ARGUMENT", str(e)) from None
        identity = WeightsIdentity.of(req, plan.role_config)
        slot = free_slot(self.active_runs(), identity, plan.role_config.get("slots", 1))
        if plan.role_id in self._run_of_role:  # a run's role id routes the compute process's events to it alone
            raise ProvisionError("INVALID_ARGUMENT", f"runtime.role_id {plan.role_id} is run "
                                                     f"{self._run_of_role[plan.role_id]}'s on this node")
        for eid in (plan.inbound.edge_id, plan.outbound.edge_id):
            self.edges.core.forget(eid)
            if self.edges.core.state(eid) is not None:
                raise ProvisionError("FAILED_PRECONDITION", f"edge {eid} still has a live record on this node")
        finished = [r for r, log in self.runs.items() if log.done]
        for old in finished[:-KEEP_FINISHED_RUNS or None]:
            del self.runs[old]  # bounded history: WatchStage replays only recent finished runs
        plan.role_config["slot"] = slot
        log = RunLog(plan.run_id, plan.stage_index, caller_orchestrator, stage_fsm.StageController(self.node_id),
                     slot, identity, StageLease.grant(plan.run_id, self.lease_window_s, self._clock()),
                     compute_layers=req.runtime.compute_layers or req.layer_end_exclusive - req.layer_start,
                     blocks=max(1, req.layer_end_exclusive - req.layer_start))
        self.runs[plan.run_id] = log
        for eid in (plan.inbound.edge_id, plan.outbound.edge_id):
            self._run_of_edge[eid] = plan.run_id
        self._run_of_role[plan.role_id] = plan.run_id
        self.scheduler.max_batch = plan.role_config.get("slots", 1)
        self.scheduler.merge = plan.stage_index == 0  # where every run's rows enter the pipeline again
        if plan.trace:  # the edge timings of this run's ends: only a traced run reports them
            ends = {plan.inbound.edge_id: edge_pb2.EDGE_ROLE_RECV, plan.outbound.edge_id: edge_pb2.EDGE_ROLE_SEND}
            log.timing_relay = self._spawn(relay_object_timings(
                self.edges.driver, ends, run_id=plan.run_id, node_id=self.node_id, stage_index=plan.stage_index,
                emit=self._relay_timing, log=get_logger(component="stage_node")))
        self._log.info("run_slot_taken", run_id=plan.run_id, slot=slot, runs_active=len(self.active_runs()))
        self._stage(log, stage_fsm.Provision(plan))
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
        self._stage_input(run_id, stage_fsm.StopRun())
        return True

    async def watch(self, run_id: int) -> AsyncIterator[stage_pb2.StageUpdate]:
        log = self.runs.get(run_id)
        if log is None:
            raise KeyError(run_id)
        lease = log.lease if log.lease.live else None
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

    # ---- the orchestrator's lease on each run (stage_lease.py) ----

    def _arm_lease(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None
        deadlines = [d for log in self.active_runs() if (d := log.lease.deadline()) is not None]
        if deadlines:
            delay = max(0.0, min(deadlines) - self._clock())
            self._lease_timer = asyncio.get_running_loop().call_later(delay, self._lease_tick)

    def _lease_tick(self) -> None:
        self._lease_timer = None
        for log in self.active_runs():
            for expired in log.lease.tick(self._clock()):
                self._log.warning("stage_lease_expired", run_id=expired.run_id,
                                  unwatched_s=round(expired.unwatched_s, 3), detail=expired.detail)
                self._stage_input(expired.run_id, stage_fsm.ControlLost(expired.detail))
                self._stage_input(expired.run_id, stage_fsm.StopRun())
        self._arm_lease()

    # ---- StageControllers ----

    def _stage(self, log: RunLog, inp: stage_fsm.Input) -> None:
        stage = log.stage
        for action in stage.handle(inp):
            match action:
                case stage_fsm.ProvisionEdge(edge):
                    self._est(est.Provision(edge, new_id()))
                case stage_fsm.StopEdge(edge_id):
                    self._est(est.StopEdge(edge_id))
                case stage_fsm.FetchWeights(request):
                    self.weights.fetch(log.run_id, request)
                case stage_fsm.CancelFetch():
                    self.weights.cancel(log.run_id)
                case stage_fsm.ToWorker(wire.ExecuteStep() as step):
                    self.scheduler.ask(Asked(log.run_id, log.slot, stage.step_rows, step, self._clock()))
                case stage_fsm.StepAdopted(step, worker_step_id):
                    now = self._clock()
                    self.scheduler.adopt(worker_step_id, (Asked(log.run_id, log.slot, stage.step_rows, step, now),), now)
                case stage_fsm.ToWorker(cmd):
                    self.ctl.send(cmd)
                case stage_fsm.Report(event, cause, detail):
                    self._report(event, cause, detail)
        if log.leaving or not log.active:
            withdrawn = self.scheduler.withdraw(log.run_id)  # its step never went out: its input is released here
            for b in withdrawn.step.inputs if withdrawn is not None else ():
                self.ctl.send(wire.ReleaseDeviceObject(b.device_handle))
        if not log.active:
            self._run_left(log)
        if not self._answering:
            self._dispatch()

    def _dispatch(self) -> None:
        """The next step (one run's, or several runs' rows batched) to the compute process when it is idle; while the
        scheduler gathers rows, again at the end of its window."""
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None
        active = self.active_runs()
        # runs past their prompt, whose next row comes back here after their token went round
        self.scheduler.expected = sum(1 for log in active if log.stage.position > 0
                                      and log.stage.state in (stage_fsm.StageState.READY, stage_fsm.StageState.EXECUTING))
        alone = len(active) == 1
        grant = self.scheduler.grant
        if grant is not None:
            log = self.runs.get(grant.run_id)
            revoke = self.scheduler.to_revoke(alone, log is not None and log.active and not log.leaving)
            if revoke is not None:
                self.ctl.send(revoke)
            return  # nothing else goes out while a grant stands; GrantEnded dispatches again
        dispatch = self.scheduler.next(self._clock())
        if dispatch is not None:
            self.ctl.send(dispatch.step)
            log = self.runs.get(dispatch.members[0].run_id)
            terms = log.stage.grant_terms() if self.step_grants and log is not None else None
            grant_cmd = self.scheduler.grant_after(dispatch, alone, terms)
            if grant_cmd is not None:
                self.ctl.send(grant_cmd)
        elif self.scheduler.hold_until is not None:
            self._gather_timer = asyncio.get_running_loop().call_later(
                max(0.0, self.scheduler.hold_until - self._clock()), self._dispatch)

    def _run_left(self, log: RunLog) -> None:
        """The run's stage stopped: its slot, edges and role id are free for the next run."""
        plan = log.stage.plan
        if plan is not None:
            for eid in (plan.inbound.edge_id, plan.outbound.edge_id):
                if self._run_of_edge.get(eid) == log.run_id:
                    del self._run_of_edge[eid]
            self._run_of_role.pop(plan.role_id, None)
        # how full this stage's batches have been so far (granted steps aside): rows of runs in flight that go one
        # at a time cost their weights' reads once each
        self._log.info("stage_steps_by_width", run_id=log.run_id,
                       steps_by_width={str(w): n for w, n in sorted(self.scheduler.widths.items())})
        self._health(RunsChanged())

    # ---- the arena-manager gone ----

    def arena_lost(self, detail: str) -> None:
        """The arena's hand-out connection ended (ArenaHold.on_end). The stages' rings live in a memfd
        nobody manages any more, and a new arena-manager hands out a new one that neither this process
        nor its compute process has mapped: fault every run here first (the orchestrator hears why),
        tear them down, withdraw the node, then retire."""
        if self.health.arena_gone is not None:
            return
        active = [log.run_id for log in self.active_runs()]
        self._log.error("arena_lost", detail=detail, run_ids=active, reason="RUN_FAULT_NODE_UNAVAILABLE",
                        component="COMPONENT_ARENA")
        self._health(ArenaLost(detail))  # retires at once when no run is here, else once the last one stops
        for run_id in active:
            self._stage_input(run_id, stage_fsm.ArenaLost(detail))
            self._stage_input(run_id, stage_fsm.StopRun())

    def _report(self, ev: common_pb2.LifecycleEvent, cause: str = "", detail: str = "") -> None:
        ev.time_us = ev.time_us or wall_us()  # a stamp the compute process took stands (wire.ObjectLoaded.at_us)
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
            log.lease.end()
            self._arm_lease()
            for batch in log.traced.flush():  # what a traced run still held goes out before `stopped`
                self._add_batch(log, batch)
            self.weights.release(ev.run_id)
            if log.timing_relay is not None:
                log.timing_relay.cancel()
                log.timing_relay = None
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
        """An input for run `run_id`'s StageController, dropped if that run is no longer active here."""
        log = self.runs.get(run_id)
        if log is not None and log.active:
            self._stage(log, inp)

    # ---- worker events ----

    def _on_worker(self, ev: Any) -> None:
        match ev:
            case wire.WorkerReady():
                self._health(WorkerReady())
            case WorkerCrashed() | WorkerFailed():
                self._health(WorkerLost())
                self.scheduler.reset()  # its steps and device objects went with the process
                reason = common_pb2.RUN_FAULT_WORKER_CRASHED if isinstance(ev, WorkerCrashed) else common_pb2.RUN_FAULT_WORKER_FATAL
                for log in self.active_runs():  # a shared part: every run here ends, each with its reason
                    self._stage(log, stage_fsm.WorkerGone(reason, ev.detail))
                self._health(RunsChanged())
            case wire.RingInstalled(ring_id=rid):
                self._est(est.RingInstalled(rid))
            case wire.RingFault(ring_id=rid, reason=r, detail=d):
                self._est(est.RingFault(rid, r, d))
            case wire.RingQuiesced(ring_id=rid):
                self._est(est.RingQuiesced(rid))
            case wire.DeviceObjectReleased():
                pass  # one per step: the ctl keeps the handle table, a log line each would cost every token
            case wire.WorkerStopped() | wire.ReleaseFailed():
                self._log.info("worker_event", worker_event=type(ev).__name__)
            case wire.RoleProgress() | wire.RoleConfigured() | wire.RoleFailed():
                if isinstance(ev, wire.RoleConfigured):
                    self._health(WorkerWorks())
                self._route(self._run_of_role.get(ev.role_id), ev)
            case wire.ObjectLoaded():
                run_id = self._run_of_edge.get(ev.edge_id)
                if run_id is not None and self.runs[run_id].active:
                    self._stage_input(run_id, ev)
                elif not ev.granted_step:  # no run's input: never executed on
                    self.ctl.send(wire.ReleaseDeviceObject(ev.device_handle))
                running = self.scheduler.in_flight
                if ev.granted_step and (running is None or running.step.step_id != ev.granted_step):
                    self.scheduler.adopt(ev.granted_step, (), self._clock())  # its run had left: nobody to answer
            case wire.GrantEnded(grant_id=gid, sequence=seq, cause=cause):
                if self.scheduler.grant_ended(gid):
                    self._log.debug("step_grant_ended", grant_id=gid, sequence=seq, cause=cause)
                    self._dispatch()
            case wire.ObjectFailed() | wire.ObjectProduced():
                self._route(self._run_of_edge.get(ev.edge_id), ev)
            case wire.StepCompleted() | wire.StepFailed():
                self._step_ended(ev)

    def _measured(self, log: RunLog, seconds: float, layers_us: int) -> None:
        # The blocks' own time where the worker says it: what every step costs besides (the control path, copies, the
        # embedding, the head) would make a stage of few blocks look slower per block, and the split by speed would
        # then take blocks from it run after run, reloading each time (docs/orchestrator.md "Blocks by speed").
        if layers_us:
            us = self.speed.decode_step(layers_us / 1e6, log.blocks)
        else:
            us = self.speed.decode_step(seconds, log.compute_layers)
        if us is None:
            return
        self._log.info("step_speed_measured", run_id=log.run_id, stage_index=log.stage_index, us_per_layer=us,
                       layers=log.blocks if layers_us else log.compute_layers,
                       measured_on="blocks" if layers_us else "step", samples=len(self.speed.samples))
        if self.publish_speed is not None:
            self._spawn(self.publish_speed(us))

    def _route(self, run_id: int | None, ev: Any) -> None:
        if run_id is not None:
            self._stage_input(run_id, ev)

    def _step_ended(self, ev: wire.StepCompleted | wire.StepFailed) -> None:
        """The compute process ended a step: each run in it hears the outcome of its own step (a batched step's
        failure is every one of its runs'), then the next step goes out."""
        ended = self.scheduler.finished(ev.step_id)
        if ended is None:
            return
        if isinstance(ev, wire.StepCompleted):
            self._health(WorkerWorks())
            log = self.runs.get(ended.members[0].run_id) if ended.members else None
            if log is not None:
                seconds = self._clock() - ended.sent_at
                self.steps.completed(log.stage_index, seconds)
                if len(ended.members) == 1 and ended.members[0].rows == 1:  # one decode row: the host's speed
                    self._measured(log, seconds, ev.layers_us)
        self._answering = True  # every run answered first: those that ask again go out together
        try:
            for asked in ended.members:
                own = asked.step
                if isinstance(ev, wire.StepCompleted):
                    self._stage_input(asked.run_id, wire.StepCompleted(own.role_id, own.step_id))
                else:
                    self._stage_input(asked.run_id, wire.StepFailed(own.role_id, own.step_id, ev.reason, ev.detail))
        finally:
            self._answering = False
        self._dispatch()

    # ---- EdgeEstablisher ----

    def _est(self, inp: est.Input) -> None:
        self.edges.handle(inp)

    def _edge_outcome(self, a: EdgeOutcome) -> None:
        self._route(self._run_of_edge.get(a.edge_id), a)  # the run's StageController takes them as they are
