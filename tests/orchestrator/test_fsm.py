"""Run FSM core (spec §13): scripted inputs, a fake clock, assertions on actions and events."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from swactor.common.objflags import PROMPT_CONTINUES
from swactor.common.sampling import SamplingPolicy
from swactor.modelfile.memory import MemoryProfile
from swactor.orchestrator.fleet.nodes import NodeState
from swactor.orchestrator.planning.pool import PoolGate
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb

from .helpers import model_facts, node, pool

K = pb.LifecycleEventKind
EOS = 2


def make(stages: int = 2, max_tokens: int = 4, prompt: tuple[int, ...] = (1, 9690, 198), window: float = 1.0,
         timeouts: F.Timeouts | None = None, node_ids: tuple[int, ...] = (), ignore_eos: bool = False,
         prefill_chunk: int = 0, speculate: int = 0, draft_model: bool = False) -> F.RunFsm:
    counter = itertools.count(1000)
    req = F.RunRequest(run_id=77, model=model_facts(), prompt_ids=prompt, stages=stages, max_tokens=max_tokens,
                       sampling=SamplingPolicy(), eog_ids=frozenset({EOS}), node_ids=node_ids, ignore_eos=ignore_eos,
                       speculate=speculate, draft_model=draft_model)
    cfg = F.FsmConfig(orchestrator_node_id=5, timeouts=timeouts or F.Timeouts(), pool_window_s=window,
                      prefill_chunk=prefill_chunk)
    return F.RunFsm(req, cfg, now=0.0, id_source=lambda: next(counter))


def kinds(actions: list[F.Action]) -> list[str]:
    return [K.Name(a.event.kind) for a in actions if isinstance(a, F.Emit)]


def of(actions: list[F.Action], cls: type) -> list:
    return [a for a in actions if isinstance(a, cls)]


def to_ready(fsm: F.RunFsm, nodes: tuple = (1, 2)) -> list[F.Action]:
    """Drive the FSM from WAITING_POOL to RUNNING; returns the barrier step's actions."""
    fsm.handle(F.MembershipChanged(pool(*nodes)), 0.0)
    acts = fsm.handle(F.Tick(), fsm.deadline())
    assert fsm.state is F.RunState.WAITING_READY
    out: list[F.Action] = list(acts)
    for s in fsm.plan.stages:
        out += fsm.handle(F.StageReady(s.stage_index), 2.0)
    out += fsm.handle(F.EndpointsReady(), 2.0)
    assert fsm.state is F.RunState.RUNNING
    return out


def teardown(fsm: F.RunFsm, now: float = 50.0) -> list[F.Action]:
    out: list[F.Action] = fsm.handle(F.EndpointsClosed(), now)
    for s in fsm.plan.stages:
        out += fsm.handle(F.StageStopped(s.stage_index), now)
    return out


