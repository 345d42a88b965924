"""The orchestrator's domain API (what the gRPC servicer delegates to): submit, stop, inspect runs,
and the membership view. One active run at a time (spec §43 defers concurrent runs on a chain)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from swactor.common.events import get_logger
from swactor.common.ids import new_id
from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator import fsm as F
from swactor.orchestrator.errors import RequestError
from swactor.orchestrator.fleet import StageFleet
from swactor.orchestrator.models import ModelRegistry
from swactor.orchestrator.nodes import NodeInfo
from swactor.orchestrator.pool import PoolGate
from swactor.orchestrator.runner import RunHandle, replay, wall_us
from swactor.orchestrator.store import RunStore
from swactor.orchestrator.tokenizer import (
    ChatTemplateError,
    Message,
    PromptTooLong,
    TokenizerError,
    chat_prompt,
)
from swactor.v1 import orchestrator_pb2 as opb


@dataclass(frozen=True)
class RunDefaults:
    stages: int = 1


class Orchestrator:
    def __init__(self, *, models: ModelRegistry, fleet: StageFleet, store: RunStore, fsm_config: F.FsmConfig,
                 defaults: RunDefaults = RunDefaults(), clock: Callable[[], float] = time.monotonic,
                 model_lister: Callable[[tuple[NodeInfo, ...]], Awaitable[opb.ListModelsResponse]] | None = None) -> None:
        self.models = models
        self._model_lister = model_lister
        self.fleet = fleet
        self.store = store
        self.fsm_config = fsm_config
        self.defaults = defaults
        self.clock = clock
        self.members: tuple[NodeInfo, ...] = ()
        self._gate = PoolGate(fsm_config.pool_window_s)
        self._runs: dict[int, RunHandle] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.log = get_logger()

    # ---- membership ----

    def set_members(self, members: tuple[NodeInfo, ...]) -> None:
        self.members = tuple(members)
        self._gate.observe(self.members, self.clock())
        for handle in self.active_runs():
            handle.report(F.MembershipChanged(self.members))

    def pool_status(self, stages: int = 1):
        return self._gate.check(self.clock(), stages)

    async def list_models(self) -> opb.ListModelsResponse:
        """Served models and every node's weights cache (models only when no lister is wired)."""
        if self._model_lister is not None:
            return await self._model_lister(self.members)
        from swactor.orchestrator.model_listing import served_models

        return opb.ListModelsResponse(models=served_models(self.models, None))

    # ---- runs ----

    def active_runs(self) -> list[RunHandle]:
        return [h for h in self._runs.values() if not h.done.is_set()]

    def _prompt_ids(self, req: opb.SubmitRunRequest, model) -> list[int]:
        tok = model.tokenizer
        which = req.WhichOneof("input")
        if which is None:
            raise RequestError.invalid("the request has neither `prompt`, `messages` nor `prompt_ids`")
        if which == "prompt_ids":
            ids = list(req.prompt_ids.ids)
            if not ids:
                raise RequestError.invalid("prompt_ids is empty")
            vocab = model.facts.vocab_size
            bad = next((i for i, t in enumerate(ids) if t >= vocab), None)
            if bad is not None:
                raise RequestError.invalid(f"prompt_ids[{bad}] = {ids[bad]} is not below the vocab size {vocab}")
            return ids
        if which == "prompt":
            if not req.prompt.strip():
                raise RequestError.invalid("prompt is empty")
            if req.raw:
                return self._encode(tok, req.prompt, model)
            messages = [Message("user", req.prompt)]
        else:
            if not req.messages.messages:
                raise RequestError.invalid("messages is empty")
            messages = [Message(m.role, m.content) for m in req.messages.messages]
            if not any(m.content.strip() for m in messages):
                raise RequestError.invalid("every message is empty")
        try:
            text = chat_prompt(tok, messages)
        except ChatTemplateError as e:
            raise RequestError.invalid(f"{e} (set raw to send the prompt without a template)") from None
        return self._encode(tok, text, model)

    def _encode(self, tok, text: str, model) -> list[int]:
        # A prompt that cannot fit is refused by its length before the merging, whose cost grows with it.
        context = min(model.facts.max_seq_len, self.fsm_config.max_seq_len_cap)
        try:
            return tok.encode(text, max_tokens=context - 1)
        except PromptTooLong as e:
            raise RequestError.invalid(f"prompt does not fit: {e}; the context holds {context}") from None
        except TokenizerError as e:
            raise RequestError.invalid(f"prompt cannot be tokenized: {e}") from None

    def submit(self, req: opb.SubmitRunRequest) -> opb.SubmitRunResponse:
        if req.max_tokens <= 0:
            raise RequestError.invalid(f"max_tokens must be positive, got {req.max_tokens}")
        s = req.sampling
        if s.temperature < 0 or not 0 <= s.top_p <= 1:
            raise RequestError.invalid(f"sampling out of range: temperature {s.temperature} (>= 0), top_p {s.top_p} (0..1)")
        model = self.models.get(req.model)
        prompt_ids = self._prompt_ids(req, model)
        stages = req.stages or self.defaults.stages
        if stages > model.facts.num_layers:
            raise RequestError.invalid(f"{stages} stages requested but model {model.name!r} has {model.facts.num_layers} blocks")
        if len(set(req.node_ids)) != len(req.node_ids) or (req.node_ids and len(req.node_ids) != stages):
            raise RequestError.invalid(f"node_ids must name {stages} distinct node(s), one per stage; got {list(req.node_ids)}")
        provisionable = [m for m in self.members if m.provisionable]
        if stages > len(provisionable):
            raise RequestError.precondition(
                f"{stages} stage(s) need {stages} Available node(s); the pool has {len(provisionable)} "
                f"(of {len(self.members)} known)")
        context = min(model.facts.max_seq_len, self.fsm_config.max_seq_len_cap)
        if len(prompt_ids) >= context:
            field = "prompt_ids" if req.WhichOneof("input") == "prompt_ids" else "prompt"
            raise RequestError.invalid(f"{field} is {len(prompt_ids)} tokens; the context holds {context}")
        active = self.active_runs()
        if active:
            raise RequestError.precondition(f"run {active[0].run_id} is still active; one run at a time")

        run_id = new_id()
        sampling = SamplingPolicy(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p or 1.0, seed=s.seed)
        request = F.RunRequest(run_id=run_id, model=model.facts, prompt_ids=tuple(prompt_ids), stages=stages,
                               max_tokens=req.max_tokens, sampling=sampling, eog_ids=model.tokenizer.eog_ids,
                               node_ids=tuple(req.node_ids), ignore_eos=req.ignore_eos,
                               trace_objects=req.trace_objects)
        fsm = F.RunFsm(request, self.fsm_config, self.clock(), pool_view=self._gate)
        record = opb.Run(run_id=run_id, model=model.name, state=opb.RUN_STATE_WAITING_POOL, stages=stages,
                         max_tokens=req.max_tokens, prompt_tokens=len(prompt_ids), created_us=wall_us(),
                         sampling=opb.Sampling(temperature=s.temperature, top_k=s.top_k, top_p=sampling.top_p, seed=s.seed))
        self.store.put(record)
        handle = RunHandle(fsm, record, model.tokenizer, self.fleet, self.store, self.clock)
        self._runs[run_id] = handle
        handle.report(F.MembershipChanged(self.members))
        self._tasks[run_id] = asyncio.create_task(handle.drive(), name=f"run-{run_id}")
        self.log.info("run_submitted", run_id=run_id, model=model.name, stages=stages, max_tokens=req.max_tokens,
                      prompt_tokens=len(prompt_ids), ignore_eos=req.ignore_eos)
        return opb.SubmitRunResponse(run_id=run_id, prompt_tokens=len(prompt_ids))

    def _known(self, run_id: int) -> opb.Run:
        handle = self._runs.get(run_id)
        if handle is not None:
            run = opb.Run()
            run.CopyFrom(handle.record)
            return run
        run = self.store.get(run_id)
        if run is None:
            raise RequestError.not_found(f"unknown run_id {run_id}")
        return run

    def get(self, run_id: int) -> opb.Run:
        return self._known(run_id)

    def list(self, limit: int) -> list[opb.Run]:
        return self.store.list(limit or 50)

    def events(self, run_id: int, kind: int = 0):
        self._known(run_id)
        return self.store.events(run_id, kind)

    async def stop(self, run_id: int, detail: str) -> opb.Run:
        run = self._known(run_id)
        handle = self._runs.get(run_id)
        if handle is not None and not handle.done.is_set():
            handle.report(F.OperatorStop(detail or "operator stop"))
            # The reply carries the recorded outcome; teardown continues after it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(handle.outcome_recorded.wait(), 5.0)
            return self._known(run_id)
        return run

    def watch(self, run_id: int) -> AsyncIterator[opb.RunUpdate]:
        run = self._known(run_id)
        handle = self._runs.get(run_id)
        if handle is not None:
            return handle.watch()
        return replay(self.store, run)

    async def wait(self, run_id: int) -> None:
        task = self._tasks.get(run_id)
        if task is not None:
            await asyncio.shield(task)

    async def shutdown(self) -> None:
        """Operator-stop every active run and give teardown a bounded time."""
        for handle in self.active_runs():
            handle.report(F.OperatorStop("orchestrator shutting down"))
        tasks = [t for t in self._tasks.values() if not t.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.fsm_config.timeouts.teardown_s + 1)
            for t in pending:
                t.cancel()
