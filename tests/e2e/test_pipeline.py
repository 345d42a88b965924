"""End to end on a real 3-host local cluster: membership, arena-manager, edge-driver (QUIC between
hosts) and worker per host, the orchestrator on host 0, real SmolLM2 weights, S = 3.

Order matters: the last test takes a node out of the pool."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest

from swactor.localcluster import LocalCluster
from swactor.localcluster.run import RunResult, follow
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

from .conftest import FIXTURE, PREFILL_CHUNK, needs_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_model]


def comparable(case: dict) -> int:
    """How many of a llama.cpp case's greedy tokens are comparable: up to the first step whose top-2
    logit gap is < 0.1 (a tie there may go either way on another numeric path)."""
    gaps = case["top2_gap"]
    return next((i for i, g in enumerate(gaps) if g < 0.1), len(gaps))


def fixture_case(question: str, chat: bool) -> tuple[dict, int]:
    cases = json.loads(FIXTURE.read_text())["cases"]
    case = next(c for c in cases if c["question"] == question and c["chat_template"] == chat)
    return case, comparable(case)


# Fixture cases sent as token ids with ignore_eos: EOS comes early in greedy output (the raw "capital
# of France" case starts with it and has 4 in its 32 comparable tokens). Not here: the cases with no
# comparable token, and chat "Once upon a time", where our own top-2 gap at step 2 is 0.014 (llama.cpp's
# 0.157, within its Q8_1 activation noise): tests/worker/test_model.py cuts that case by both sides' gaps.
ID_CASES = [("What is the capital of France?", False), ("Once upon a time", False),
            ("Write a Python function that reverses a string.", True)]


def arena_leases(cluster: LocalCluster) -> dict[str, list[tuple[int, str, int]]]:
    out = {}
    for i, h in enumerate(cluster.hosts):
        stats = cluster.arena_stats(i)
        out[h.name] = [(lease.ring_id, lease.requester, lease.edge_id) for lease in stats.leases]
    return out


def run_edges(run: opb.Run) -> set[int]:
    return {e for p in run.placement for e in (p.inbound_edge_id, p.outbound_edge_id)}


def leases_of(cluster: LocalCluster, edges: set[int], timeout_s: float = 10.0) -> dict[str, list[tuple[int, str, int]]]:
    """The arenas' live leases of `edges` (ring_id, requester, edge_id) per host; releases finish
    asynchronously after the last detach, so poll Stats briefly for them to go."""
    deadline = time.monotonic() + timeout_s
    while True:
        mine = {h: [lease for lease in ls if lease[2] in edges] for h, ls in arena_leases(cluster).items()}
        if not any(mine.values()) or time.monotonic() > deadline:
            return mine
        time.sleep(0.2)


def assert_edge_timings(res: RunResult, stages: int) -> None:
    """Issue 7 (a run with trace_objects): every object of every sequence has EDGE_OBJECT_SENT and
    EDGE_OBJECT_RECEIVED on each of the S + 1 edges, with the run's identities, and per sequence the stamps
    (one machine clock) are monotone along the whole pipeline: TOKEN_RECEIVED(s-1) <= token-in picked <= sent <=
    arrived <= committed <= OBJECT_LOADED(0) <= ... <= token-out committed <= TOKEN_RECEIVED(s). The prompt's
    chunk objects 0..P-2 (docs/orchestrator.md "Prefill chunks") yield no token: their chains end at token-out's
    arrival, and the first token comes with sequence P-1."""
    by: dict[tuple[int, int | None, int], pb.LifecycleEvent] = {}
    for e in res.events:
        if e.kind in (pb.EDGE_OBJECT_SENT, pb.EDGE_OBJECT_RECEIVED, pb.OBJECT_LOADED, pb.OBJECT_PRODUCED,
                      pb.TOKEN_RECEIVED):
            key = (e.kind, e.stage_index if e.HasField("stage_index") else None, e.sequence)
            assert key not in by, f"two {pb.LifecycleEventKind.Name(e.kind)} events for {key}"
            by[key] = e
    [injected] = [e for e in res.events if e.kind == pb.PROMPT_INJECTED]
    first = injected.counters["chunks"] - 1  # the prompt's last chunk: the first token's sequence
    assert sorted(k[2] for k in by if k[0] == pb.TOKEN_RECEIVED) == list(range(first, first + len(res.token_ids)))
    for s in range(first + len(res.token_ids)):
        chain = [by[(pb.TOKEN_RECEIVED, None, s - 1)].time_us] if s > first else []
        for hop in range(stages + 1):
            producer = hop - 1 if hop else None  # token-in is sent by the orchestrator (no stage)
            consumer = hop if hop < stages else None  # token-out is received by it
            sent, recv = by[(pb.EDGE_OBJECT_SENT, producer, s)], by[(pb.EDGE_OBJECT_RECEIVED, consumer, s)]
            for e in (sent, recv):
                assert e.run_id == res.run_id and e.node_id and e.component == pb.COMPONENT_EDGE_DRIVER
                assert e.edge_id == sent.edge_id and e.object_id == sent.object_id and e.counters["extent"] > 0
                assert e.ring_id
            if producer is not None:
                assert by[(pb.OBJECT_PRODUCED, producer, s)].edge_id == sent.edge_id
            if consumer is not None:
                assert by[(pb.OBJECT_LOADED, consumer, s)].edge_id == recv.edge_id
            loaded = by[(pb.OBJECT_LOADED, consumer, s)] if consumer is not None else by.get((pb.TOKEN_RECEIVED, None, s))
            # (the peer may see a record's first bytes before its last byte is sent: header and payload
            # can be committed separately, so first_us is only checked against picked_us)
            assert sent.counters["picked_us"] <= recv.counters["first_us"] <= recv.counters["arrived_us"]
            chain += [sent.counters["picked_us"], sent.time_us, recv.counters["arrived_us"], recv.time_us]
            chain += [loaded.time_us] if loaded is not None else []  # a prompt chunk before the last: no token
        assert chain == sorted(chain), f"sequence {s}: stamps not monotone along the pipeline: {chain}"


def assert_distribution(res: RunResult, cluster: LocalCluster, stages: int) -> None:
    """Issue 14: every stage fetched (or found cached) exactly its ranges from host 0's model server:
    STARTED then DOWNLOADED per stage, cached + fetched = the stage's bytes, a middle stage well under
    half the file; ListModels shows the served model and each host's cache holding its share."""
    size = cluster.spec.model.stat().st_size
    for k in range(stages):
        mine = [e for e in res.events if e.HasField("stage_index") and e.stage_index == k]
        started = [e for e in mine if e.kind == pb.WEIGHTS_DOWNLOAD_STARTED]
        done = [e for e in mine if e.kind == pb.WEIGHTS_DOWNLOADED]
        assert len(started) == len(done) == 1, f"stage {k}: {len(started)} started, {len(done)} downloaded"
        total = done[0].counters["bytes_total"]
        assert started[0].counters["bytes_cached"] + done[0].counters["bytes_fetched"] == total
        loaded = [e for e in mine if e.kind == pb.WEIGHTS_LOADED]
        assert loaded and loaded[0].time_us >= done[0].time_us  # fetched, then loaded
        if 0 < k < stages - 1:
            assert total < 0.4 * size, f"middle stage {k} needed {total} of {size} bytes"
        print(f"stage {k}: {total / size:.3f} of the file ({done[0].counters['bytes_fetched']} B fetched)")
    with cluster.channel() as ch:
        models = orchestrator_pb2_grpc.OrchestratorStub(ch).ListModels(opb.ListModelsRequest(), timeout=30)
    [served] = [m for m in models.models if m.is_default]
    assert served.state == "ready" and served.url.startswith(f"https://{cluster.hosts[0].addr}:")
    held = {n.node_id: n for n in models.nodes}
    assert set(held) == set(cluster.node_ids) and not any(n.error for n in held.values())
    for n in held.values():
        [f] = [f for f in n.files if f.sha256 == served.sha256]
        assert 0 < f.bytes_held < size and f.model == served.name