def test_happy_path_prefill_decode_eos_and_teardown() -> None:
    fsm = make(stages=2, max_tokens=10)
    waiting = fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    assert kinds(waiting) == ["POOL_WAITING"] and "node(s) 1, 2 to stay unchanged for 1.0s" in waiting[0].event.detail
    assert fsm.deadline() == 1.0  # the stability window
    acts = fsm.handle(F.Tick(), 1.0)
    assert kinds(acts) == ["POOL_READY", "RUN_PLANNED", "STAGE_PROVISION_STARTED", "STAGE_PROVISION_STARTED"]
    provs = of(acts, F.Provision)
    assert [p.stage.node_id for p in provs] == [1, 2]
    assert [(p.stage.layer_start, p.stage.layer_end_exclusive) for p in provs] == [(0, 15), (15, 30)]
    assert len(of(acts, F.OpenEndpoints)) == 1
    assert fsm.state is F.RunState.WAITING_READY
    assert [t for t in fsm.transitions] == [(F.RunState.WAITING_POOL, F.RunState.PROVISIONING),
                                            (F.RunState.PROVISIONING, F.RunState.WAITING_READY)]
    assert kinds(fsm.handle(F.StageReady(0), 2.0)) == ["STAGE_READY"]
    assert fsm.handle(F.TokenReceived(0, 5), 2.0) == []  # no token work before the barrier
    assert kinds(fsm.handle(F.StageReady(1), 2.0)) == ["STAGE_READY"]
    assert fsm.state is F.RunState.WAITING_READY  # endpoints not ready yet
    acts = fsm.handle(F.EndpointsReady(), 3.0)
    assert kinds(acts) == ["READINESS_BARRIER_PASSED", "PROMPT_INJECTED"]
    assert of(acts, F.InjectTokens) == [F.InjectTokens(0, (1, 9690, 198))]
    acts = fsm.handle(F.TokenReceived(0, 42), 4.0)
    assert of(acts, F.InjectTokens) == [F.InjectTokens(1, (42,))]
    assert of(acts, F.Deliver) == [F.Deliver(0, 42, False)]
    acts = fsm.handle(F.TokenReceived(1, 43), 5.0)
    assert of(acts, F.InjectTokens) == [F.InjectTokens(2, (43,))]
    acts = fsm.handle(F.TokenReceived(2, EOS), 6.0)
    assert of(acts, F.InjectTokens) == []
    assert kinds(acts) == ["TOKEN_RECEIVED", "RUN_COMPLETED", "STOP_RUN_SENT", "STOP_RUN_SENT"]
    assert len(of(acts, F.StopStage)) == 2 and len(of(acts, F.CloseEndpoints)) == 1
    assert (fsm.outcome, fsm.reason, fsm.tokens) == (F.Outcome.COMPLETED, "eos", [42, 43, EOS])
    assert fsm.state is F.RunState.TEARING_DOWN
    assert fsm.handle(F.TokenReceived(3, 9), 6.5) == []  # no new run work after the outcome
    assert kinds(fsm.handle(F.StageStopped(0), 7.0)) == ["STAGE_STOPPED"]
    assert kinds(fsm.handle(F.StageStopped(1), 7.0)) == ["STAGE_STOPPED"]
    assert fsm.state is F.RunState.TEARING_DOWN  # the token endpoints are still closing
    acts = fsm.handle(F.EndpointsClosed(), 7.5)
    assert kinds(acts) == ["RUN_TORN_DOWN"]
    assert fsm.state is F.RunState.DONE and fsm.deadline() is None
    assert fsm.handle(F.OperatorStop(), 8.0) == []


def test_max_tokens_completes_without_injecting_more() -> None:
    fsm = make(stages=1, max_tokens=2)
    to_ready(fsm, (1,))
    fsm.handle(F.TokenReceived(0, 10), 4.0)
    acts = fsm.handle(F.TokenReceived(1, 11), 5.0)
    assert of(acts, F.InjectTokens) == []
    assert (fsm.outcome, fsm.reason) == (F.Outcome.COMPLETED, "max_tokens")
    assert kinds(teardown(fsm))[-1] == "RUN_TORN_DOWN"


def test_fault_during_waiting_ready_records_first_reason_only() -> None:
    fsm = make()
    to_ready_acts = fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0) + fsm.handle(F.Tick(), 1.0)
    assert fsm.state is F.RunState.WAITING_READY and to_ready_acts
    acts = fsm.handle(F.StageFault(1, pb.RUN_FAULT_WEIGHTS_LOAD_FAILED, pb.COMPONENT_STAGE_CONTROLLER, "bad shard"), 2.0)
    assert kinds(acts) == ["STAGE_FAULTED", "RUN_FAULTED", "STOP_RUN_SENT", "STOP_RUN_SENT"]
    faulted = next(a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_FAULTED)
    assert faulted.reason == "RUN_FAULT_WEIGHTS_LOAD_FAILED"
    assert faulted.component == pb.COMPONENT_STAGE_CONTROLLER and faulted.stage_index == 1
    assert of(acts, F.InjectTokens) == []
    # a second fault while tearing down is recorded but does not change the outcome
    acts = fsm.handle(F.StageFault(0, pb.RUN_FAULT_RING_FAULT, pb.COMPONENT_WORKER, ""), 3.0)
    assert kinds(acts) == ["STAGE_FAULTED"]
    assert (fsm.outcome, fsm.reason) == (F.Outcome.FAULTED, "RUN_FAULT_WEIGHTS_LOAD_FAILED")
    assert kinds(teardown(fsm))[-1] == "RUN_TORN_DOWN"


