"""The orchestrator's domain API (what the gRPC servicer delegates to): submit, stop, inspect runs,
and the membership view. Several runs may be active at once, as one group that shares one placement: each
decodes in its own KV cache slot of the same stages, over their one copy of the weights. A submitted run
starts when admission (admission.py) lets it in: at once when no run is active or when it can join the
group; else it waits in a bounded FIFO queue (queue.py), whose head alone is considered whenever a run is
placed or finishes or the membership changes. Each active run keeps its own RunHandle, FSM, events, outcome
and teardown. A run's memory is dropped when it finishes: reads of finished runs come from the run store,
whose retention (retention.py) bounds what it keeps. A SubmitRun with a client request id that names a run returns that
run (client_requests.py), so a client may retry one it does not know the fate of."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.common.ids import new_id
from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.api.validation import MAX_REQUEST_BYTES, check_fields, check_max_tokens
from swactor.orchestrator.fleet.fleet import StageFleet
from swactor.orchestrator.fleet.node_events import POOL_EVENTS_RUN_ID
from swactor.orchestrator.fleet.nodes import NodeInfo
from swactor.orchestrator.models.models import LoadedModel, ModelRegistry
from swactor.orchestrator.planning import dry_run
from swactor.orchestrator.planning.placement import MemoryNeed, Network, stage_count
from swactor.orchestrator.planning.planner import RunPlan, memory_need, run_max_seq_len
from swactor.orchestrator.planning.pool import Demand, PoolGate, PoolStatus
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs import run_sampling
from swactor.orchestrator.runs.admission import Candidate, Group, Start, Wait, admit
from swactor.orchestrator.runs.client_requests import RequestIds, RequestKey, request_key
from swactor.orchestrator.runs.queue import QueuedRun, QueueFull, RunLobby
from swactor.orchestrator.runs.retention import RetentionPolicy, RetentionSchedule
from swactor.orchestrator.runs.runner import RunHandle, RunUpdates, continued, replay
from swactor.orchestrator.runs.store import RunStore, StoreWriteError
from swactor.orchestrator.tokens.draft_model import DraftModel
from swactor.orchestrator.tokens.prompting import PromptPreparer
from swactor.orchestrator.tokens.tokenizer import Tokenizer
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

LIST_MAX_RUNS = 1000
LIST_MAX_BYTES = 3 << 20  # under gRPC's 4 MiB message limit
EVENTS_PAGE = 1000
EVENTS_PAGE_MAX = 10000
EVENTS_PAGE_BYTES = 1 << 20
# A resumed request's runs after its first: a placement that keeps failing ends the request rather than loop.
MAX_RESUMES = 3
# Faults of a part runs share (a stage host, its worker, an edge, the pool): a re-plan may route around them. A
# fault of the run's own (its input, a step of its own failing, its store record) would only recur.
RESUMABLE = frozenset(pb.RunFaultReason.Name(r) for r in (
    pb.RUN_FAULT_NODE_UNAVAILABLE, pb.RUN_FAULT_MEMBERSHIP_LOST, pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED,
    pb.RUN_FAULT_STREAM_FAULT, pb.RUN_FAULT_RING_FAULT, pb.RUN_FAULT_WORKER_FATAL, pb.RUN_FAULT_WORKER_CRASHED,
    pb.RUN_FAULT_STEP_TIMEOUT, pb.RUN_FAULT_READINESS_TIMEOUT, pb.RUN_FAULT_PROVISIONING_REJECTED))


@dataclass(frozen=True)
class RunDefaults:
    stages: int = 0  # 0: the planner's count (placement.stage_count: the fewest that fit, or a quicker one)


@dataclass(frozen=True)
class Limits:
    """What bounds the orchestrator's memory and store ([orchestrator] queue_depth, max_request_bytes,
    runs_max, runs_max_age_s)."""

    queue_depth: int = 16
    max_request_bytes: int = MAX_REQUEST_BYTES
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)


@dataclass(frozen=True)
class Prepared:
    """A validated, tokenized submission: what starting it needs."""

    request: F.RunRequest
    tokenizer: Tokenizer


class Orchestrator:
    def __init__(self, *, models: ModelRegistry, fleet: StageFleet, store: RunStore, fsm_config: F.FsmConfig,
                 defaults: RunDefaults = RunDefaults(), clock: Callable[[], float] = time.monotonic,
                 model_lister: Callable[[tuple[NodeInfo, ...]], Awaitable[opb.ListModelsResponse]] | None = None,
                 limits: Limits = Limits(),
                 pool_metrics: Callable[[tuple[NodeInfo, ...]], Awaitable[opb.GetPoolMetricsResponse]] | None = None,
                 draft_model: DraftModel | None = None) -> None:
        self.models = models
        self.draft_model = draft_model  # [orchestrator] draft_model, loaded
        self._model_lister = model_lister
        self._pool_metrics = pool_metrics
        self.fleet = fleet
        self.store = store
        self.fsm_config = fsm_config
        self.defaults = defaults
        self.limits = limits
        self.clock = clock
        self.members: tuple[NodeInfo, ...] = ()
        self._gate = PoolGate(fsm_config.pool_window_s)
        # RTTs come with set_rtts
        self._gate.network = Network(fsm_config.orchestrator_node_id, by_speed=fsm_config.split_by_speed)
        self._prompts = PromptPreparer(models, fsm_config.max_seq_len_cap)
        self._lobby = RunLobby(limits.queue_depth, store, clock)
        self._retention = RetentionSchedule(limits.retention, clock())
        self._request_ids = RequestIds(store.request_run)
        self._active: dict[int, RunHandle] = {}  # the runs in flight, in the order they started
        self._tasks: dict[int, asyncio.Task[None]] = {}  # each active run's driver
        self._group: Group | None = None  # what the active runs share: the first one's placement, once it is made
        self._closing = False
        self.log = get_logger()

    # ---- membership ----

    def set_members(self, members: tuple[NodeInfo, ...]) -> None:
        self.members = tuple(members)
        self._gate.observe(self.members, self.clock())
        for handle in self.active_runs():
            handle.report(F.MembershipChanged(self.members))
        self._admit_waiting()  # a node of the group back to Available may let the queue's head join

    def set_rtts(self, rtts: Mapping[tuple[int, int], float]) -> None:
        """The round trips members measured ((from, to) -> ms): later placements order their stages by them."""
        self._gate.network = dataclasses.replace(self.network, rtt_ms=dict(rtts))

    @property
    def network(self) -> Network:
        assert self._gate.network is not None
        return self._gate.network

    def pool_status(self, stages: int = 1) -> PoolStatus:
        return self._gate.check(self.clock(), Demand(stages))

    async def list_models(self) -> opb.ListModelsResponse:
        """Served models and every node's weights cache (models only when no lister is wired)."""
        if self._model_lister is not None:
            resp = await self._model_lister(self.members)
        else:
            from swactor.orchestrator.models.model_listing import served_models

            resp = opb.ListModelsResponse(models=served_models(self.models, None))
        for m in resp.models:
            loaded = self.models.loaded(m.name)
            if loaded is not None:
                m.context_length = run_max_seq_len(loaded.facts, self.fsm_config.max_seq_len_cap)
        return resp

    async def pool_metrics(self) -> opb.GetPoolMetricsResponse:
        """Every member's own figures (none when nothing is wired to ask them)."""
        if self._pool_metrics is None:
            return opb.GetPoolMetricsResponse()
        return await self._pool_metrics(self.members)

    # ---- runs ----

    def active_runs(self) -> list[RunHandle]:
        return [h for h in self._active.values() if not h.done.is_set()]

    def queued(self) -> int:
        return len(self._lobby)

    def live_run_ids(self) -> list[int]:
        """The runs this process holds in memory: the active ones, then the queued ones (each in its order)."""
        return list(self._active) + list(self._lobby.waiting)

    def node_slots(self) -> dict[int, tuple[int, int]]:
        """node id -> (runs active on it, the run slots it holds for the group): the nodes the runs in flight use. A
        run counts once on a node that carries several of its stages; the node holds the fewest slots of those
        stages (a run needs one in each)."""
        if self._group is None:
            return {}
        in_use = dict.fromkeys(self._group.node_ids, 0)
        for handle in self._active.values():
            plan = handle.fsm.plan
            on = {s.node_id for s in plan.stages} if plan is not None else set(handle.fsm.request.node_ids)
            for node_id in on & in_use.keys():
                in_use[node_id] += 1
        slots: dict[int, int] = {}
        for seat in self._group.seats:
            slots[seat.node_id] = min(slots.get(seat.node_id, seat.run_slots), seat.run_slots)
        return {node_id: (in_use[node_id], n) for node_id, n in slots.items()}

    async def _admit(self, req: opb.SubmitRunRequest) -> tuple[LoadedModel, list[int], int, int]:
        """The request checked against the model as SubmitRun takes it: (model, prompt ids, stages, the run's
        context: max_context, else the model's context as capped)."""
        check_fields(req)
        model, prompt_ids = await self._prompts.prepare(req)
        context = self._prompts.context(model)
        if req.max_context > context:
            raise RequestError.invalid(f"max_context {req.max_context} is more than model {model.name!r}'s context "
                                       f"({context} tokens, at most [orchestrator].max_seq_len)")
        context = req.max_context or context
        if req.max_context and req.max_tokens > context:
            raise RequestError.invalid(f"max_tokens {req.max_tokens} is more than max_context {context} holds "
                                       "(prompt included)")
        check_max_tokens(req, context)
        # pinned nodes say how many stages; else the request, the configured default, or the planner's count
        stages = req.stages or len(req.node_ids) or self.defaults.stages or stage_count(
            self.members, model.facts.num_layers, self._memory(model), self.network)
        if stages > model.facts.num_layers:
            raise RequestError.invalid(f"{stages} stages requested but model {model.name!r} has {model.facts.num_layers} blocks")
        if req.node_ids and len(req.node_ids) != stages:
            # a node named k times carries k stages, on k of its stage devices (placement checks it has them)
            raise RequestError.invalid(f"node_ids must name {stages} node(s), one per stage; got {list(req.node_ids)}")
        if len(prompt_ids) >= context:
            field = "prompt_ids" if req.WhichOneof("input") == "prompt_ids" else "prompt"
            bound = f"max_context {context} leaves no room for a token" if req.max_context else f"the context holds {context}"
            raise RequestError.invalid(f"{field} is {len(prompt_ids)} tokens; {bound}")
        if req.speculate and req.drafter == opb.DRAFTER_DRAFT_MODEL and (why := self._draft_model_refuses(model)):
            raise RequestError.invalid(f"drafter DRAFTER_DRAFT_MODEL: {why}")
        return model, prompt_ids, stages, context

    def _draft_model_refuses(self, model: LoadedModel) -> str:
        """Why runs of `model` cannot draft with the draft model ("" when they can)."""
        if self.draft_model is None:
            return "this orchestrator has no draft model ([orchestrator] draft_model)"
        return self.draft_model.refuses(model.tokenizer, model.name)

    def _memory(self, model: LoadedModel) -> MemoryNeed | None:
        return memory_need(model.facts, self.fsm_config.max_seq_len_cap, self.fsm_config.max_slots_per_stage,
                           self.fsm_config.kv_dtype)

    def _demand(self, model: LoadedModel, stages: int, node_ids: Sequence[int], joins: Group | None = None) -> Demand:
        ranges = tuple((s.layer_start, s.layer_end_exclusive) for s in joins.seats) if joins is not None else ()
        return Demand(stages, tuple(node_ids), model.facts.num_layers, self._memory(model), ranges)

    async def plan(self, req: opb.SubmitRunRequest) -> opb.PlanResponse:
        """SubmitRun's checks and the placement it would get now, with per-stage bytes; nothing starts."""
        self._check_open()
        model, prompt_ids, stages, _ = await self._admit(req)
        admission, joins = self._would_admit(model.name, stages, tuple(req.node_ids))
        demand = self._demand(model, stages, joins.node_ids if joins is not None else req.node_ids, joins)
        out = dry_run.plan_response(model.name, self.members, demand, self._gate.check(self.clock(), demand),
                                    prompt_tokens=len(prompt_ids),
                                    max_seq_len=run_max_seq_len(model.facts, self.fsm_config.max_seq_len_cap),
                                    network=self.network)
        out.admission = admission
        out.stages_fitted = not (req.stages or req.node_ids or self.defaults.stages)
        return out

    def _would_admit(self, model: str, stages: int, node_ids: tuple[int, ...]) -> tuple[str, Group | None]:
        """What admission would answer a run submitted now (it would join the queue's tail), and the group it joins."""
        if len(self._lobby):
            return f"waits behind the {len(self._lobby)} queued run(s) (first in, first out)", None
        match self._verdict(model, stages, node_ids):
            case Start(joins=None):
                return "starts now", None
            case Start(joins=group) if group is not None:
                slots = group.slots(self.fsm_config.max_slots_per_stage)
                return (f"joins the {len(self._active)} run(s) in flight on node(s) "
                        f"{', '.join(map(str, dict.fromkeys(group.node_ids)))} (run slot {len(self._active) + 1} of {slots})"), group
            case Wait(why):
                return f"waits for {why}", None
        raise AssertionError("admission answers Start or Wait")  # pragma: no cover

    async def submit(self, req: opb.SubmitRunRequest) -> opb.SubmitRunResponse:
        self._check_open()
        key = request_key(req)
        if key is None:
            return await self._submit(req, None)
        # Before the queue's room is checked: a retry of a queued run gets that run even when the queue is full.
        repeated = await self._request_ids.claim(key)
        if repeated is not None:
            return self._repeat(repeated, key)
        try:
            return await self._submit(req, key)
        finally:
            self._request_ids.release(key)

    def _repeat(self, run_id: int, key: RequestKey) -> opb.SubmitRunResponse:
        """What the SubmitRun that created the run answered, with the run's queue position now."""
        run = self._known(run_id)
        self.log.info("run_submit_repeated", run_id=run_id, client_request_id=key.request_id,
                      state=opb.RunState.Name(run.state), queue_position=run.queue_position)
        return opb.SubmitRunResponse(run_id=run_id, prompt_tokens=run.prompt_tokens, queue_position=run.queue_position)

    async def _submit(self, req: opb.SubmitRunRequest, key: RequestKey | None) -> opb.SubmitRunResponse:
        self._check_queue_room()  # before the tokenizer's work; again once it is done
        model, prompt_ids, stages, context = await self._admit(req)
        refusal = dry_run.pool_refusal(self.members, self._demand(model, stages, req.node_ids), self.network)
        if refusal:
            raise RequestError.precondition(refusal)
        self._check_open()

        run_id = new_id()
        sampling, recorded_sampling = run_sampling.applied(req.sampling)
        request = F.RunRequest(run_id=run_id, model=model.facts, prompt_ids=tuple(prompt_ids), stages=stages,
                               max_tokens=req.max_tokens, sampling=sampling, eog_ids=model.tokenizer.eog_ids,
                               node_ids=tuple(req.node_ids), ignore_eos=req.ignore_eos,
                               trace_objects=req.trace_objects, max_context=context,
                               stop_when_unwatched=req.stop_when_unwatched, resume=req.resume,
                               speculate=req.speculate,
                               draft_model=bool(req.speculate) and req.drafter != opb.DRAFTER_PROMPT_LOOKUP
                               and not self._draft_model_refuses(model))
        record = opb.Run(run_id=run_id, model=model.name, state=opb.RUN_STATE_WAITING_POOL, stages=stages,
                         max_tokens=req.max_tokens, prompt_tokens=len(prompt_ids), created_us=wall_us(),
                         sampling=recorded_sampling, client_request_id=req.client_request_id, max_context=context,
                         resume=req.resume)
        prepared = Prepared(request, model.tokenizer)
        position = 0
        if key is not None:  # written with the run's first record, below
            self.store.remember_request(key.request_id, run_id, key.digest)
        try:
            # Behind a waiting run it waits too (first in, first out); else admission says whether it starts now.
            decision = None if len(self._lobby) else self._decide(record, prepared)
            if isinstance(decision, Start):
                self.store.put(record)
                updates = self._start(record, prepared, joins=decision.joins).updates
            else:
                position = self._lobby.enqueue(record, prepared)
                updates = self._lobby.waiting[run_id].updates
                if isinstance(decision, Wait):  # it is the head: say what it waits for
                    self._lobby.head_waits(decision.why)
            if req.stop_when_unwatched:
                updates.on_unwatched = lambda: self._client_gone(run_id)
        except QueueFull as e:
            self.store.discard(run_id)  # the client request id staged for it
            raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
        except StoreWriteError as e:
            self.store.discard(run_id)
            raise RequestError(grpc.StatusCode.UNAVAILABLE, f"the run store cannot be written: {e}") from None
        self.log.info("run_submitted", run_id=run_id, model=model.name, stages=stages, max_tokens=req.max_tokens,
                      prompt_tokens=len(prompt_ids), ignore_eos=req.ignore_eos, queue_position=position,
                      client_request_id=req.client_request_id, seed=sampling.seed, max_context=context,
                      waits_for=decision.why if isinstance(decision, Wait) else None)
        return opb.SubmitRunResponse(run_id=run_id, prompt_tokens=len(prompt_ids), queue_position=position)

    def _client_gone(self, run_id: int) -> None:
        """The last WatchRun stream of a stop_when_unwatched run ended before the run: stop it (queued or active)."""
        detail = "client gone: its last WatchRun stream ended"
        self.log.info("run_client_gone", run_id=run_id)
        self._stop_now(run_id, detail)

    def _check_open(self) -> None:
        if self._closing:
            raise RequestError(grpc.StatusCode.UNAVAILABLE, "the orchestrator is shutting down")

    def _check_queue_room(self) -> None:
        """Refuse early, before the tokenizer's work, a run that would queue behind a full queue. A run submitted
        while the queue is empty may yet join the runs in flight: that is known once it is tokenized."""
        if len(self._lobby):
            try:
                self._lobby.check_room()
            except QueueFull as e:
                raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None

    # ---- admission ----

    def _decide(self, record: opb.Run, prepared: Prepared) -> Start | Wait:
        """Admission's answer for one run (admission.admit): Start (alone, or joining the group) or Wait."""
        request = prepared.request
        return self._verdict(record.model, request.stages, tuple(request.node_ids), joins_group=not request.resumes)

    def _verdict(self, model: str, stages: int, node_ids: tuple[int, ...], joins_group: bool = True) -> Start | Wait:
        return admit(Candidate(model, stages, node_ids, joins_group), len(self._active), self._group, self.members,
                     self.fsm_config.max_slots_per_stage)

    def _admit_waiting(self) -> None:
        """Start the queue's head as long as admission lets it in; a head that must wait holds the runs behind it."""
        while not self._closing:
            head: QueuedRun | None = self._lobby.head()
            if head is None:
                return
            decision = self._decide(head.record, head.start)
            if not isinstance(decision, Start):
                self._lobby.head_waits(decision.why)
                return
            queued = self._lobby.take_next()
            assert queued is head
            self._start(queued.record, queued.start, queued.updates, joins=decision.joins)

    def _start(self, record: opb.Run, prepared: Prepared, updates: RunUpdates | None = None,
               joins: Group | None = None) -> RunHandle:
        request = prepared.request
        if joins is not None:
            # Pinned to the group's nodes in their order, on the group's blocks (the seats' ranges: speeds measured
            # since do not move them) and so its slots (the FSM checks that it did): its stages share the weights.
            request = dataclasses.replace(request, node_ids=joins.node_ids, joins=joins.seats)
        drafts = (self.draft_model.lease(request.sampling, len(request.prompt_ids))
                  if request.draft_model and self.draft_model is not None else None)
        if request.draft_model and drafts is None:  # every slot drafts for a run in flight: this one looks up
            request = dataclasses.replace(request, draft_model=False)
        fsm = F.RunFsm(request, self.fsm_config, self.clock(), pool_view=self._gate)
        record.state = opb.RUN_STATE_WAITING_POOL
        handle = RunHandle(fsm, record, prepared.tokenizer, self.fleet, self.store, self.clock, updates,
                           on_planned=lambda plan: self._planned(handle, plan), on_ending=self._resume, drafts=drafts)
        self._active[handle.run_id] = handle
        handle.report(F.MembershipChanged(self.members))
        task = self._tasks[handle.run_id] = asyncio.create_task(handle.drive(), name=f"run-{handle.run_id}")
        task.add_done_callback(lambda _: self._finished(handle))
        self.log.info("run_admitted", run_id=handle.run_id, joins=list(joins.node_ids) if joins else None,
                      active=len(self._active),
                      drafter=None if not request.speculate else "draft_model" if drafts else "prompt_lookup")
        return handle

    def _planned(self, handle: RunHandle, plan: RunPlan) -> None:
        """A run is placed: the first of a group sets what the others share; the queue's head may now join."""
        if self._group is None and handle.run_id in self._active:
            self._group = Group.of(handle.record.model, plan)
        # its stages now hold these weights: the next run of as many stages keeps this ring while it is near enough,
        # and these blocks on it while no other split is faster by SPEED_GAIN
        units = tuple(s.node.unit for s in plan.stages)
        blocks = tuple((s.layer_start, s.layer_end_exclusive) for s in plan.stages)
        self._gate.network = dataclasses.replace(self.network, warm={**self.network.warm, len(units): units},
                                                 warm_blocks={**self.network.warm_blocks, units: blocks})
        self._admit_waiting()

    # ---- resumed requests (SubmitRunRequest.resume) ----

    def _resume(self, handle: RunHandle) -> None:
        """A run of a resumable request ends: when a shared part faulted it before its end and a placement fits
        without that part, the request goes on as a new run at the queue's head, whose prompt is this run's plus
        the tokens it delivered. The run keeps its own outcome; its record and events name the new run, and its
        watchers follow that one (RunUpdates.continue_with)."""
        run, request = handle.record, handle.fsm.request
        delivered = tuple(run.token_ids)
        if not (request.resume and run.outcome == opb.RUN_OUTCOME_FAULTED and run.reason in RESUMABLE) or self._closing:
            return
        left = request.max_tokens - len(delivered)
        prompt = request.prompt_ids + delivered
        ended = bool(delivered) and delivered[-1] in request.eog_ids and not request.ignore_eos
        why = (f"its request was resumed {MAX_RESUMES} times already" if request.resumes >= MAX_RESUMES
               else "it delivered all its tokens" if left <= 0 or ended
               else "its context is full" if len(prompt) >= (request.max_context or len(prompt) + 1) else "")
        model = self.models.loaded(run.model)
        if not why and model is None:
            why = f"model {run.model!r} is no longer served"
        stages = request.stages
        if not why and model is not None:
            # The same stage count where it fits the pool without the lost part; else the planner's count.
            if dry_run.pool_refusal(self.members, self._demand(model, stages, ()), self.network):
                stages = stage_count(self.members, model.facts.num_layers, self._memory(model), self.network)
            why = dry_run.pool_refusal(self.members, self._demand(model, stages, ()), self.network)
        if why:
            self.log.info("run_not_resumed", run_id=run.run_id, reason=run.reason, why=why)
            return
        assert model is not None
        sampling = request.sampling
        if not sampling.greedy:  # its sampler goes on where this one's stopped: one draw per token delivered
            sampling = dataclasses.replace(sampling, skip_draws=sampling.skip_draws + len(delivered))
        run_id = new_id()
        nxt = dataclasses.replace(request, run_id=run_id, prompt_ids=prompt, max_tokens=left, stages=stages,
                                  node_ids=(), joins=(), sampling=sampling, resumes=request.resumes + 1)
        record = opb.Run(run_id=run_id, model=run.model, state=opb.RUN_STATE_WAITING_POOL, stages=stages,
                         max_tokens=left, prompt_tokens=len(prompt), created_us=wall_us(), sampling=run.sampling,
                         max_context=run.max_context, resume=True, resumed_from=run.run_id,
                         resumed_tokens=run.resumed_tokens + len(delivered))
        try:
            self._lobby.enqueue(record, Prepared(nxt, handle.tokenizer), first=True)
        except StoreWriteError as e:
            self.store.discard(run_id)
            self.log.error("run_not_resumed", run_id=run.run_id, reason=run.reason, why=f"the run store: {e}")
            return
        queued = self._lobby.waiting[run_id]
        if request.stop_when_unwatched:
            queued.updates.on_unwatched = lambda: self._client_gone(run_id)
        run.resumed_by = run_id
        ev = pb.LifecycleEvent(kind=pb.RUN_RESUMED, run_id=run.run_id, component=pb.COMPONENT_ORCHESTRATOR,
                               detail=f"continued as run {run_id} on the healthy nodes after {run.reason}")
        ev.counters.update({"resumed_by": run_id, "tokens": len(delivered)})
        handle.emit_after_outcome(ev)
        handle.updates.continue_with(queued.updates, len(delivered))
        self.log.info("run_resumed", run_id=run.run_id, resumed_by=run_id, reason=run.reason, tokens=len(delivered),
                      stages=stages, resumes=nxt.resumes)

    def _latest(self, run_id: int) -> int:
        """The run a request goes on as now: `run_id`, or the run that resumed it, and so on."""
        seen = {run_id}
        while (nxt := self._known(run_id).resumed_by) and nxt not in seen:
            run_id = nxt
            seen.add(nxt)
        return run_id

    def _finished(self, handle: RunHandle) -> None:
        """An active run is done: drop it from memory (the store has it) and admit from the queue. The last
        one out ends the group: the queue's head is then placed on its own and founds the next."""
        self._active.pop(handle.run_id, None)
        self._tasks.pop(handle.run_id, None)
        if not self._active:
            self._group = None
        self.store.release(handle.run_id)
        self._retention.run_finished(self.clock())
        self._admit_waiting()
        self.maintain()

    def maintain(self) -> None:
        """Retention: delete the finished runs the policy no longer keeps, when a pass is due."""
        now = self.clock()
        if not self._retention.due(now):
            return
        try:
            victims = self.limits.retention.victims(self.store.finished_runs(), wall_us())
            self.store.delete_runs(victims)
        except StoreWriteError as e:
            self.log.error("run_store_retention_failed", error=str(e))
            victims = []
        self._retention.passed(now, len(victims))
        if victims:
            self.log.info("run_store_pruned", runs_deleted=len(victims), store_bytes=self.store.size_bytes())

    def _known(self, run_id: int) -> opb.Run:
        live: RunHandle | QueuedRun | None = self._active.get(run_id) or self._lobby.get(run_id)
        if live is not None:
            run = opb.Run()
            run.CopyFrom(live.record)
            return run
        run = self.store.get(run_id)
        if run is None:
            raise RequestError.not_found(f"unknown run_id {run_id}")
        return run

    def get(self, run_id: int) -> opb.Run:
        return self._known(run_id)

    def list(self, limit: int) -> list[opb.Run]:
        return self.store.list(min(limit or 50, LIST_MAX_RUNS), LIST_MAX_BYTES)

    def events(self, run_id: int, kind: int = 0, page_size: int = 0, page_token: str = "") -> opb.GetEventsResponse:
        """One page of a run's events and the token for the next ("" = last page); run id 0 is the
        pool's own node lifecycle events (fleet/node_events.py)."""
        if run_id != POOL_EVENTS_RUN_ID:
            self._known(run_id)
        try:
            start = int(page_token) if page_token else 0
        except ValueError:
            start = -1
        if start < 0:
            raise RequestError.invalid(f"page_token {page_token!r} is not one this orchestrator gave")
        size = min(page_size or EVENTS_PAGE, EVENTS_PAGE_MAX)
        events, after = self.store.events_page(run_id, kind, start, size, EVENTS_PAGE_BYTES)
        return opb.GetEventsResponse(events=events, next_page_token="" if after is None else str(after))

    async def stop(self, run_id: int, detail: str) -> opb.Run:
        run = self._known(run_id)
        run_id = self._latest(run_id)  # a resumed request: the run it goes on as
        match self._stop_now(run_id, detail or "operator stop"):
            case opb.Run() as stopped_in_queue:
                return stopped_in_queue
            case RunHandle() as handle:
                # The reply carries the recorded outcome; teardown continues after it.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(handle.outcome_recorded.wait(), 5.0)
                return self._known(run_id)
        return run

    def _stop_now(self, run_id: int, detail: str) -> opb.Run | RunHandle | None:
        """Stop a queued run (its record, stopped) or ask an active one to stop (its handle); None if it is neither."""
        if self._lobby.get(run_id) is not None:
            stopped = self._lobby.stop(run_id, detail)
            self._admit_waiting()  # the next head may start where the stopped one could not (or says what it waits for)
            return stopped
        handle = self._active.get(run_id)
        if handle is not None and not handle.done.is_set():
            handle.report(F.OperatorStop(detail))
            return handle
        return None

    def watch(self, run_id: int) -> AsyncIterator[opb.RunUpdate]:
        run = self._known(run_id)
        queued = self._lobby.get(run_id)
        if queued is not None:
            return queued.watch()
        handle = self._active.get(run_id)
        if handle is not None:
            return handle.watch()
        return self._replay(run)

    async def _replay(self, run: opb.Run) -> AsyncIterator[opb.RunUpdate]:
        """A finished run's stored updates; a resumed one's go on with the run that continued it."""
        model = self.models.loaded(run.model)
        async for u in replay(self.store, run, model.tokenizer if model is not None else None):
            if u.HasField("finished") and run.resumed_by:
                async for v in continued(self.watch(run.resumed_by), len(run.token_ids)):
                    yield v
                return
            yield u

    async def shutdown(self) -> None:
        """Operator-stop every active run and give their teardowns, together, a bounded time. Queued runs stay
        queued in the store: the next start records them faulted RUN_FAULT_ORCHESTRATOR_RESTARTED."""
        self._closing = True
        for handle in self.active_runs():
            handle.report(F.OperatorStop("orchestrator shutting down"))
        tasks = [t for t in self._tasks.values() if not t.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.fsm_config.timeouts.teardown_s + 1)
            for t in pending:
                t.cancel()
        self._prompts.close()