def test_three_stages_match_llamacpp_greedy(cluster3: LocalCluster) -> None:
    # The chat-template case with the longest comparable prefix and no EOS inside it, so the run
    # ends on max_tokens, not EOS. Its prompt flows through the stages in chunks of PREFILL_CHUNK tokens.
    case, n = fixture_case("Write a Python function that reverses a string.", chat=True)
    assert n >= 16 and 2 not in case["greedy_tokens"][:n]
    with cluster3.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        res = follow(stub, opb.SubmitRunRequest(prompt=case["question"], stages=3, max_tokens=n, trace_objects=True),
                     timeout_s=240)
    assert res.finished is not None
    assert res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, (res.finished.reason, res.finished.detail)
    assert res.finished.reason == "max_tokens"
    assert res.prompt_tokens == len(case["prompt_tokens"])
    assert sorted(p.node_id for p in res.finished.placement) == sorted(cluster3.node_ids)
    assert res.token_ids == case["greedy_tokens"][:n]
    kinds = [e.kind for e in res.events]
    assert kinds.count(pb.STAGE_READY) == 3 and pb.RUN_TORN_DOWN in kinds
    [injected] = [e for e in res.events if e.kind == pb.PROMPT_INJECTED]
    assert injected.counters["chunks"] == -(-len(case["prompt_tokens"]) // PREFILL_CHUNK) > 1
    for k in range(3):  # compiled before the barrier: every stage's COMPILE_PROGRESS comes before its STAGE_READY
        mine = [e.kind for e in res.events if e.HasField("stage_index") and e.stage_index == k]
        assert pb.COMPILE_PROGRESS in mine and mine.index(pb.COMPILE_PROGRESS) < mine.index(pb.STAGE_READY)
    assert_edge_timings(res, stages=3)
    assert_distribution(res, cluster3, stages=3)
    for k in range(3):  # a run alone decodes under a step grant: each stage's first decode row is its last ExecuteStep
        rows = [e for e in res.events if e.kind == pb.EXECUTE_STEP_STARTED and e.stage_index == k
                and e.counters["rows"] == 1]
        assert len(rows) == n - 1 and [e.counters["granted"] for e in rows] == [0] + [1] * (n - 2), (k, rows)
    left = leases_of(cluster3, run_edges(res.finished))
    assert not any(left.values()), (f"this run's arena leases (ring_id, requester, edge_id) live after teardown: "
                                    f"{left}; teardown took {res.summary()['teardown_s']} s")
    print(f"S=3 TTFT {res.ttft_s:.2f} s, decode {res.decode_tok_s:.2f} tok/s, text {res.text!r}")


@pytest.mark.parametrize(("question", "chat"), ID_CASES, ids=lambda v: v if isinstance(v, bool) else v[:20])
def test_three_stages_match_llamacpp_greedy_from_prompt_ids_through_eos(cluster3: LocalCluster, question: str,
                                                                         chat: bool) -> None:
    case, n = fixture_case(question, chat)
    assert n >= 1
    with cluster3.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        req = opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=case["prompt_tokens"]), stages=3, max_tokens=n,
                                   ignore_eos=True)
        res = follow(stub, req, timeout_s=240)
    assert res.finished is not None
    assert res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, (res.finished.reason, res.finished.detail)
    assert res.finished.reason == "max_tokens"
    assert res.prompt_tokens == len(case["prompt_tokens"])
    assert res.token_ids == case["greedy_tokens"][:n]
    assert not any(e.kind in (pb.OBJECT_LOADED, pb.EDGE_OBJECT_SENT) for e in res.events)  # untraced: no per-object events
    assert not any(leases_of(cluster3, run_edges(res.finished)).values())
    print(f"{question!r} chat={chat}: {n} tokens match, {sum(t == 2 for t in res.token_ids)} of them EOS")


