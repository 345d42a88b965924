"""The run FSM (spec §13, with §9 PoolReady, §16 sequencing, §36 fault semantics, §38 teardown).

An I/O-free core: `RunFsm.handle(input, now)` takes one input and the current monotonic time and
returns the actions the adapter must perform (provision, inject tokens, stop stages, emit lifecycle
events). `deadline()` says when the adapter must deliver a `Tick`. Every state change goes through
`_set_state`; the outcome is set once, by `_finish`, with the first fault reason (a peer's echo of a stage's fault,
STREAM_FAULT_PEER_STOPPED, waits ECHO_GRACE_S for that stage's own report first, and so does a node's own word that it
faulted, for its stages').

States (RunState) follow §13; Completed / Faulted / Operator-stopped are the run's Outcome, recorded
on the way into TEARING_DOWN.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

from swactor.common.ids import new_id
from swactor.common.objflags import PROMPT_CONTINUES, VERIFY, with_rewind
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.planning.planner import PlanError, RunPlan, Seat, StagePlan, memory_need, plan_run
from swactor.orchestrator.planning.pool import Demand, PoolGate
from swactor.orchestrator.runs.readiness import ReadinessBudget

# the FSM's vocabulary lives in run_messages; importers may take it from here too
from swactor.orchestrator.runs.run_messages import (  # noqa: F401
    Action,
    CloseEndpoints,
    Deliver,
    Drafted,
    DraftsVerified,
    DraftWanted,
    Emit,
    EndpointFault,
    EndpointsClosed,
    EndpointsReady,
    FsmConfig,
    InjectTokens,
    Input,
    MembershipChanged,
    OpenEndpoints,
    OperatorStop,
    OrchestratorFault,
    PromptChunkDone,
    Provision,
    ProvisionFailed,
    Relay,
    RelayBatch,
    RunRequest,
    StageFault,
    StageReady,
    StageStopped,
    StopStage,
    Tick,
    Timeouts,
    TokenReceived,
)
from swactor.orchestrator.tokens.drafts import DraftPacing, PromptLookup
from swactor.v1 import common_pb2 as pb

K = pb.LifecycleEventKind


class RunState(enum.Enum):
    WAITING_POOL = 1
    PROVISIONING = 2
    WAITING_READY = 3
    RUNNING = 4
    TEARING_DOWN = 5
    DONE = 6


class Outcome(enum.Enum):
    COMPLETED = 1
    FAULTED = 2
    STOPPED = 3


_LOST = (NodeState.FAULTED, NodeState.LEFT)
# A stage whose peer stopped or reset their stream with the peer driver's own code (STREAM_FAULT_PEER_STOPPED) reports
# an echo: the peer stage faulted or stopped, and reports that itself, with the cause. Both reports race to the
# orchestrator (under a busy 2-core box's load the echo won in a fault-suite run: "SIGKILL arena-manager" ended "peer
# stopped the stream" instead of the arena), so an echo becomes the outcome only when no cause came within this long.
ECHO_GRACE_S = 1.0
ECHO_CAUSE = pb.StreamFaultReason.Name(pb.STREAM_FAULT_PEER_STOPPED)
# A node that says it faulted (membership state Faulted: its compute process died, its arena went) is alive, and its
# stages report the cause themselves, naming the component. The gossip and the stage's report race here too (a
# fault-suite run on a busy box: "SIGKILL compute process" ended "node left the pool or faulted" instead of the
# worker's crash), so the node's word becomes the outcome only when no stage's report came within ECHO_GRACE_S. A node
# gone (Dead, Left, out of the view) says nothing more: that is the outcome at once.


def _seats(seats: tuple[Seat, ...]) -> str:
    shared = {s.node_id for s in seats if s.device}  # nodes carrying several of the stages: name the device
    return ", ".join(f"node {s.node_id}{f' device {s.device}' if s.node_id in shared else ''} "
                     f"blocks {s.layer_start}..{s.layer_end_exclusive} ({s.run_slots} slots)" for s in seats)


def reason_name(reason: int) -> str:
    return pb.RunFaultReason.Name(reason)  # type: ignore[arg-type]


class RunFsm:
    def __init__(
        self, request: RunRequest, config: FsmConfig, now: float, *, id_source: Callable[[], int] = new_id,
        pool_view: PoolGate | None = None,
    ) -> None:
        self.request = request
        self.config = config
        self._id_source = id_source
        self.state = RunState.WAITING_POOL
        self.transitions: list[tuple[RunState, RunState]] = []
        self.outcome: Outcome | None = None
        self.reason = ""  # first fault reason name, or the completion reason
        self.detail = ""
        self.plan: RunPlan | None = None
        # config.timeouts grown for the planned ring's measured RTT (Timeouts.for_ring), from planning on
        self.timeouts = config.timeouts
        self.tokens: list[int] = []
        # pool_view: the orchestrator's gate, which has watched the pool before this run: a pool that has been stable
        # for the window is ready at once instead of the window being waited again by every run
        self._gate = pool_view.snapshot() if pool_view is not None else PoolGate(config.pool_window_s)
        self._demand = Demand(request.stages, request.node_ids, request.model.num_layers,
                              memory_need(request.model, config.max_seq_len_cap, config.max_slots_per_stage,
                                          config.kv_dtype),
                              # joining the runs in flight: their blocks, not a split by speeds measured since
                              tuple((s.layer_start, s.layer_end_exclusive) for s in request.joins))
        self._pool_ready_at: float | None = None  # when the gate's chosen nodes will have been stable
        self._waiting_for = ""  # what the closed gate waits for, as last recorded (POOL_WAITING)
        self._pool_deadline = now + config.timeouts.pool_s
        self._deadline: float | None = self._pool_deadline
        self._ready: set[int] = set()
        self._readiness: ReadinessBudget | None = None  # from provisioning to the readiness barrier
        self._endpoints_open = False
        self._endpoints_ready = False
        self._endpoints_closing = False  # CloseEndpoints sent, EndpointsClosed not yet seen
        self._teardown_left: list[str] = []  # parts whose teardown could not be confirmed
        self._provisioned: set[int] = set()
        self._failed: set[int] = set()
        self._awaiting_stop: set[int] = set()
        self._expected_seq = 0
        self._prompt_objects = 1  # the prompt's chunk objects: sequences 0..n-1, the first token comes with n-1
        # speculative decoding: prompt lookup (None with the draft model or without drafts), the pacing of either
        # drafter, the drafts in the object in flight, the object waiting for the draft model's answer (its sequence,
        # its first token, its flags), drafted / accepted so far
        self._lookup = PromptLookup(request.prompt_ids) if request.speculate and not request.draft_model else None
        self._pacing = (self._lookup.pacing if self._lookup is not None
                        else DraftPacing() if request.speculate else None)
        self._drafts: tuple[int, ...] = ()
        self._awaiting_draft: InjectTokens | None = None
        self.drafted = self.accepted = 0
        self.teardown_timed_out = False
        self._now = now
        self._echo: tuple[StageFault, float] | None = None  # the first echo held for its cause, and until when
        self._said_faulted: tuple[MembershipChanged, float] | None = None  # the latest view while a node's word is held

    # ---- public ----

    @property
    def run_id(self) -> int:
        return self.request.run_id

    def deadline(self) -> float | None:
        """When the adapter must deliver Tick (None: no timer pending)."""
        if self.state is RunState.WAITING_POOL:
            stable = self._pool_ready_at
            if stable is None or stable <= self._now:  # no placement yet, or its window passed: only the pool timeout
                return self._pool_deadline
            return min(self._pool_deadline, stable)
        held = [h[1] for h in (self._echo, self._said_faulted) if h is not None] if self.outcome is None else []
        if held:
            return min(held) if self._deadline is None else min(self._deadline, *held)
        return self._deadline

    def handle(self, event: Input, now: float) -> list[Action]:
        out: list[Action] = []
        self._now = max(self._now, now)
        if isinstance(event, Relay | RelayBatch):
            if self.state is not RunState.DONE:
                for relayed in (event.events if isinstance(event, RelayBatch) else (event.event,)):
                    ev = pb.LifecycleEvent()
                    ev.CopyFrom(relayed)
                    ev.run_id = self.run_id
                    out.append(Emit(ev))
                    if self._readiness is not None and self.state is RunState.WAITING_READY \
                            and ev.stage_index not in self._ready:
                        self._readiness.observe(ev, now)
                        self._deadline = self._readiness.deadline
            return out
        handler = {
            RunState.WAITING_POOL: self._on_waiting_pool,
            RunState.WAITING_READY: self._on_waiting_ready,
            RunState.RUNNING: self._on_running,
            RunState.TEARING_DOWN: self._on_tearing_down,
        }.get(self.state)
        if handler is not None:
            handler(event, now, out)
        return out

    # ---- helpers ----

    def _ev(self, kind: int, **fields: object) -> Emit:
        counters = fields.pop("counters", None)
        ev = pb.LifecycleEvent(kind=kind, run_id=self.run_id, **fields)  # type: ignore[arg-type]
        if counters:
            ev.counters.update(counters)  # type: ignore[arg-type]
        return Emit(ev)

    def _set_state(self, new: RunState) -> None:
        self.transitions.append((self.state, new))
        self.state = new

    def _stage(self, index: int) -> StagePlan | None:
        if self.plan is None or not 0 <= index < len(self.plan.stages):
            return None
        return self.plan.stages[index]

    def _stage_ev(self, kind: int, stage: StagePlan, **fields: object) -> Emit:
        return self._ev(kind, node_id=stage.node_id, stage_index=stage.stage_index, **fields)

    def _fault(self, out: list[Action], now: float, reason: int, detail: str, component: int = pb.COMPONENT_ORCHESTRATOR,
               stage: StagePlan | None = None) -> None:
        extra: dict[str, object] = {}
        if stage is not None:
            extra = {"node_id": stage.node_id, "stage_index": stage.stage_index}
        self._finish(out, now, Outcome.FAULTED, reason_name(reason), detail,
                     self._ev(K.RUN_FAULTED, reason=reason_name(reason), component=component, detail=detail, **extra))

    def _finish(self, out: list[Action], now: float, outcome: Outcome, reason: str, detail: str, event: Emit) -> None:
        """Record the one terminal outcome (first caller wins) and start teardown."""
        if self.outcome is not None:
            return
        self.outcome, self.reason, self.detail = outcome, reason, detail
        out.append(event)
        self._start_teardown(out, now)

    def _stage_fault(self, fault: StageFault, now: float, out: list[Action]) -> None:
        i, d = fault.stage_index, fault.detail
        self._fault(out, now, fault.reason, f"stage {i}: {d}" if d else f"stage {i} faulted", fault.component,
                    self._stage(i))

    def _start_teardown(self, out: list[Action], now: float) -> None:
        self._set_state(RunState.TEARING_DOWN)
        for index in sorted(self._provisioned - self._failed):
            stage = self.plan.stages[index]  # type: ignore[union-attr]
            out.append(StopStage(stage))
            out.append(self._stage_ev(K.STOP_RUN_SENT, stage))
            self._awaiting_stop.add(index)
        if self._endpoints_open:
            out.append(CloseEndpoints())
            self._endpoints_closing = True
        self._deadline = now + self.config.timeouts.teardown_s
        self._maybe_done(out)

    def _maybe_done(self, out: list[Action]) -> None:
        if self.state is not RunState.TEARING_DOWN:
            return
        if (self._awaiting_stop or self._endpoints_closing) and not self.teardown_timed_out:
            return
        counters = {"stages_stopped": len(self._provisioned - self._failed) - len(self._awaiting_stop),
                    "stages_unconfirmed": len(self._awaiting_stop)}
        if self.teardown_timed_out or self._teardown_left:
            pending = sorted(self._awaiting_stop)
            what = [f"no StageStopped from stage(s) {pending}"] if pending else []
            if self._endpoints_closing:
                what.append("token endpoints not closed")
            what = [f"{' and '.join(what)} within {self.config.timeouts.teardown_s}s"] if what else []
            out.append(self._ev(K.RUN_TORN_DOWN, reason=reason_name(pb.RUN_FAULT_TEARDOWN_TIMEOUT),
                                component=pb.COMPONENT_ORCHESTRATOR, counters=counters,
                                detail="; ".join(what + self._teardown_left)))
        else:
            out.append(self._ev(K.RUN_TORN_DOWN, counters=counters))
        self._deadline = None
        self._set_state(RunState.DONE)

    def _context(self) -> int:
        """The run's context: its own max_context within the plan's (the stages' KV slots are sized for the latter)."""
        assert self.plan is not None
        return min(self.plan.max_seq_len, self.request.max_context or self.plan.max_seq_len)

    def _membership_lost(self, event: MembershipChanged, now: float, out: list[Action]) -> None:
        lost = self._lost_nodes(event.members)
        if not lost:
            return
        s = lost[0]
        on = [str(t.stage_index) for t in lost if t.node_id == s.node_id]  # its stage devices' stages
        self._fault(out, now, pb.RUN_FAULT_MEMBERSHIP_LOST,
                    f"node {s.node_id} (stage{'s' if len(on) > 1 else ''} {', '.join(on)}) left the pool "
                    "or faulted", pb.COMPONENT_MEMBERSHIP, s)
        self._on_tearing_down(event, now, out)  # a departed node is not waited for

    def _lost_nodes(self, members: tuple[NodeInfo, ...]) -> list[StagePlan]:
        if self.plan is None:
            return []
        view = {m.node_id: m for m in members}
        return [s for s in self.plan.stages if s.node_id not in view or view[s.node_id].state in _LOST]

    def _common(self, event: Input, now: float, out: list[Action]) -> bool:
        """Inputs every active (provisioned) state treats alike; True when handled."""
        if isinstance(event, Tick) and self._said_faulted is not None and self.outcome is None and (
                now >= self._said_faulted[1] or (self._echo is not None and now >= self._echo[1])):
            view, self._said_faulted = self._said_faulted[0], None
            self._membership_lost(view, now, out)  # no stage said why: the node's word (a cause, unlike an echo)
            return True
        if isinstance(event, Tick) and self._echo is not None and now >= self._echo[1]:
            self._stage_fault(self._echo[0], now, out)  # no cause came: the echo is all that is known
            return True
        match event:
            case OperatorStop(detail=detail):
                self._finish(out, now, Outcome.STOPPED, "operator_stop", detail,
                             self._ev(K.RUN_STOPPED, component=pb.COMPONENT_ORCHESTRATOR, detail=detail))
            case StageFault(stage_index=i, reason=r, component=c, detail=d, cause=cause):
                stage = self._stage(i)
                if stage is None:
                    return True
                out.append(self._stage_ev(K.STAGE_FAULTED, stage, reason=reason_name(r), component=c, detail=d))
                if cause == ECHO_CAUSE:
                    if self._echo is None:
                        self._echo = (event, now + ECHO_GRACE_S)
                    return True
                self._stage_fault(event, now, out)
            case ProvisionFailed(stage_index=i, reason=r, detail=d):
                stage = self._stage(i)
                if stage is None:
                    return True
                self._failed.add(i)
                out.append(self._stage_ev(K.STAGE_FAULTED, stage, reason=reason_name(r),
                                          component=pb.COMPONENT_ORCHESTRATOR, detail=d))
                self._fault(out, now, r, f"provisioning stage {i} on node {stage.node_id} failed: {d}", stage=stage)
            case EndpointFault(reason=r, detail=d):
                self._fault(out, now, r, f"orchestrator token endpoint: {d}")
            case OrchestratorFault(reason=r, detail=d):
                self._fault(out, now, r, d)
            case MembershipChanged(members=members):
                lost = self._lost_nodes(members)
                view = {m.node_id: m for m in members}
                if lost and self.outcome is None and all(s.node_id in view and view[s.node_id].state is NodeState.FAULTED
                                                         for s in lost):
                    held_until = self._said_faulted[1] if self._said_faulted else now + ECHO_GRACE_S
                    self._said_faulted = (event, held_until)  # its stages' own reports first (above)
                elif lost:
                    self._said_faulted = None
                    self._membership_lost(event, now, out)
                else:
                    self._said_faulted = None  # back before the grace ended: nothing lost
            case _:
                return False
        return True

    # ---- states ----

    def _on_waiting_pool(self, event: Input, now: float, out: list[Action]) -> None:
        match event:
            case MembershipChanged(members=members):
                self._gate.observe(members, now)
            case OperatorStop(detail=detail):
                self._finish(out, now, Outcome.STOPPED, "operator_stop", detail,
                             self._ev(K.RUN_STOPPED, component=pb.COMPONENT_ORCHESTRATOR, detail=detail))
                return
            case OrchestratorFault(reason=r, detail=d):
                self._fault(out, now, r, d)
                return
            case _:
                pass
        status = self._gate.check(now, self._demand)
        self._pool_ready_at = status.ready_at
        if not status.ready:
            if status.waiting_for != self._waiting_for:
                self._waiting_for = status.waiting_for
                out.append(self._ev(K.POOL_WAITING, detail=f"waiting for {status.waiting_for}"))
            if now >= self._pool_deadline:
                self._fault(out, now, pb.RUN_FAULT_NODE_UNAVAILABLE,
                            f"pool not ready after {self.config.timeouts.pool_s}s: {status.detail}")
            return
        out.append(self._ev(K.POOL_READY, counters={"nodes": len(status.candidates)}, detail=status.detail))
        req, cfg = self.request, self.config
        try:
            plan = plan_run(
                run_id=req.run_id, model=req.model, pool=status.candidates, stages=req.stages,
                max_tokens=req.max_tokens, prompt_tokens=len(req.prompt_ids), sampling=req.sampling,
                orchestrator_node_id=cfg.orchestrator_node_id, max_seq_len_cap=cfg.max_seq_len_cap,
                ring_ceiling_bytes=cfg.ring_ceiling_bytes, node_ids=req.node_ids, id_source=self._id_source,
                placement=status.placement, max_slots_per_stage=cfg.max_slots_per_stage, kv_dtype=cfg.kv_dtype,
            )
        except PlanError as e:
            self._fault(out, now, e.reason, f"planning refused: {e}")
            return
        if req.joins and plan.seats() != req.joins:
            self._fault(out, now, pb.RUN_FAULT_NODE_UNAVAILABLE,
                        f"planning refused: the run joins the runs in flight on {_seats(req.joins)} but would sit on "
                        f"{_seats(plan.seats())} (a node's advertised memory changed): it would not share their weights")
            return
        self.plan = plan = dataclasses.replace(plan, prefill_chunk=cfg.prefill_chunk, trace_objects=req.trace_objects)
        self.timeouts = cfg.timeouts.for_ring(plan.ring_rtt_ms, plan.prompt_chunks)
        out.append(self._ev(K.RUN_PLANNED, counters={
            "stages": len(plan.stages), "edges": len(plan.edges), "layers": plan.model.num_layers,
            "max_seq_len": plan.max_seq_len, "ring_rtt_ms": round(plan.ring_rtt_ms),
            "first_token_timeout_ms": round(self.timeouts.first_token_s * 1000),
            "step_timeout_ms": round(self.timeouts.step_s * 1000)}))
        self._set_state(RunState.PROVISIONING)
        out.append(OpenEndpoints(plan))
        self._endpoints_open = True
        for stage in plan.stages:
            out.append(self._stage_ev(K.STAGE_PROVISION_STARTED, stage, counters=stage.counters()))
            out.append(Provision(plan, stage))
            self._provisioned.add(stage.stage_index)
        self._readiness = ReadinessBudget(cfg.timeouts.readiness_s, cfg.timeouts.readiness_min_fetch_bps, now)
        self._deadline = self._readiness.deadline
        self._set_state(RunState.WAITING_READY)

    def _on_waiting_ready(self, event: Input, now: float, out: list[Action]) -> None:
        if self._common(event, now, out):
            return
        match event:
            case StageReady(stage_index=i):
                stage = self._stage(i)
                if stage is None or i in self._ready:
                    return
                self._ready.add(i)
                out.append(self._stage_ev(K.STAGE_READY, stage))
            case EndpointsReady():
                self._endpoints_ready = True
            case Tick():
                if self._deadline is not None and now >= self._deadline:
                    waiting = sorted(set(range(self.request.stages)) - self._ready)
                    if waiting:
                        assert self._readiness is not None
                        detail = (f"stage(s) {waiting} not ready within {self.config.timeouts.readiness_s}s of their "
                                  f"last progress: {self._readiness.describe(waiting, now)}")
                    else:
                        detail = f"the orchestrator token endpoints not ready within {self.config.timeouts.readiness_s}s"
                    self._fault(out, now, pb.RUN_FAULT_READINESS_TIMEOUT, detail)
                return
            case _:
                return
        assert self.plan is not None
        if len(self._ready) == len(self.plan.stages) and self._endpoints_ready:
            out.append(self._ev(K.READINESS_BARRIER_PASSED, counters={"stages": len(self._ready)}))
            self._set_state(RunState.RUNNING)
            prompt = self.request.prompt_ids
            size = self.plan.prefill_chunk or len(prompt)
            chunks = [prompt[i:i + size] for i in range(0, len(prompt), size)]
            for i, ids in enumerate(chunks):  # all at once: the stages pipeline them (§16 "Prefill chunks" in the docs)
                out.append(InjectTokens(i, ids, PROMPT_CONTINUES if i < len(chunks) - 1 else 0))
            out.append(self._ev(K.PROMPT_INJECTED, sequence=0, counters={"tokens": len(prompt), "chunks": len(chunks)}))
            self._expected_seq, self._prompt_objects = 0, len(chunks)
            self._deadline = now + self.timeouts.first_token_s

    def _on_running(self, event: Input, now: float, out: list[Action]) -> None:
        if self._common(event, now, out):
            return
        match event:
            case PromptChunkDone(sequence=seq):
                if seq != self._expected_seq or seq >= self._prompt_objects - 1:
                    self._fault(out, now, pb.RUN_FAULT_SEQUENCE_VIOLATION,
                                f"token-out delivered no token for sequence {seq}; expected sequence {self._expected_seq}, "
                                f"the prompt's last chunk is {self._prompt_objects - 1}")
                    return
                self._expected_seq = seq + 1  # the first-token deadline covers the whole prompt
            case TokenReceived(sequence=seq, token_id=tid):
                if self._token_object_refused(seq, 1, now, out):
                    return
                self._take_tokens(seq, (tid,), now, out)
            case DraftsVerified(sequence=seq, token_ids=ids):
                if self._token_object_refused(seq, len(ids), now, out):
                    return
                self._take_tokens(seq, ids, now, out)
            case Drafted(sequence=seq, token_ids=ids):
                self._drafted(seq, ids, out)
            case Tick():
                if self._deadline is not None and now >= self._deadline:
                    first = self._expected_seq < self._prompt_objects
                    limit = self.timeouts.first_token_s if first else self.timeouts.step_s
                    self._fault(out, now, pb.RUN_FAULT_STEP_TIMEOUT,
                                f"no token for sequence {self._expected_seq} within the step timeout "
                                f"({'first token: ' if first else ''}{limit:.1f}s)")
            case _:
                pass

    def _token_object_refused(self, seq: int, tokens: int, now: float, out: list[Action]) -> bool:
        """Fault the run on a token-out object out of sequence or holding other than one token per row it was sent."""
        if seq != self._expected_seq or seq < self._prompt_objects - 1:
            self._fault(out, now, pb.RUN_FAULT_SEQUENCE_VIOLATION,
                        f"token-out delivered a token for sequence {seq}, expected sequence {self._expected_seq}"
                        f"{' (a prompt chunk: no token)' if seq < self._prompt_objects - 1 else ''}")
            return True
        if tokens != len(self._drafts) + 1:
            self._fault(out, now, pb.RUN_FAULT_OBJECT_FAILED,
                        f"token-out object {seq} holds {tokens} token(s); its token-in object had {len(self._drafts)} "
                        f"draft(s), so {len(self._drafts) + 1} were due")
            return True
        return False

    def _take_tokens(self, seq: int, sampled: tuple[int, ...], now: float, out: list[Action]) -> None:
        """The tokens sampled after the rows of object `seq`: the longest prefix of its drafts that they confirm, then
        the one sampled after it (a plain decode step has no drafts: its one token). Each is delivered as a run without
        drafts would have produced it; the next object carries the last of them, new drafts, and the rejected drafts'
        rows to drop (objflags rewind)."""
        drafts = self._drafts
        accepted = 0
        while accepted < len(drafts) and sampled[accepted] == drafts[accepted]:
            accepted += 1
        if drafts:
            self.drafted += len(drafts)
            self.accepted += accepted
            assert self._pacing is not None
            self._pacing.verified(len(drafts), accepted)
        for i, tid in enumerate(sampled[:accepted + 1]):
            self.tokens.append(tid)
            eog = tid in self.request.eog_ids
            counters = {"token_id": tid}
            if drafts and i == 0:
                counters |= {"drafted": len(drafts), "accepted": accepted}
            out.append(self._ev(K.TOKEN_RECEIVED, sequence=seq, counters=counters))
            out.append(Deliver(len(self.tokens) - 1, tid, eog))  # the answer's token index, not the object's sequence
            done = (
                "eos" if eog and not self.request.ignore_eos
                else "max_tokens" if len(self.tokens) >= self.request.max_tokens
                else "context_full" if len(self.request.prompt_ids) + len(self.tokens) >= self._context()
                else None
            )
            if done is not None:
                counters = {"tokens": len(self.tokens)}
                if self._pacing is not None:
                    counters |= {"drafted": self.drafted, "accepted": self.accepted}
                self._finish(out, now, Outcome.COMPLETED, done, "", self._ev(K.RUN_COMPLETED, detail=done, counters=counters))
                return
        last = sampled[accepted]
        self._expected_seq = seq + 1
        self._deadline = now + self.timeouts.step_s
        rewind = len(drafts) - accepted
        up_to = self._draft_room()
        if self.request.draft_model and up_to and self._pacing is not None and (k := self._pacing.allowance(up_to)):
            # the draft model answers off this loop (Drafted); the object waits for it, under the step's deadline
            self._drafts = ()
            self._awaiting_draft = InjectTokens(self._expected_seq, (last,), with_rewind(0, rewind))
            out.append(DraftWanted(self._expected_seq, k))
            return
        if self._lookup is not None:
            self._lookup.extend(sampled[:accepted + 1])
        self._drafts = self._lookup.draft(up_to) if self._lookup is not None and up_to else ()
        out.append(InjectTokens(self._expected_seq, (last, *self._drafts), with_rewind(VERIFY if self._drafts else 0, rewind)))

    def _draft_room(self) -> int:
        """Drafts the next object may carry: none past the run's last token or the context (their rows would be
        wasted), none without speculative decoding."""
        room = min(self.request.max_tokens - len(self.tokens), self._context() - len(self.request.prompt_ids)
                   - len(self.tokens)) - 1
        return max(0, min(self.request.speculate, room))

    def _drafted(self, seq: int, drafts: tuple[int, ...], out: list[Action]) -> None:
        """The draft model's answer completes the object that waited for it (a late answer for another is dropped)."""
        waiting = self._awaiting_draft
        if waiting is None or waiting.sequence != seq:
            return
        self._awaiting_draft = None
        vocab = self.request.model.vocab_size
        self._drafts = tuple(drafts[:self._draft_room()]) if all(0 <= t < vocab for t in drafts) else ()
        flags = waiting.flags | (VERIFY if self._drafts else 0)
        out.append(InjectTokens(seq, (*waiting.token_ids, *self._drafts), flags))

    def _on_tearing_down(self, event: Input, now: float, out: list[Action]) -> None:
        match event:
            case StageStopped(stage_index=i):
                stage = self._stage(i)
                if stage is None or i not in self._awaiting_stop:
                    return
                self._awaiting_stop.discard(i)
                out.append(self._stage_ev(K.STAGE_STOPPED, stage))
            case EndpointsClosed(left=left):
                self._endpoints_closing = False
                if left:
                    self._teardown_left.append(f"token endpoints: {left}")
            case StageFault(stage_index=i, reason=r, component=c, detail=d):
                stage = self._stage(i)
                if stage is not None:
                    out.append(self._stage_ev(K.STAGE_FAULTED, stage, reason=reason_name(r), component=c, detail=d))
                return
            case ProvisionFailed(stage_index=i, reason=r, detail=d):
                # A provisioning call still in flight when teardown began was refused: nothing to stop.
                stage = self._stage(i)
                if stage is None:
                    return
                self._failed.add(i)
                self._awaiting_stop.discard(i)
                out.append(self._stage_ev(K.STAGE_FAULTED, stage, reason=reason_name(r),
                                          component=pb.COMPONENT_ORCHESTRATOR, detail=d))
            case MembershipChanged(members=members):
                for s in self._lost_nodes(members):
                    if s.stage_index in self._awaiting_stop:
                        # A departed node cannot confirm: its run state died with it.
                        self._awaiting_stop.discard(s.stage_index)
                        out.append(self._stage_ev(K.STAGE_STOPPED, s, reason=reason_name(pb.RUN_FAULT_MEMBERSHIP_LOST),
                                                  component=pb.COMPONENT_MEMBERSHIP, detail="node left the pool"))
            case Tick():
                if self._deadline is not None and now >= self._deadline:
                    self.teardown_timed_out = True
            case _:
                return
        self._maybe_done(out)
