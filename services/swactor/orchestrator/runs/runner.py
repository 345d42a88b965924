"""The asyncio adapter around one RunFsm: feeds it inputs and timer ticks, performs its actions.

Fleet calls run as tasks and report back through the run's input queue, so the FSM sees every
outcome (including a failed call) as an input. Token injection goes through one ordered task per
run. Every lifecycle event is stamped, stored, logged and published to watchers; the run record is
persisted after every step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from swactor.common.clock import wall_us
from swactor.common.events import get_logger
from swactor.orchestrator.fleet.fleet import FleetError, StageFleet, TokenEndpoints
from swactor.orchestrator.planning.planner import RunPlan
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.runs.failure_teardown import FailureTeardown
from swactor.orchestrator.runs.store import RunStore, StoreWriteError
from swactor.orchestrator.tokens.draft_model import DraftSlot
from swactor.orchestrator.tokens.tokenizer import StreamDecoder, Tokenizer
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

PER_OBJECT_KINDS = frozenset({pb.OBJECT_LOADED, pb.EXECUTE_STEP_STARTED, pb.OBJECT_PRODUCED, pb.STEP_COMPLETED,
                              pb.TOKEN_RECEIVED, pb.EDGE_OBJECT_SENT, pb.EDGE_OBJECT_RECEIVED})
# Kept in the run's events but not journaled either: up to two per stage per second for a whole download.
UNJOURNALED_KINDS = PER_OBJECT_KINDS | {pb.WEIGHTS_DOWNLOAD_PROGRESS}


async def continued(updates: AsyncIterator[opb.RunUpdate], tokens_before: int) -> AsyncIterator[opb.RunUpdate]:
    """A resumed request's next run as its first run's watchers see it: its token deltas numbered after the
    `tokens_before` the request delivered already (its events and `finished` as they are)."""
    async for u in updates:
        if u.HasField("token") and tokens_before:
            shifted = opb.RunUpdate()
            shifted.CopyFrom(u)
            shifted.token.sequence += tokens_before
            u = shifted
        yield u


class RunUpdates:
    """A run's WatchRun updates in order, from the first (RUN_QUEUED when it waited) to `finished`:
    each watcher replays them from the first, then follows new ones as they come. A run whose request
    resumed as another run (`continue_with`, set before its `finished`) goes on with that run's updates
    in place of its own `finished`."""

    def __init__(self) -> None:
        self.items: list[opb.RunUpdate] = []
        self._more = asyncio.Event()
        self._watchers = 0
        # called when the last open watch ends before `finished` (SubmitRunRequest.stop_when_unwatched)
        self.on_unwatched: Callable[[], None] | None = None
        self._next: tuple[RunUpdates, int] | None = None

    def append(self, update: opb.RunUpdate) -> None:
        self.items.append(update)
        self._more.set()

    def continue_with(self, updates: RunUpdates, tokens_before: int) -> None:
        """The request goes on as the run publishing `updates`, after this run's `tokens_before` tokens."""
        self._next = (updates, tokens_before)

    async def watch(self) -> AsyncIterator[opb.RunUpdate]:
        index = 0
        self._watchers += 1
        try:
            while True:
                while index < len(self.items):
                    update = self.items[index]
                    index += 1
                    if update.HasField("finished") and self._next is not None:
                        nxt, before = self._next
                        async for u in continued(nxt.watch(), before):
                            yield u
                        return
                    yield update
                    if update.HasField("finished"):
                        return
                self._more.clear()  # no await since the last look: nothing can be appended in between
                await self._more.wait()
        finally:  # also when the client went away: grpc cancels the stream
            self._watchers -= 1
            finished = bool(self.items) and self.items[-1].HasField("finished")
            if self._watchers == 0 and not finished and self.on_unwatched is not None:
                self.on_unwatched()