@pytest.mark.parametrize("drafter", [opb.DRAFTER_PROMPT_LOOKUP, opb.DRAFTER_DRAFT_MODEL], ids=["lookup", "draft_model"])
@pytest.mark.parametrize("seed", [None, 1], ids=["greedy", "seeded"])
def test_speculative_decoding_gives_the_tokens_of_the_run_without_it(cluster3: LocalCluster, seed: int | None,
                                                                     drafter: int) -> None:
    """--speculate through three stages (drafts from prompt lookup, or from the orchestrator's draft model, verified
    as one object, rejected rows rewound at every stage): the same tokens as without it, greedy and with a seeded
    sampler, on a text that repeats itself."""
    n, prompt = 24, "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the log."
    sampling = opb.Sampling() if seed is None else opb.Sampling(temperature=0.8, top_k=40, seed=seed)
    runs = {}
    with cluster3.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        for speculate in (0, 6):
            req = opb.SubmitRunRequest(prompt=prompt, raw=True, stages=3, max_tokens=n, ignore_eos=True,
                                       sampling=sampling, speculate=speculate, drafter=drafter)
            runs[speculate] = res = follow(stub, req, timeout_s=240)
            assert res.finished is not None and res.finished.reason == "max_tokens", res.summary()
    plain, fast = runs[0], runs[6]
    assert fast.token_ids == plain.token_ids
    [done] = [e for e in fast.events if e.kind == pb.RUN_COMPLETED]
    assert 0 < done.counters["accepted"] <= done.counters["drafted"], dict(done.counters)
    if seed is not None and drafter == opb.DRAFTER_PROMPT_LOOKUP:
        # this one also rejects a draft: its rows are rewound on every stage, its draw taken back (the model drafting
        # for itself samples with the run's own draws: it is rarely wrong)
        assert done.counters["accepted"] < done.counters["drafted"], dict(done.counters)
    verified = [e for e in fast.events if e.kind == pb.TOKEN_RECEIVED and "drafted" in e.counters]
    assert sum(e.counters["accepted"] for e in verified) == done.counters["accepted"]
    assert not any(leases_of(cluster3, run_edges(fast.finished)).values())
    print(f"seed {seed}, {opb.Drafter.Name(drafter)}: {plain.text!r}, drafted {done.counters['drafted']}, accepted {done.counters['accepted']} "
          f"in {len(verified)} verify steps")


