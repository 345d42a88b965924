"""StageController FSM of spec §14, as an I/O-free core (one per provisioned stage of a run).

  Unprovisioned -> Preparing -> Ready <-> Executing;  Preparing/Ready/Executing -> Faulted
  any provisioned state -> Stopping -> Stopped

Within Preparing, `Weights` says where the stage's weights are (NotAsked -> Fetching -> Loading -> Loaded):
Ready needs them Loaded and both edges ready; a stop cancels a fetch or a load still under way.

Control path only: it consumes worker and edge events and returns actions (ConfigureRole, edge
provisioning, ExecuteStep, ReleaseDeviceObject, StopEdge, CancelRole when StopRun finds the weights
still loading) plus §40 lifecycle events. One step at
a time; the output object of a step carries the input's sequence and flags (§16, §17). Positions (start_pos)
are derived from the rows of each input object: a prompt arrives as one or more chunk objects (sequences
0..P-1, each but the last flagged PROMPT_CONTINUES, docs/orchestrator.md "Prefill chunks"), then one row per
decode step. Inputs that load while a step runs queue in sequence order (a pipelined prompt's next chunks).
Speculative decoding (docs/orchestrator.md): a VERIFY object's rows are sampled each on the last stage (one token per
row out), and an object's rewind field moves the position back over the step before's rejected rows first.
The per-object events (object_loaded, execute_step_started, object_produced, step_completed) are reported
only when the plan traces objects: without tracing a token costs the node no lifecycle event at all.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from swactor.common.events import get_logger
from swactor.common.objflags import PROMPT_CONTINUES, VERIFY, rewind_of
from swactor.common.reasons import name
from swactor.edgeend.establisher import EdgeFailed, EdgeReady, EdgeStopped
from swactor.v1 import common_pb2
from swactor.worker.edge_actors import EdgeActor, InvalidEdgeEvent
from swactor.worker.process import wire

# the FSM's vocabulary lives in stage_messages; importers may take it from here too
from swactor.worker.stage_messages import (
    Action,
    ArenaLost,
    CancelFetch,
    ControlLost,
    FetchProgress,
    FetchStarted,
    FetchWeights,
    GrantTerms,
    Input,
    Provision,
    ProvisionEdge,
    Report,
    StagePlan,
    StepAdopted,
    StopEdge,
    StopRun,
    ToWorker,
    WeightsFetched,
    WeightsFetchFailed,
    WorkerGone,
)

INPUT_PORT = 0
OUTPUT_PORT = 1


class StageState(enum.Enum):
    UNPROVISIONED = "Unprovisioned"
    PREPARING = "Preparing"
    READY = "Ready"
    EXECUTING = "Executing"
    FAULTED = "Faulted"
    STOPPING = "Stopping"
    STOPPED = "Stopped"


class Weights(enum.Enum):
    """Where the stage's weights are, within Preparing: what Ready waits for and what a stop must cancel."""
    NOT_ASKED = "NotAsked"  # not provisioned yet, or a fetch that failed or was cancelled
    FETCHING = "Fetching"   # byte ranges coming from the orchestrator's model server
    LOADING = "Loading"     # ConfigureRole sent, RoleConfigured not yet seen
    LOADED = "Loaded"