class RunHandle:
    """One live run: its FSM, its input queue, its published updates and its record."""

    def __init__(self, fsm: F.RunFsm, record: opb.Run, tokenizer: Tokenizer, fleet: StageFleet, store: RunStore,
                 clock: Callable[[], float] = time.monotonic, updates: RunUpdates | None = None,
                 on_planned: Callable[[RunPlan], None] | None = None,
                 on_ending: Callable[[RunHandle], None] | None = None, drafts: DraftSlot | None = None) -> None:
        self.fsm = fsm
        self.drafts = drafts  # the run's slot in the draft model (RunRequest.draft_model)
        self.record = record
        self.fleet = fleet
        self.store = store
        self.clock = clock
        self.inputs: asyncio.Queue[F.Input] = asyncio.Queue()
        self.updates = RunUpdates() if updates is None else updates  # a queued run's, when it waited
        self.tokenizer = tokenizer
        self._decoder = StreamDecoder(tokenizer)
        for tid in fsm.request.prompt_ids[len(fsm.request.prompt_ids) - min(record.resumed_tokens, 8):]:
            self._decoder.push(tid)  # a resumed request's text goes on from its last tokens (UTF-8 split over them)
        self._endpoints: TokenEndpoints | None = None
        self._endpoints_ready = asyncio.Event()
        self._injections: asyncio.Queue[F.InjectTokens] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._provisioning: dict[int, asyncio.Task[None]] = {}
        self._opening: asyncio.Task[None] | None = None
        self.log = get_logger(run_id=fsm.run_id)
        self.done = asyncio.Event()
        self.outcome_recorded = asyncio.Event()
        self._store_fault_reported = False
        self._on_planned = on_planned  # told once, when the FSM has placed the run (admission waits for that)
        self._on_ending = on_ending  # told once, with the outcome recorded, before watchers get `finished`

    @property
    def run_id(self) -> int:
        return self.fsm.run_id

    def report(self, event: F.Input) -> None:
        self.inputs.put_nowait(event)

    # ---- the loop ----

    async def drive(self) -> None:
        injector = asyncio.create_task(self._inject_loop())
        if self.drafts is not None:  # the draft model takes in the prompt while the stages do
            self._spawn(self.drafts.warm(self.fsm.request.prompt_ids))
        try:
            await self._step(F.Tick())  # let the FSM look at the view it already has
            while self.fsm.state is not F.RunState.DONE:
                deadline = self.fsm.deadline()
                timeout = None if deadline is None else max(0.0, deadline - self.clock())
                try:
                    event: F.Input = await asyncio.wait_for(self.inputs.get(), timeout)
                except TimeoutError:
                    event = F.Tick()
                await self._step(event)
        except Exception as e:  # a bug in the adapter must still end the run, visibly, and tear it down
            self.log.exception("run_driver_failed", error=str(e))
            if self.fsm.state is not F.RunState.DONE:
                await self._teardown_after_failure(e)
        finally:
            injector.cancel()
            for t in list(self._tasks):
                t.cancel()
            if self.drafts is not None:
                self.drafts.release()
            self._finalize()

    async def _step(self, event: F.Input) -> None:
        actions = self.fsm.handle(event, self.clock())
        emitted: list[pb.LifecycleEvent] = []
        for action in actions:
            self._perform(action, emitted)
        relayed = isinstance(event, F.Relay | F.RelayBatch)  # a relayed node event never changes the run record
        if not relayed:
            self._sync_record()
        try:
            if emitted:
                self.store.append(self.run_id, emitted)
            if not relayed:
                self.store.put(self.record)
        except StoreWriteError as e:
            self._store_failed(e)
        if self._on_planned is not None and self.fsm.plan is not None:
            on_planned, self._on_planned = self._on_planned, None
            on_planned(self.fsm.plan)

    def _perform(self, action: F.Action, emitted: list[pb.LifecycleEvent]) -> None:
        match action:
            case F.Emit(event=ev):
                if not ev.time_us:
                    ev.time_us = wall_us()
                emitted.append(ev)
                self.updates.append(opb.RunUpdate(event=ev))
                self._log_event(ev)
            case F.Deliver(sequence=seq, token_id=tid, end_of_generation=eog):
                text = "" if eog else self._decoder.push(tid)
                self.record.token_ids.append(tid)
                self.record.text += text
                self.updates.append(opb.RunUpdate(token=opb.TokenDelta(
                    sequence=seq, token_id=tid, text=text, end_of_generation=eog)))
            case F.OpenEndpoints(plan=plan):
                self._opening = self._spawn(self._open_endpoints(plan))
            case F.Provision(plan=plan, stage=stage):
                self._provisioning[stage.stage_index] = self._spawn(self._provision(plan, stage))
            case F.InjectTokens():
                self._injections.put_nowait(action)
            case F.DraftWanted(sequence=seq, up_to=k):
                self._spawn(self._draft(seq, (*self.fsm.request.prompt_ids, *self.fsm.tokens), k))
            case F.StopStage(stage=stage):
                self._spawn(self._stop_stage(stage))
            case F.CloseEndpoints():
                self._spawn(self._close_endpoints())

    def _log_event(self, ev: pb.LifecycleEvent) -> None:
        if ev.kind in UNJOURNALED_KINDS:  # ~25 per token: they stay in the run's events (GetEvents, WatchRun) only
            return
        fields: dict[str, object] = {"kind": pb.LifecycleEventKind.Name(ev.kind)}
        if ev.node_id:
            fields["node_id"] = ev.node_id
        if ev.HasField("stage_index"):
            fields["stage_index"] = ev.stage_index
        if ev.HasField("sequence"):
            fields["sequence"] = ev.sequence
        if ev.reason:
            fields["reason"] = ev.reason
            fields["component"] = pb.Component.Name(ev.component)
        if ev.detail:
            fields["detail"] = ev.detail
        self.log.info("lifecycle_event", **fields)

    def _sync_record(self) -> None:
        r, fsm = self.record, self.fsm
        r.state = fsm.state.value
        if fsm.outcome is not None and r.outcome == opb.RUN_OUTCOME_UNSPECIFIED:
            r.outcome = fsm.outcome.value
            r.reason = fsm.reason
            r.detail = fsm.detail
            r.outcome_us = wall_us()
            self.outcome_recorded.set()
        if fsm.plan is not None and not r.placement:
            for s in fsm.plan.stages:
                r.placement.add(stage_index=s.stage_index, node_id=s.node_id, layer_start=s.layer_start,
                                layer_end_exclusive=s.layer_end_exclusive, inbound_edge_id=s.inbound_edge,
                                outbound_edge_id=s.outbound_edge, device_index=s.device)
        if fsm.state is F.RunState.DONE and not r.torn_down_us:
            tail = self._decoder.flush()
            r.text += tail
            r.torn_down_us = wall_us()

    def _store_failed(self, e: StoreWriteError) -> None:
        """A run the store cannot record is faulted and torn down (once), not carried on unrecorded."""
        self.log.error("run_store_write_failed", error=str(e))
        if not self._store_fault_reported:
            self._store_fault_reported = True
            self.report(F.OrchestratorFault(pb.RUN_FAULT_STORE_WRITE_FAILED, f"the run store cannot be written: {e}"))

    def _finalize(self) -> None:
        if self.record.state != opb.RUN_STATE_DONE:
            self.record.state = opb.RUN_STATE_DONE
        if self._on_ending is not None:
            try:
                self._on_ending(self)  # may resume the request (record.resumed_by): watchers then follow that run
            except Exception as e:
                self.log.exception("run_resume_failed", error=f"{type(e).__name__}: {e}")
        try:
            self.store.put(self.record)
        except StoreWriteError as e:  # held by the store, which serves it to reads and retries the write
            self.log.error("run_store_write_failed", error=str(e), during="finalize")
        except Exception as e:  # the watchers still get the final record
            self.log.error("run_store_write_failed", error=f"{type(e).__name__}: {e}", during="finalize")
        final = opb.Run()
        final.CopyFrom(self.record)
        self.updates.append(opb.RunUpdate(finished=final))
        self.done.set()

    def watch(self) -> AsyncIterator[opb.RunUpdate]:
        """Every update from the start, then live ones, ending with the `finished` Run."""
        return self.updates.watch()

    # ---- fleet calls (each reports its outcome as an FSM input) ----

    def _spawn(self, coro) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _provision(self, plan, stage) -> None:
        try:
            await self.fleet.provision(plan, stage, self.report)
        except FleetError as e:
            self.report(F.ProvisionFailed(stage.stage_index, e.reason, e.detail))
        except Exception as e:
            self.report(F.ProvisionFailed(stage.stage_index, pb.RUN_FAULT_NODE_UNAVAILABLE, f"{type(e).__name__}: {e}"))

    async def _open_endpoints(self, plan) -> None:
        try:
            self._endpoints = await self.fleet.open_endpoints(plan, self.report)
            self._endpoints_ready.set()
        except FleetError as e:
            self.report(F.EndpointFault(e.reason, e.detail))
        except Exception as e:
            self.report(F.EndpointFault(pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, f"{type(e).__name__}: {e}"))

    async def _inject_loop(self) -> None:
        while True:
            action = await self._injections.get()
            await self._endpoints_ready.wait()
            assert self._endpoints is not None
            try:
                await self._endpoints.inject(action.sequence, action.token_ids, action.flags)
            except FleetError as e:
                self.report(F.EndpointFault(e.reason, e.detail))
            except Exception as e:
                self.report(F.EndpointFault(pb.RUN_FAULT_STREAM_FAULT, f"token injection failed: {type(e).__name__}: {e}"))

    async def _draft(self, seq: int, context: tuple[int, ...], k: int) -> None:
        assert self.drafts is not None
        self.report(F.Drafted(seq, await self.drafts.draft(context, k)))

    async def _stop_stage(self, stage) -> None:
        assert self.fsm.plan is not None
        provisioning = self._provisioning.get(stage.stage_index)
        if provisioning is not None:
            # StopRun must not overtake this stage's ProvisionStage (the node would ignore the
            # stop, then accept the run and keep it).
            await asyncio.wait([provisioning])
        try:
            await self.fleet.stop_stage(self.fsm.plan, stage)
        except Exception as e:  # the teardown timeout covers a stage that never confirms
            self.log.warning("stop_run_failed", node_id=stage.node_id, stage_index=stage.stage_index, error=str(e))

    async def _close_endpoints(self) -> None:
        if self._opening is not None:
            await asyncio.wait([self._opening])  # never close endpoints that are still being opened
        left = ""
        try:
            if self._endpoints is not None:
                await self._endpoints.close()
        except Exception as e:  # e.g. FleetError(RUN_FAULT_TEARDOWN_TIMEOUT) naming the edges left
            left = e.detail if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            self.log.warning("token_endpoints_close_failed", error=left)
        finally:
            self.report(F.EndpointsClosed(left))

    # ---- a driver that raised (the FSM can no longer be trusted): FailureTeardown tears the run down ----

    async def _teardown_after_failure(self, error: Exception) -> None:
        """Record ORCHESTRATOR_INTERNAL (unless an outcome was recorded) and let FailureTeardown stop every stage
        whose provisioning was sent and close the token endpoints, waiting at most the teardown timeout."""
        r, plan = self.record, self.fsm.plan
        r.state = opb.RUN_STATE_DONE
        fault = None
        if r.outcome == opb.RUN_OUTCOME_UNSPECIFIED:
            r.outcome, r.outcome_us = opb.RUN_OUTCOME_FAULTED, wall_us()
            r.reason = pb.RunFaultReason.Name(pb.RUN_FAULT_ORCHESTRATOR_INTERNAL)
            r.detail = f"orchestrator run driver failed: {type(error).__name__}: {error}"
            fault = pb.LifecycleEvent(kind=pb.RUN_FAULTED, reason=r.reason, detail=r.detail, component=pb.COMPONENT_ORCHESTRATOR)
        provisioned = [plan.stages[i] for i in self._provisioning] if plan is not None else []
        core, actions = FailureTeardown.begin(provisioned, self._opening is not None, self.clock(),
                                              self.fsm.config.timeouts.teardown_s, fault)
        self._perform_teardown(actions)
        while (deadline := core.deadline()) is not None:
            try:
                event: F.Input = await asyncio.wait_for(self.inputs.get(), max(0.0, deadline - self.clock()))
            except TimeoutError:
                event = F.Tick()
            self._perform_teardown(core.handle(event, self.clock()))
        r.torn_down_us = wall_us()

    def _perform_teardown(self, actions: list[F.Action]) -> None:
        for action in actions:
            match action:
                case F.Emit(event=ev):
                    self._emit_quietly(ev)
                case F.StopStage(stage=stage):
                    self._spawn(self._stop_stage(stage))
                case F.CloseEndpoints():
                    self._spawn(self._close_endpoints())

    def emit_after_outcome(self, ev: pb.LifecycleEvent) -> None:
        """An event about the finished run from above it (RUN_RESUMED): stored, published and logged."""
        self._emit_quietly(ev)

    def _emit_quietly(self, ev: pb.LifecycleEvent) -> None:
        """An event of the failure teardown; the store may be what failed, so it cannot stop the teardown."""
        ev.run_id, ev.time_us = self.run_id, wall_us()
        self.updates.append(opb.RunUpdate(event=ev))
        self._log_event(ev)
        try:
            self.store.append(self.run_id, [ev])
        except Exception as e:
            self.log.error("run_store_write_failed", detail=f"{type(e).__name__}: {e}")


async def replay(store: RunStore, run: opb.Run, tokenizer: Tokenizer | None = None) -> AsyncIterator[opb.RunUpdate]:
    """WatchRun for a run this process no longer holds: stored events (a page at a time), each
    TOKEN_RECEIVED followed by its token delta as it was streamed (text when the model's tokenizer is
    at hand), then the record."""
    decoder = StreamDecoder(tokenizer) if tokenizer is not None else None
    for ev in store.iter_events(run.run_id):
        yield opb.RunUpdate(event=ev)
        if ev.kind == pb.TOKEN_RECEIVED:
            tid = ev.counters["token_id"]
            eog = tokenizer is not None and tid in tokenizer.eog_ids
            text = "" if eog or decoder is None else decoder.push(tid)
            yield opb.RunUpdate(token=opb.TokenDelta(sequence=ev.sequence, token_id=tid, text=text,
                                                     end_of_generation=eog))
    yield opb.RunUpdate(finished=run)