def test_stop_run_mid_decode_tears_down_and_frees_every_lease(cluster3: LocalCluster) -> None:
    stopped = threading.Event()
    with cluster3.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)

        def on_update(u: opb.RunUpdate, r: RunResult) -> None:
            if u.HasField("token") and len(r.token_ids) == 3 and not stopped.is_set():
                stopped.set()
                stub.StopRun(opb.StopRunRequest(run_id=r.run_id, detail="e2e: stop mid-decode"), timeout=30)

        res = follow(stub, opb.SubmitRunRequest(prompt="Once upon a time", stages=3, max_tokens=200),
                     on_update, timeout_s=240)
    assert stopped.is_set()
    assert res.finished is not None
    assert res.finished.outcome == opb.RUN_OUTCOME_STOPPED, (res.finished.reason, res.finished.detail)
    assert 3 <= len(res.token_ids) < 200
    assert res.finished.torn_down_us > 0
    assert res.events[-1].kind == pb.RUN_TORN_DOWN
    assert sum(e.kind == pb.STAGE_STOPPED for e in res.events) == 3
    left = leases_of(cluster3, run_edges(res.finished))
    place = res.finished.placement
    assert not any(left.values()), (
        f"this run's arena leases (ring_id, requester, edge_id) live after teardown: {left}; token-in edge "
        f"{place[0].inbound_edge_id}, token-out edge {place[-1].outbound_edge_id}; teardown took "
        f"{res.summary()['teardown_s']} s")
    # Zero live leases on every host (an earlier test's leak fails that test, and this one too).
    everything = arena_leases(cluster3)
    assert not any(everything.values()), f"live arena leases on the hosts: {everything}"


def test_node_leaving_before_pool_ready_is_refused_with_a_reason(cluster3: LocalCluster) -> None:
    # h2 leaves gracefully: the worker first (NodeAvailable withdrawn), then its membership.
    for name in ("h2/worker", "h2/membership"):
        assert cluster3.service(name).stop(15), f"{name} did not stop on SIGTERM"
    t0 = time.monotonic()
    with cluster3.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        try:
            res = follow(stub, opb.SubmitRunRequest(prompt="Hello", stages=3, max_tokens=4), timeout_s=60)
        except grpc.RpcError as e:  # refused at submit: the reason is the call's status
            assert e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE,  # type: ignore[attr-defined]
                                grpc.StatusCode.RESOURCE_EXHAUSTED), e
            assert e.details()  # type: ignore[attr-defined]
            print(f"refused at submit: {e.code().name}: {e.details()}")  # type: ignore[attr-defined]
            return
    elapsed = time.monotonic() - t0
    assert res.finished is not None
    assert res.finished.outcome == opb.RUN_OUTCOME_FAULTED, (res.finished.reason, res.finished.detail)
    assert res.finished.reason and res.finished.detail
    assert not res.token_ids
    assert elapsed < 45, f"the refusal took {elapsed:.0f} s"
    assert not any(leases_of(cluster3, run_edges(res.finished)).values())
    print(f"refused after {elapsed:.1f} s: {res.finished.reason}: {res.finished.detail}")