@dataclass
class StageController:
    node_id: int
    state: StageState = StageState.UNPROVISIONED
    plan: StagePlan | None = None
    weights: Weights = Weights.NOT_ASKED
    rx: EdgeActor | None = None
    tx: EdgeActor | None = None
    out_ring_id: int | None = None
    in_ring_id: int | None = None
    next_sequence: int = 0
    position: int = 0
    step_id: int = 0
    step: wire.ExecuteStep | None = None
    step_rows: int = 0  # rows of the step's input (the node's step scheduler batches steps of one row)
    waiting: deque[wire.ObjectLoaded] = field(default_factory=deque)  # inputs loaded while a step runs, in order
    edges_stopped: set[int] = field(default_factory=set)
    fault: tuple[int, int] | None = None  # (RunFaultReason, Component) of the first fault

    # ---- events ----

    def _event(self, kind: int, **fields: Any) -> Report:
        p = self.plan
        ev = common_pb2.LifecycleEvent(kind=kind, node_id=self.node_id, component=common_pb2.COMPONENT_STAGE_CONTROLLER)
        if p is not None:
            ev.run_id, ev.stage_index = p.run_id, p.stage_index
        counters = fields.pop("counters", {})
        for k, v in fields.items():
            setattr(ev, k, v)
        for k, v in counters.items():
            ev.counters[k] = int(v)
        return Report(ev)

    def _transition(self, new: StageState, **facts: Any) -> None:
        old, self.state = self.state, new
        p = self.plan
        log = get_logger(run_id=p.run_id if p else None, stage_index=p.stage_index if p else None)
        # Ready <-> Executing happens per step: a log line each would be most of what a token costs the node
        (log.debug if {old, new} == {StageState.READY, StageState.EXECUTING} else log.info)(
            "stage_state", old=old.value, new=new.value, **facts)

    def _faulted(self, reason: int, component: int, cause: str, detail: str, **ids: Any) -> list[Action]:
        """-> Faulted with StageFault: reason is a RunFaultReason, cause the name of the §37 detail reason."""
        if self.state not in (StageState.PREPARING, StageState.READY, StageState.EXECUTING):
            return []
        self.fault = (reason, component)
        reason_name = name(common_pb2.RunFaultReason, reason)
        self._transition(StageState.FAULTED, reason=reason_name, cause=cause)
        report = self._event(common_pb2.STAGE_FAULTED, reason=reason_name, component=component,
                             detail=f"{cause}: {detail}" if cause else detail, **ids)
        actions: list[Action] = [Report(report.event, cause, detail)]
        for actor in (self.rx, self.tx):
            if actor is not None:
                actor.on("Fault")
        actions += self._release_waiting()
        return actions

    def _release_waiting(self) -> list[Action]:
        released: list[Action] = [ToWorker(wire.ReleaseDeviceObject(ev.device_handle)) for ev in self.waiting]
        self.waiting.clear()
        return released

    def _traced(self, report: Report) -> list[Action]:
        """A per-object event: reported only when the plan traces objects."""
        return [report] if self.plan is not None and self.plan.trace else []

    # ---- the one entry point ----

    def handle(self, inp: Input) -> list[Action]:
        try:
            return self._handle(inp)
        except InvalidEdgeEvent as e:
            return self._faulted(common_pb2.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, common_pb2.COMPONENT_STAGE_CONTROLLER,
                                 "", str(e))

    def _handle(self, inp: Input) -> list[Action]:
        match inp:
            case Provision(plan):
                return self._provision(plan)
            case StopRun():
                return self._stop()
        if self.plan is None or self.state is StageState.STOPPED:
            return []
        match inp:
            case FetchStarted() | FetchProgress() | WeightsFetched() | WeightsFetchFailed():
                return self._fetch_event(inp) if self.weights is Weights.FETCHING else []
            case wire.RoleProgress() | wire.RoleConfigured() | wire.RoleFailed():
                return self._role_event(inp)
            case EdgeReady() | EdgeFailed() | EdgeStopped():
                return self._edge_event(inp)
            case WorkerGone(reason, detail):
                return self._faulted(reason, common_pb2.COMPONENT_WORKER_CTL, "", detail)
            case ControlLost(detail):
                return self._faulted(common_pb2.RUN_FAULT_NODE_UNAVAILABLE, common_pb2.COMPONENT_STAGE_CONTROLLER,
                                     "StageLease.Expired", detail)
            case ArenaLost(detail):  # §36 "node unavailable during run": its arena is gone
                return self._faulted(common_pb2.RUN_FAULT_NODE_UNAVAILABLE, common_pb2.COMPONENT_ARENA,
                                     "ArenaManager.Gone", detail)
            case wire.ObjectLoaded():
                return self._loaded(inp)
            case wire.ObjectFailed() | wire.ObjectProduced():
                return self._object_event(inp)
            case wire.StepCompleted(step_id=step_id):
                return self._step_done(step_id)
            case wire.StepFailed():
                return self._step_failed(inp)
        return []

    # ---- Preparing: weights and edges ----

    def _fetch_event(self, inp: FetchStarted | FetchProgress | WeightsFetched | WeightsFetchFailed) -> list[Action]:
        p = self.plan
        assert p is not None
        match inp:
            case FetchStarted(total, cached):
                return [self._event(common_pb2.WEIGHTS_DOWNLOAD_STARTED,
                                    counters={"bytes_total": total, "bytes_cached": cached})]
            case FetchProgress(done, total, rate, eta):
                return [self._event(common_pb2.WEIGHTS_DOWNLOAD_PROGRESS, counters={
                    "bytes_done": done, "bytes_total": total, "rate_bps": rate, "eta_ms": int(eta * 1000)})]
            case WeightsFetched(path, total, fetched, seconds):
                self.weights = Weights.LOADING
                return [self._event(common_pb2.WEIGHTS_DOWNLOADED, counters={
                            "bytes_total": total, "bytes_fetched": fetched, "duration_ms": int(seconds * 1000)}),
                        ToWorker(wire.ConfigureRole(p.role_id, {**p.role_config, "gguf_path": path}))]
            case WeightsFetchFailed(reason, detail):
                self.weights = Weights.NOT_ASKED
                return self._faulted(common_pb2.RUN_FAULT_WEIGHTS_LOAD_FAILED, common_pb2.COMPONENT_STAGE_CONTROLLER,
                                     f"WeightsFetch.{reason}", detail)
        return []

    def _role_event(self, inp: wire.RoleProgress | wire.RoleConfigured | wire.RoleFailed) -> list[Action]:
        p = self.plan
        assert p is not None
        match inp:
            case wire.RoleProgress(_, done, total, "compile"):
                return [self._event(common_pb2.COMPILE_PROGRESS, counters={"units_done": done, "units_total": total})]
            case wire.RoleProgress(_, done, total):
                return [self._event(common_pb2.WEIGHTS_LOAD_PROGRESS,
                                    counters={"layers_loaded": done, "layers_total": total})]
            case wire.RoleConfigured(role_id, warm) if role_id == p.role_id:
                self.weights = Weights.LOADED
                return [self._event(common_pb2.WEIGHTS_LOADED, counters={"warm": int(warm)}), *self._maybe_ready()]
            case wire.RoleFailed(role_id, reason, detail) if role_id == p.role_id:
                oom = reason == common_pb2.ROLE_FAILURE_DEVICE_OUT_OF_MEMORY
                run_reason = common_pb2.RUN_FAULT_DEVICE_OUT_OF_MEMORY if oom else common_pb2.RUN_FAULT_WEIGHTS_LOAD_FAILED
                return self._faulted(run_reason, common_pb2.COMPONENT_WORKER, name(common_pb2.RoleFailure, reason), detail)
        return []

    def _edge_event(self, inp: EdgeReady | EdgeFailed | EdgeStopped) -> list[Action]:
        match inp:
            case EdgeReady(edge_id, ring_id):
                actor = self._actor(edge_id)
                if actor is None or self.state is not StageState.PREPARING:
                    return []
                actor.on("EdgeReady")
                if actor is self.tx:
                    self.out_ring_id = ring_id
                else:
                    self.in_ring_id = ring_id
                return [self._event(common_pb2.EDGE_READY, edge_id=edge_id, ring_id=ring_id), *self._maybe_ready()]
            case EdgeFailed(edge_id, reason, component, detail, cause):
                return self._faulted(reason, component, cause, detail, edge_id=edge_id)
            case EdgeStopped(edge_id):
                actor = self._actor(edge_id)
                if actor is not None:
                    actor.on("EdgeStopped")
                self.edges_stopped.add(edge_id)
                return self._maybe_stopped()
        return []

    def _actor(self, edge_id: int) -> EdgeActor | None:
        for actor in (self.rx, self.tx):
            if actor is not None and actor.edge_id == edge_id:
                return actor
        return None

    # ---- Unprovisioned -> Preparing -> Ready ----

    def _provision(self, plan: StagePlan) -> list[Action]:
        if self.state is not StageState.UNPROVISIONED:
            return []
        self.plan = plan
        self.rx = EdgeActor(plan.inbound.edge_id, "rx")
        self.tx = EdgeActor(plan.outbound.edge_id, "tx")
        self._transition(StageState.PREPARING)
        if plan.fetch is not None:  # weights first come from the model server, then ConfigureRole
            self.weights = Weights.FETCHING
            weights: Action = FetchWeights(plan.fetch)
        else:
            self.weights = Weights.LOADING
            weights = ToWorker(wire.ConfigureRole(plan.role_id, plan.role_config))
        return [
            self._event(common_pb2.STAGE_PROVISION_STARTED),
            weights,
            self._event(common_pb2.EDGE_PROVISION_STARTED, edge_id=plan.inbound.edge_id),
            ProvisionEdge(plan.inbound),
            self._event(common_pb2.EDGE_PROVISION_STARTED, edge_id=plan.outbound.edge_id),
            ProvisionEdge(plan.outbound),
        ]

    def _maybe_ready(self) -> list[Action]:
        if self.state is StageState.PREPARING and self.weights is Weights.LOADED and self.rx and self.rx.ready \
                and self.tx and self.tx.ready:
            self._transition(StageState.READY)
            return [self._event(common_pb2.STAGE_READY)]
        return []

    # ---- Ready <-> Executing ----

    def _loaded(self, ev: wire.ObjectLoaded) -> list[Action]:
        p = self.plan
        assert p is not None and self.rx is not None
        # a granted step's input is the worker's to release when that step ends
        release = [] if ev.granted_step else [ToWorker(wire.ReleaseDeviceObject(ev.device_handle))]
        if ev.edge_id != p.inbound.edge_id:
            return release  # not this stage's input: never execute on it
        ids = {"edge_id": ev.edge_id, "ring_id": ev.ring_id, "object_id": ev.object_id, "sequence": ev.sequence}
        loaded = self._traced(self._event(common_pb2.OBJECT_LOADED, counters={"extent": ev.extent}, time_us=ev.at_us,
                                          **ids))
        expected = self.waiting[-1].sequence + 1 if self.waiting else self.next_sequence
        if self.state is StageState.EXECUTING and ev.sequence == expected and not ev.granted_step:
            self.waiting.append(ev)  # starts when the steps before it completed: still one step at a time
            return loaded
        if self.state is not StageState.READY:
            if self.state in (StageState.FAULTED, StageState.STOPPING):
                return [*loaded, *release]  # after a fault: reject new run work (§14)
            return [*loaded, *release, *self._faulted(
                common_pb2.RUN_FAULT_SEQUENCE_VIOLATION, common_pb2.COMPONENT_STAGE_CONTROLLER, "",
                f"object sequence {ev.sequence} loaded in state {self.state.value}", **ids)]
        if ev.sequence != self.next_sequence:
            return [*loaded, *release, *self._faulted(
                common_pb2.RUN_FAULT_SEQUENCE_VIOLATION, common_pb2.COMPONENT_STAGE_CONTROLLER, "",
                f"loaded sequence {ev.sequence}, expected {self.next_sequence}", **ids)]
        self.rx.on("ObjectLoaded")
        return [*loaded, *self._execute(ev)]

    def grant_terms(self) -> GrantTerms | None:
        """What this run's next decode step will be, for a standing grant (stage_scheduler.py): None unless it
        is executing a decode row (one row, not a prompt row sent alone), the rows after it being decode rows too."""
        p = self.plan
        if p is None or self.state is not StageState.EXECUTING or self.step is None or self.step_rows != 1 \
                or self.step.outputs[0].flags or self.waiting \
                or self.in_ring_id is None or self.out_ring_id is None:
            return None
        return GrantTerms(self.in_ring_id, self.next_sequence, p.in_row_bytes, self.position,
                          wire.OutputBinding(OUTPUT_PORT, self.out_ring_id, 0, 0, p.out_row_bytes))

    def _execute(self, ev: wire.ObjectLoaded) -> list[Action]:
        p = self.plan
        assert p is not None and self.rx is not None and self.tx is not None and self.out_ring_id is not None
        rows = ev.extent // p.in_row_bytes
        rewind = rewind_of(ev.flags)
        if rewind >= max(self.step_rows, 1):  # the first row of a step is the run's own token, never a draft
            return [ToWorker(wire.ReleaseDeviceObject(ev.device_handle)), *self._faulted(
                common_pb2.RUN_FAULT_OBJECT_FAILED, common_pb2.COMPONENT_STAGE_CONTROLLER, "",
                f"object sequence {ev.sequence} rewinds {rewind} rows; the step before ran {self.step_rows}",
                edge_id=ev.edge_id, ring_id=ev.ring_id, object_id=ev.object_id, sequence=ev.sequence)]
        self.position -= rewind
        last = p.outbound_kind == common_pb2.EDGE_KIND_TOKEN_OUT
        out_rows = rows if ev.flags & VERIFY or not last else 1
        runtime: dict[str, Any] = {"start_pos": self.position}
        if rewind:
            runtime["rewind"] = rewind
        if ev.flags & VERIFY:
            runtime["every_row"] = True  # drafts: each row run as its decode step, a token after every one on the last stage
        if ev.flags & PROMPT_CONTINUES:
            runtime["sample"] = False  # a prompt chunk before the last: no token from it (the last stage's concern)
        self.step_id += 1
        self.step = wire.ExecuteStep(
            p.role_id, self.step_id,
            [wire.InputBinding(INPUT_PORT, ev.object_id, ev.sequence, ev.device_handle)],
            [wire.OutputBinding(OUTPUT_PORT, self.out_ring_id, ev.object_id, ev.sequence, out_rows * p.out_row_bytes,
                                ev.flags)],
            runtime, True)
        self.rx.on("StepStarted")
        self.tx.on("StepStarted")
        self._transition(StageState.EXECUTING, sequence=ev.sequence, step_id=self.step_id, start_pos=self.position)
        self.position += rows
        self.step_rows = rows
        self.next_sequence = ev.sequence + 1
        # A granted step started in the worker as its input loaded: its start is the load's time, not this line's
        # (the IPC's lag would show as dispatch and the step's compute would look that much shorter).
        started = {"time_us": ev.at_us} if ev.granted_step and ev.at_us else {}
        return [*self._traced(self._event(common_pb2.EXECUTE_STEP_STARTED, step_id=self.step_id, sequence=ev.sequence,
                                          object_id=ev.object_id, counters={"rows": rows, "start_pos": self.position - rows,
                                                                             "granted": int(bool(ev.granted_step))},
                                          **started)),
                StepAdopted(self.step, ev.granted_step) if ev.granted_step else ToWorker(self.step)]

    def _object_event(self, inp: wire.ObjectFailed | wire.ObjectProduced) -> list[Action]:
        match inp:
            case wire.ObjectFailed(ring_id=ring_id, edge_id=edge_id, object_id=oid, sequence=seq, reason=r, detail=d):
                run_reason = (common_pb2.RUN_FAULT_SEQUENCE_VIOLATION if r == common_pb2.OBJECT_FAILURE_SEQUENCE_VIOLATION
                              else common_pb2.RUN_FAULT_OBJECT_FAILED)
                ids: dict[str, Any] = {"edge_id": edge_id, "ring_id": ring_id, "object_id": oid or 0}
                if seq is not None:
                    ids["sequence"] = seq
                return self._faulted(run_reason, common_pb2.COMPONENT_WORKER, name(common_pb2.ObjectFailure, r), d, **ids)
            case wire.ObjectProduced(ring_id=ring_id, edge_id=edge_id, object_id=oid, sequence=seq, extent=extent,
                                     at_us=at_us):
                if self.tx is not None and edge_id == self.tx.edge_id and self.state is StageState.EXECUTING:
                    self.tx.on("ObjectProduced")
                return self._traced(self._event(common_pb2.OBJECT_PRODUCED, edge_id=edge_id, ring_id=ring_id,
                                                object_id=oid, sequence=seq, counters={"extent": extent},
                                                time_us=at_us))
        return []

    def _step_failed(self, failed: wire.StepFailed) -> list[Action]:
        if self.step is None or failed.step_id != self.step.step_id:
            return []
        self.step = None
        run_reason = {common_pb2.STEP_FAILURE_DEVICE_OUT_OF_MEMORY: common_pb2.RUN_FAULT_DEVICE_OUT_OF_MEMORY,
                      common_pb2.STEP_FAILURE_WORKER_PROCESS_EXITED: common_pb2.RUN_FAULT_WORKER_CRASHED,
                      }.get(failed.reason, common_pb2.RUN_FAULT_STEP_FAILED)
        return self._faulted(run_reason, common_pb2.COMPONENT_WORKER, name(common_pb2.StepFailure, failed.reason),
                             failed.detail, step_id=failed.step_id)

    def _step_done(self, step_id: int) -> list[Action]:
        if self.step is None or step_id != self.step.step_id or self.state is not StageState.EXECUTING:
            return []
        seq = self.step.inputs[0].sequence
        self.step = None
        self._transition(StageState.READY)
        actions: list[Action] = self._traced(self._event(common_pb2.STEP_COMPLETED, step_id=step_id, sequence=seq))
        if self.waiting:
            ev = self.waiting.popleft()
            assert self.rx is not None
            self.rx.on("ObjectLoaded")
            actions += self._execute(ev)
        return actions

    # ---- Stopping -> Stopped ----

    def _stop(self) -> list[Action]:
        if self.state in (StageState.UNPROVISIONED, StageState.STOPPING, StageState.STOPPED):
            return []
        assert self.plan is not None
        self._transition(StageState.STOPPING)
        actions: list[Action] = []
        if self.weights is Weights.FETCHING:  # a fetch nobody waits for stops; what it verified stays in the cache
            self.weights = Weights.NOT_ASKED
            actions.append(CancelFetch())
        if self.weights is Weights.LOADING:  # a stopped run's weights are not worth the wait
            actions.append(ToWorker(wire.CancelRole(self.plan.role_id)))
        actions += self._release_waiting()
        for actor in (self.rx, self.tx):
            if actor is not None and actor.edge_id not in self.edges_stopped:
                actor.on("StopEdge")
                actions.append(StopEdge(actor.edge_id))
        return actions + self._maybe_stopped()

    def _maybe_stopped(self) -> list[Action]:
        p = self.plan
        if self.state is not StageState.STOPPING or p is None:
            return []
        if {p.inbound.edge_id, p.outbound.edge_id} <= self.edges_stopped:
            # how far the run got here, for a post-mortem: its steps, the next sequence it waited for, a step still open
            open_step = self.step.step_id if self.step is not None else 0
            self.step = None  # uninstalling the egress ring ended any step still writing to it
            self._transition(StageState.STOPPED, steps=self.step_id, next_sequence=self.next_sequence,
                             open_step=open_step)
            return [self._event(common_pb2.STAGE_STOPPED)]
        return []