def test_fault_while_running_stops_decode() -> None:
    fsm = make(max_tokens=10)
    to_ready(fsm)
    fsm.handle(F.TokenReceived(0, 42), 4.0)
    acts = fsm.handle(F.StageFault(0, pb.RUN_FAULT_STREAM_FAULT, pb.COMPONENT_EDGE_DRIVER, "reset"), 5.0)
    assert "RUN_FAULTED" in kinds(acts) and of(acts, F.InjectTokens) == []
    assert fsm.handle(F.TokenReceived(1, 43), 5.5) == []
    assert fsm.reason == "RUN_FAULT_STREAM_FAULT"


def echo(stage: int, now_detail: str = "peer stopped the stream (code 0x1)") -> F.StageFault:
    return F.StageFault(stage, pb.RUN_FAULT_STREAM_FAULT, pb.COMPONENT_EDGE_DRIVER,
                        f"STREAM_FAULT_PEER_STOPPED: {now_detail}", "STREAM_FAULT_PEER_STOPPED")


def test_a_peer_s_echo_waits_for_the_cause_that_stage_reports() -> None:
    """Stage 1's arena died: its stage reports the cause, and its peer (stage 0) reports the echo of its stop. The
    echo reached the orchestrator first: the outcome is still the cause, and the echo is on record as an event."""
    fsm = make(max_tokens=10)
    to_ready(fsm)
    fsm.handle(F.TokenReceived(0, 42), 4.0)
    acts = fsm.handle(echo(0), 5.0)
    assert kinds(acts) == ["STAGE_FAULTED"] and fsm.state is F.RunState.RUNNING and fsm.outcome is None
    assert fsm.deadline() == pytest.approx(5.0 + F.ECHO_GRACE_S)
    assert fsm.handle(echo(1), 5.1) and fsm.outcome is None  # another echo: still none
    acts = fsm.handle(F.StageFault(1, pb.RUN_FAULT_NODE_UNAVAILABLE, pb.COMPONENT_ARENA,
                                   "ArenaManager.Gone: hand-out ended", "ArenaManager.Gone"), 5.2)
    assert kinds(acts)[:2] == ["STAGE_FAULTED", "RUN_FAULTED"] and fsm.state is F.RunState.TEARING_DOWN
    assert fsm.reason == "RUN_FAULT_NODE_UNAVAILABLE" and fsm.detail.startswith("stage 1: ArenaManager.Gone")
    assert fsm.handle(F.Tick(), 6.5) == []  # the echo's time is past: nothing more


def test_an_echo_with_no_cause_becomes_the_outcome_after_the_grace() -> None:
    """The peer stage died with its node: no cause comes, so the echo is what the run ends with."""
    fsm = make(max_tokens=10)
    to_ready(fsm)
    fsm.handle(echo(0), 5.0)
    assert fsm.handle(F.Tick(), 5.0 + F.ECHO_GRACE_S / 2) == [] and fsm.outcome is None
    acts = fsm.handle(F.Tick(), fsm.deadline())
    assert "RUN_FAULTED" in kinds(acts) and fsm.reason == "RUN_FAULT_STREAM_FAULT"
    assert fsm.detail == "stage 0: STREAM_FAULT_PEER_STOPPED: peer stopped the stream (code 0x1)"
    assert kinds(acts).count("STAGE_FAULTED") == 0  # recorded when it came


def test_an_echo_does_not_hold_back_the_step_timeout_or_an_operator_stop() -> None:
    fsm = make(max_tokens=10, timeouts=F.Timeouts(step_s=0.5))
    to_ready(fsm)
    fsm.handle(F.TokenReceived(0, 42), 4.0)
    fsm.handle(echo(0), 4.1)
    assert fsm.deadline() == pytest.approx(4.5)  # the step timeout comes first
    fsm.handle(F.Tick(), 4.5)
    assert fsm.reason == "RUN_FAULT_STEP_TIMEOUT"
    stopped = make(max_tokens=10)
    to_ready(stopped)
    stopped.handle(echo(0), 4.0)
    stopped.handle(F.OperatorStop("enough"), 4.2)
    assert stopped.outcome is F.Outcome.STOPPED


