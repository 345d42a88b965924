"""Run FSM invariants under random input sequences (hypothesis): one outcome, no run work after it,
strictly consecutive injections, teardown only of provisioned stages, and DONE always reachable."""

from __future__ import annotations

import itertools

from hypothesis import event, given, settings
from hypothesis import strategies as st

from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.fleet.nodes import NodeState
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb

from .helpers import model_facts, node, pool

K = pb.LifecycleEventKind
TERMINAL = {K.RUN_COMPLETED, K.RUN_FAULTED, K.RUN_STOPPED}

NEXT = "next-token"  # replaced by TokenReceived(next expected sequence, token)
likely = st.one_of(
    st.builds(F.StageReady, st.integers(0, 2)),
    st.just(F.EndpointsReady()),
    st.tuples(st.just(NEXT), st.sampled_from([7, 8, 8, 8, 2])),
)
rare = st.one_of(
    st.builds(lambda ids: F.MembershipChanged(pool(*ids)), st.sets(st.integers(1, 3), max_size=3).map(sorted)),
    st.builds(lambda: F.MembershipChanged((node(1), node(2, NodeState.BOOTING), node(3)))),
    st.builds(F.StageReady, st.integers(0, 2)),
    st.builds(F.StageFault, st.integers(0, 2), st.just(pb.RUN_FAULT_RING_FAULT), st.just(pb.COMPONENT_WORKER)),
    st.builds(F.StageStopped, st.integers(0, 2)),
    st.builds(F.ProvisionFailed, st.integers(0, 2), st.just(pb.RUN_FAULT_PROVISIONING_REJECTED), st.just("no")),
    st.just(F.EndpointsReady()),
    st.just(F.EndpointsClosed()),
    st.builds(F.EndpointFault, st.just(pb.RUN_FAULT_STREAM_FAULT)),
    st.builds(F.TokenReceived, st.integers(0, 6), st.sampled_from([2, 7, 8])),
    st.just(F.OperatorStop("x")),
    st.just(F.Tick()),
)
inputs = st.integers(0, 99).flatmap(lambda k: likely if k < 94 else rare)  # rare faults: runs get far


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(inputs, st.floats(0, 1.5)), min_size=3, max_size=40), st.integers(1, 2))
def test_invariants(script, stages: int) -> None:
    ids = itertools.count(100)
    req = F.RunRequest(run_id=1, model=model_facts(), prompt_ids=(1, 2), stages=stages, max_tokens=5,
                       sampling=SamplingPolicy(), eog_ids=frozenset({2}))
    t = F.Timeouts(pool_s=20, readiness_s=10, first_token_s=10, step_s=10, teardown_s=10)
    fsm = F.RunFsm(req, F.FsmConfig(orchestrator_node_id=9, timeouts=t, pool_window_s=1.0), 0.0,
                   id_source=lambda: next(ids))
    now = 1.0  # a stable pool: the first Tick plans (random membership inputs may still disturb it)
    actions: list = [(a, None) for a in fsm.handle(F.MembershipChanged(pool(1, 2, 3)), 0.0)]
    actions += [(a, None) for a in fsm.handle(F.Tick(), now)]
    for inp, dt in script:
        now += dt
        if isinstance(inp, tuple):
            expected = sum(isinstance(a, F.Deliver) for a, _ in actions)
            inp = F.TokenReceived(expected, inp[1])
        actions += [(a, fsm.outcome) for a in fsm.handle(inp, now)]
    # drive to the end: deliver stops for everything and let every timer fire
    for _ in range(10):
        if fsm.state is F.RunState.DONE:
            break
        actions += [(a, fsm.outcome) for a in fsm.handle(F.EndpointsClosed(), now)]
        for k in range(stages):
            actions += [(a, fsm.outcome) for a in fsm.handle(F.StageStopped(k), now)]
        deadline = fsm.deadline()
        now = max(now, deadline if deadline is not None else now) + 0.001
        actions += [(a, fsm.outcome) for a in fsm.handle(F.Tick(), now)]
    assert fsm.state is F.RunState.DONE and fsm.outcome is not None

    emitted = [a.event.kind for a, _ in actions if isinstance(a, F.Emit)]
    assert sum(k in TERMINAL for k in emitted) == 1
    assert emitted.count(K.RUN_TORN_DOWN) == 1 and emitted[-1] == K.RUN_TORN_DOWN
    # nothing injected once the outcome is recorded; sequences 0, 1, 2, ... with no gap
    injects = [(a, out) for a, out in actions if isinstance(a, F.InjectTokens)]
    assert all(out is None for _, out in injects)
    assert [a.sequence for a, _ in injects] == list(range(len(injects)))
    # the barrier precedes the prompt, the prompt precedes every token
    if injects:
        assert emitted.index(K.READINESS_BARRIER_PASSED) < emitted.index(K.PROMPT_INJECTED)
    # stop only what was provisioned, each stage at most once
    provisioned = [a.stage.stage_index for a, _ in actions if isinstance(a, F.Provision)]
    stopped = [a.stage.stage_index for a, _ in actions if isinstance(a, F.StopStage)]
    assert len(stopped) == len(set(stopped)) and set(stopped) <= set(provisioned)
    delivered = [a for a, _ in actions if isinstance(a, F.Deliver)]
    event(f"{fsm.outcome.name} {fsm.reason}, reached RUNNING: {bool(injects)}, tokens: {min(len(delivered), 2)}+")
    assert len(delivered) <= req.max_tokens and [d.sequence for d in delivered] == list(range(len(delivered)))