def test_operator_stop_mid_decode() -> None:
    fsm = make(max_tokens=10)
    to_ready(fsm)
    fsm.handle(F.TokenReceived(0, 42), 4.0)
    acts = fsm.handle(F.OperatorStop("enough"), 4.5)
    assert kinds(acts) == ["RUN_STOPPED", "STOP_RUN_SENT", "STOP_RUN_SENT"]
    assert (fsm.outcome, fsm.detail) == (F.Outcome.STOPPED, "enough")
    assert fsm.handle(F.TokenReceived(1, 43), 5.0) == []
    assert fsm.handle(F.OperatorStop("again"), 5.0) == []
    assert kinds(teardown(fsm)) == ["STAGE_STOPPED", "STAGE_STOPPED", "RUN_TORN_DOWN"]
    assert fsm.outcome is F.Outcome.STOPPED


def test_sequence_violation_faults() -> None:
    fsm = make()
    to_ready(fsm)
    acts = fsm.handle(F.TokenReceived(1, 42), 4.0)
    assert fsm.reason == "RUN_FAULT_SEQUENCE_VIOLATION" and "RUN_FAULTED" in kinds(acts)


def test_prompt_in_chunks_then_decode_continues_the_sequences() -> None:
    """prefill_chunk 2, a 5-token prompt: chunk objects 0..2 at once (0, 1 flagged PROMPT_CONTINUES), no token for
    0 and 1, the first token with sequence 2, decode from sequence 3 (docs/orchestrator.md "Prefill chunks")."""
    fsm = make(stages=2, max_tokens=3, prompt=(1, 2, 3, 4, 5), prefill_chunk=2)
    acts = to_ready(fsm)
    assert fsm.plan.prefill_chunk == 2
    assert of(acts, F.InjectTokens) == [F.InjectTokens(0, (1, 2), PROMPT_CONTINUES), F.InjectTokens(1, (3, 4), PROMPT_CONTINUES),
                                        F.InjectTokens(2, (5,))]
    assert fsm.handle(F.PromptChunkDone(0), 3.0) == [] and fsm.handle(F.PromptChunkDone(1), 3.1) == []
    acts = fsm.handle(F.TokenReceived(2, 42), 3.2)
    assert of(acts, F.InjectTokens) == [F.InjectTokens(3, (42,))] and of(acts, F.Deliver) == [F.Deliver(0, 42, False)]
    acts = fsm.handle(F.TokenReceived(3, 43), 3.3)
    assert of(acts, F.InjectTokens) == [F.InjectTokens(4, (43,))]


def test_the_configured_kv_dtype_is_what_placement_counts_and_the_plan_carries() -> None:
    profile = MemoryProfile(layer_weights=(2658816,) * 30, embedding=30081024, head=31852800, kv_width=384, hidden=576,
                            q_width=576, ffn=1536, n_heads=9, rope_dim=64, vocab=49152)  # SmolLM2-135M Q4_1
    kv = {}
    for kv_dtype in ("float32", "float16"):
        counter = itertools.count(1000)
        req = F.RunRequest(run_id=77, model=dataclasses.replace(model_facts(), memory=profile), prompt_ids=(1, 2),
                           stages=2, max_tokens=2, sampling=SamplingPolicy(), eog_ids=frozenset({EOS}))
        fsm = F.RunFsm(req, F.FsmConfig(orchestrator_node_id=5, pool_window_s=1.0, kv_dtype=kv_dtype), now=0.0,
                       id_source=lambda c=counter: next(c))
        fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
        provs = of(fsm.handle(F.Tick(), 1.0), F.Provision)
        assert fsm.plan is not None and fsm.plan.kv_dtype == kv_dtype
        kv[kv_dtype] = [p.stage.memory.kv_cache for p in provs]
    assert [2 * b for b in kv["float16"]] == kv["float32"] == [15 * 4160 * 384 * 4] * 2


@pytest.mark.parametrize("bad", [F.TokenReceived(0, 42), F.PromptChunkDone(1), F.PromptChunkDone(2)])
def test_prompt_chunks_out_of_order_or_a_token_too_early_fault(bad: F.Input) -> None:
    fsm = make(stages=2, prompt=(1, 2, 3, 4, 5), prefill_chunk=2)
    to_ready(fsm)
    acts = fsm.handle(bad, 3.0)
    assert fsm.reason == "RUN_FAULT_SEQUENCE_VIOLATION" and "RUN_FAULTED" in kinds(acts)


@pytest.mark.parametrize(("phase", "reason"), [("ready", "RUN_FAULT_READINESS_TIMEOUT"), ("prefill", "RUN_FAULT_STEP_TIMEOUT"),
                                               ("decode", "RUN_FAULT_STEP_TIMEOUT")])
def test_timeouts_fault_the_run(phase: str, reason: str) -> None:
    t = F.Timeouts(pool_s=5, readiness_s=10, first_token_s=20, step_s=3, teardown_s=4)
    fsm = make(timeouts=t, max_tokens=10)
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    fsm.handle(F.Tick(), 1.0)
    if phase == "ready":
        fsm.handle(F.StageReady(0), 2.0)
        assert fsm.deadline() == 11.0
        assert fsm.handle(F.Tick(), 10.9) == []
        acts = fsm.handle(F.Tick(), 11.0)
        assert "stage(s) [1]" in fsm.detail
    else:
        for i in (0, 1):
            fsm.handle(F.StageReady(i), 2.0)
        fsm.handle(F.EndpointsReady(), 2.0)
        if phase == "decode":
            fsm.handle(F.TokenReceived(0, 42), 3.0)
        assert fsm.handle(F.Tick(), fsm.deadline() - 0.01) == []
        acts = fsm.handle(F.Tick(), fsm.deadline())
    assert fsm.reason == reason and "RUN_FAULTED" in kinds(acts)
    # teardown times out when a stage never confirms: the outcome stays the first fault
    fsm.handle(F.EndpointsClosed(), 30.0)
    fsm.handle(F.StageStopped(0), 30.0)
    acts = fsm.handle(F.Tick(), fsm.deadline())
    torn = next(a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_TORN_DOWN)
    assert torn.reason == "RUN_FAULT_TEARDOWN_TIMEOUT" and torn.counters["stages_unconfirmed"] == 1
    assert fsm.state is F.RunState.DONE and fsm.reason == reason


def test_node_lost_before_pool_ready_waits_then_refuses_with_reason() -> None:
    fsm = make(stages=2, timeouts=F.Timeouts(pool_s=10))
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    acts = fsm.handle(F.MembershipChanged(pool(1)), 0.5)  # node 2 gone before the window closed
    assert kinds(acts) == ["POOL_WAITING"] and "2 stage(s) need 2 stage device(s), the pool has 1 on 1 Available node(s)" in acts[0].event.detail
    assert fsm.handle(F.Tick(), 1.0) == [] and fsm.state is F.RunState.WAITING_POOL  # said once, not per tick
    assert fsm.deadline() == 10.0  # nothing to place: no stability timer, only the pool timeout
    acts = fsm.handle(F.Tick(), 10.0)
    assert kinds(acts) == ["RUN_FAULTED", "RUN_TORN_DOWN"]
    assert fsm.reason == "RUN_FAULT_NODE_UNAVAILABLE" and "2 stage(s) need 2 stage device(s), the pool has 1 on 1 Available node(s)" in fsm.detail
    assert fsm.state is F.RunState.DONE and of(acts, F.Provision) == [] and of(acts, F.StopStage) == []


def test_node_returning_before_deadline_lets_the_run_start() -> None:
    fsm = make(stages=2, timeouts=F.Timeouts(pool_s=10))
    fsm.handle(F.MembershipChanged((node(1), node(2, NodeState.BOOTING))), 0.0)
    assert fsm.handle(F.Tick(), 1.0) == []
    fsm.handle(F.MembershipChanged(pool(1, 2)), 3.0)
    assert fsm.handle(F.Tick(), 3.5) == []  # window restarted at 3.0
    acts = fsm.handle(F.Tick(), 4.0)
    assert "POOL_READY" in kinds(acts) and fsm.state is F.RunState.WAITING_READY


def test_faulted_member_is_outside_the_candidate_pool() -> None:
    fsm = make(stages=2)
    fsm.handle(F.MembershipChanged((node(1), node(2), node(3, NodeState.FAULTED))), 0.0)
    fsm.handle(F.Tick(), 1.0)
    assert [s.node_id for s in fsm.plan.stages] == [1, 2]


def test_membership_loss_after_provisioning_faults_and_teardown_skips_lost_node() -> None:
    fsm = make(stages=2)
    to_ready(fsm)
    acts = fsm.handle(F.MembershipChanged(pool(1)), 4.0)
    faulted = next(a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_FAULTED)
    assert faulted.reason == "RUN_FAULT_MEMBERSHIP_LOST" and faulted.node_id == 2
    assert faulted.component == pb.COMPONENT_MEMBERSHIP
    assert "STAGE_STOPPED" in kinds(acts)  # node 2 can no longer confirm: not waited for
    assert kinds(fsm.handle(F.MembershipChanged(pool(1)), 4.1)) == []
    fsm.handle(F.EndpointsClosed(), 4.15)
    acts = fsm.handle(F.StageStopped(0), 4.2)
    assert kinds(acts) == ["STAGE_STOPPED", "RUN_TORN_DOWN"]


def test_a_node_s_own_word_that_it_faulted_waits_for_its_stage_s_cause() -> None:
    """A node that says Faulted is alive and its stage reports why; that report, not the gossip, is the outcome when
    it comes within ECHO_GRACE_S (the two race: the gossip won once on a busy box). A node back before the grace ends
    faults nothing."""
    said = (node(1), node(2, NodeState.FAULTED))
    fsm = make(stages=2)
    to_ready(fsm)
    assert fsm.handle(F.MembershipChanged(said), 4.0) == [] and fsm.outcome is None
    acts = fsm.handle(F.StageFault(1, pb.RUN_FAULT_WORKER_CRASHED, pb.COMPONENT_WORKER_CTL, "compute process died"), 4.3)
    faulted = [a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_FAULTED]
    assert [(e.reason, e.component) for e in faulted] == [("RUN_FAULT_WORKER_CRASHED", pb.COMPONENT_WORKER_CTL)]
    assert not [a for a in fsm.handle(F.Tick(), 5.5) if isinstance(a, F.Emit) and a.event.kind == K.RUN_FAULTED]

    fsm = make(stages=2)
    to_ready(fsm)
    fsm.handle(F.MembershipChanged(said), 4.0)
    fsm.handle(F.MembershipChanged(pool(1, 2)), 4.5)  # Available again
    assert fsm.handle(F.Tick(), 5.5) == [] and fsm.outcome is None and fsm.deadline() != 5.0

    fsm = make(stages=2)  # a peer's echo held, then the node's word: neither stage said why, the word is the cause
    to_ready(fsm)
    fsm.handle(F.StageFault(0, pb.RUN_FAULT_STREAM_FAULT, pb.COMPONENT_EDGE_DRIVER, "peer stopped", cause=F.ECHO_CAUSE),
               4.0)
    fsm.handle(F.MembershipChanged(said), 4.2)
    assert fsm.deadline() == 4.0 + F.ECHO_GRACE_S
    fsm.handle(F.Tick(), 4.0 + F.ECHO_GRACE_S)
    assert (fsm.outcome, fsm.reason) == (F.Outcome.FAULTED, "RUN_FAULT_MEMBERSHIP_LOST")


def test_provision_failure_is_not_awaited_in_teardown() -> None:
    fsm = make(stages=2)
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    fsm.handle(F.Tick(), 1.0)
    acts = fsm.handle(F.ProvisionFailed(1, pb.RUN_FAULT_PROVISIONING_REJECTED, "unknown run"), 1.5)
    assert fsm.reason == "RUN_FAULT_PROVISIONING_REJECTED"
    assert [a.stage.stage_index for a in of(acts, F.StopStage)] == [0]
    fsm.handle(F.EndpointsClosed(), 1.9)
    assert kinds(fsm.handle(F.StageStopped(0), 2.0)) == ["STAGE_STOPPED", "RUN_TORN_DOWN"]


def test_planning_refusal_faults_before_provisioning() -> None:
    fsm = make(stages=2, prompt=tuple(range(5000)))
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    acts = fsm.handle(F.Tick(), 1.0)
    assert kinds(acts) == ["POOL_READY", "RUN_FAULTED", "RUN_TORN_DOWN"]
    assert "context holds 4096" in fsm.detail and of(acts, F.Provision) == []


def test_a_pinned_node_is_waited_for_and_the_others_do_not_matter() -> None:
    fsm = make(stages=2, node_ids=(3, 1), timeouts=F.Timeouts(pool_s=10))
    acts = fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    assert [a.event.detail for a in of(acts, F.Emit)] == ["waiting for pinned node 3 to join the pool"]
    acts = fsm.handle(F.MembershipChanged((*pool(1, 2), node(3, NodeState.BOOTING))), 1.0)
    assert [a.event.detail for a in of(acts, F.Emit)] == ["waiting for pinned node 3 to be Available (it is booting)"]
    # node 2 (not pinned) turning suspect neither holds the run nor restarts its window
    fsm.handle(F.MembershipChanged((node(1), node(2, NodeState.SUSPECT), node(3))), 2.0)
    assert fsm.deadline() == 3.0
    acts = fsm.handle(F.MembershipChanged((node(1), node(2, NodeState.BOOTING), node(3))), 2.5)
    assert kinds(acts) == [] and fsm.deadline() == 3.0
    acts = fsm.handle(F.Tick(), 3.0)
    assert "POOL_READY" in kinds(acts) and [s.node_id for s in fsm.plan.stages] == [3, 1]


def test_a_pinned_node_that_never_comes_faults_the_run_naming_it() -> None:
    fsm = make(stages=2, node_ids=(1, 9), timeouts=F.Timeouts(pool_s=5))
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    acts = fsm.handle(F.Tick(), 5.0)
    assert kinds(acts) == ["RUN_FAULTED", "RUN_TORN_DOWN"] and fsm.reason == "RUN_FAULT_NODE_UNAVAILABLE"
    assert "pinned node 9 is not a member" in fsm.detail and of(acts, F.Provision) == []


def test_operator_stop_while_waiting_for_pool_ends_without_teardown_work() -> None:
    fsm = make()
    acts = fsm.handle(F.OperatorStop("nope"), 0.1)
    assert kinds(acts) == ["RUN_STOPPED", "RUN_TORN_DOWN"] and fsm.state is F.RunState.DONE


def test_relayed_node_events_are_stamped_with_the_run() -> None:
    fsm = make()
    acts = fsm.handle(F.Relay(pb.LifecycleEvent(kind=K.WEIGHTS_LOADED, node_id=1, stage_index=0)), 0.0)
    assert acts[0].event.run_id == 77 and kinds(acts) == ["WEIGHTS_LOADED"]


def test_ignore_eos_decodes_through_eos_until_max_tokens() -> None:
    fsm = make(stages=1, max_tokens=4, prompt=(EOS, 9690), ignore_eos=True)
    acts = to_ready(fsm, (1,))
    assert of(acts, F.InjectTokens) == [F.InjectTokens(0, (EOS, 9690))]
    fsm.handle(F.TokenReceived(0, 10), 4.0)
    acts = fsm.handle(F.TokenReceived(1, EOS), 5.0)
    assert fsm.state is F.RunState.RUNNING and fsm.outcome is None
    assert of(acts, F.Deliver) == [F.Deliver(1, EOS, True)]  # still marked end-of-generation for the client
    assert of(acts, F.InjectTokens) == [F.InjectTokens(2, (EOS,))]
    acts = fsm.handle(F.TokenReceived(2, EOS), 6.0)
    assert of(acts, F.InjectTokens) == [F.InjectTokens(3, (EOS,))]
    acts = fsm.handle(F.TokenReceived(3, 11), 7.0)
    assert of(acts, F.InjectTokens) == []
    assert (fsm.outcome, fsm.reason, fsm.tokens) == (F.Outcome.COMPLETED, "max_tokens", [10, EOS, EOS, 11])
    assert kinds(teardown(fsm))[-1] == "RUN_TORN_DOWN"


def test_ignore_eos_still_stops_at_a_full_context() -> None:
    fsm = make(stages=1, max_tokens=100000, prompt=tuple(range(4094)), ignore_eos=True)
    to_ready(fsm, (1,))
    fsm.handle(F.TokenReceived(0, EOS), 4.0)
    assert fsm.state is F.RunState.RUNNING
    fsm.handle(F.TokenReceived(1, EOS), 4.0)
    assert (fsm.outcome, fsm.reason) == (F.Outcome.COMPLETED, "context_full")


def test_context_full_completes() -> None:
    fsm = make(stages=1, max_tokens=100000, prompt=tuple(range(4094)))
    to_ready(fsm, (1,))
    fsm.handle(F.TokenReceived(0, 10), 4.0)
    fsm.handle(F.TokenReceived(1, 11), 4.0)
    assert (fsm.outcome, fsm.reason) == (F.Outcome.COMPLETED, "context_full")


def test_provision_refused_after_teardown_began_is_not_awaited() -> None:
    fsm = make(stages=2)
    fsm.handle(F.MembershipChanged(pool(1, 2)), 0.0)
    fsm.handle(F.Tick(), 1.0)
    acts = fsm.handle(F.EndpointFault(pb.RUN_FAULT_EDGE_ESTABLISHMENT_FAILED, "no ring"), 1.1)
    assert len(of(acts, F.StopStage)) == 2
    acts = fsm.handle(F.ProvisionFailed(1, pb.RUN_FAULT_PROVISIONING_REJECTED, "busy"), 1.2)
    assert kinds(acts) == ["STAGE_FAULTED"]
    assert fsm.reason == "RUN_FAULT_EDGE_ESTABLISHMENT_FAILED"  # the first fault stays the reason
    fsm.handle(F.EndpointsClosed(), 1.25)
    assert kinds(fsm.handle(F.StageStopped(0), 1.3)) == ["STAGE_STOPPED", "RUN_TORN_DOWN"]


def test_endpoints_that_never_close_time_out_teardown_by_name() -> None:
    fsm = make(stages=1, timeouts=F.Timeouts(teardown_s=4))
    to_ready(fsm, (1,))
    fsm.handle(F.OperatorStop(), 5.0)
    assert kinds(fsm.handle(F.StageStopped(0), 5.5)) == ["STAGE_STOPPED"]
    acts = fsm.handle(F.Tick(), fsm.deadline())
    torn = next(a.event for a in acts if isinstance(a, F.Emit) and a.event.kind == K.RUN_TORN_DOWN)
    assert torn.reason == "RUN_FAULT_TEARDOWN_TIMEOUT" and torn.detail == "token endpoints not closed within 4s"


def test_a_pool_the_orchestrator_has_seen_stable_is_ready_at_once() -> None:
    """The window is about the pool, not the run: a run submitted into a view stable for the window plans at once."""
    counter = itertools.count(1000)
    req = F.RunRequest(run_id=78, model=model_facts(), prompt_ids=(1, 2), stages=2, max_tokens=2,
                       sampling=SamplingPolicy(), eog_ids=frozenset({EOS}))
    cfg = F.FsmConfig(orchestrator_node_id=5, timeouts=F.Timeouts(), pool_window_s=1.0)
    seen = PoolGate(1.0)
    seen.observe(pool(1, 2), 0.0)
    fsm = F.RunFsm(req, cfg, now=5.0, id_source=lambda: next(counter), pool_view=seen)
    assert kinds(fsm.handle(F.MembershipChanged(pool(1, 2)), 5.0))[:2] == ["POOL_READY", "RUN_PLANNED"]
    # a member joining outside the placement changes nothing; one of the chosen nodes changing waits out the window
    fsm = F.RunFsm(req, cfg, now=5.0, id_source=lambda: next(counter), pool_view=seen)
    assert kinds(fsm.handle(F.MembershipChanged(pool(1, 2, 3)), 5.0))[:2] == ["POOL_READY", "RUN_PLANNED"]
    fsm = F.RunFsm(req, cfg, now=5.0, id_source=lambda: next(counter), pool_view=seen)
    moved = (node(1), dataclasses.replace(node(2), edge_endpoint="10.0.0.9:7000"))
    assert kinds(fsm.handle(F.MembershipChanged(moved), 5.0)) == ["POOL_WAITING"] and fsm.deadline() == 6.0
    assert seen.check(5.0, 2).ready  # the orchestrator's own gate is untouched
