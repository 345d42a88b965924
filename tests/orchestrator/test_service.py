"""The Orchestrator gRPC API end to end against a scripted fake fleet (real gRPC, real GGUF tokenizer)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import grpc
import pytest

from swactor.cli.render import plan_lines
from swactor.orchestrator.fleet.nodes import NodeState
from swactor.orchestrator.runs import fsm as F
from swactor.orchestrator.tokens.tokenizer import Message, render_chat
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import registry, serving
from .helpers import node, pool

pytestmark = pytest.mark.timeout(60)
ANSWER = " The capital of France is Paris. 🇫🇷"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def collect(stub, run_id: int) -> list[opb.RunUpdate]:
    return [u async for u in stub.WatchRun(opb.WatchRunRequest(run_id=run_id))]


def events_of(updates) -> list[str]:
    return [pb.LifecycleEventKind.Name(u.event.kind) for u in updates if u.HasField("event")]


def test_two_stage_run_streams_text_events_and_tears_down(tmp_path: Path) -> None:
    tok = registry().get("").tokenizer
    script = [*tok.encode(ANSWER), 2]
    fleet = FakeFleet(script)

    async def main():
        async with serving(tmp_path, fleet, pool(11, 12)) as s:
            await asyncio.sleep(0.06)  # the PoolReady window
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="What is the capital of France?", stages=2,
                                                               max_tokens=64))
            updates = await collect(s.stub, resp.run_id)
            got = await s.stub.GetRun(opb.GetRunRequest(run_id=resp.run_id))
            listed = await s.stub.ListRuns(opb.ListRunsRequest())
            tokens = await s.stub.GetEvents(opb.GetEventsRequest(run_id=resp.run_id, kind=pb.TOKEN_RECEIVED))
            answer_only = [u async for u in s.stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id,
                                                                                omit_object_events=True))]
            return resp, updates, got, listed, tokens, answer_only

    resp, updates, got, listed, tokens, answer_only = run(main())
    prompt = tok.encode(render_chat(tok.data.chat_template, [Message("user", "What is the capital of France?")]))
    assert resp.prompt_tokens == len(prompt)
    assert fleet.injected[0] == (0, tuple(prompt))
    assert [seq for seq, _ in fleet.injected] == list(range(len(script)))
    assert all(ids == (script[seq - 1],) for seq, ids in fleet.injected[1:])
    deltas = [u.token for u in updates if u.HasField("token")]
    assert [d.token_id for d in deltas] == script and deltas[-1].end_of_generation
    assert "".join(d.text for d in deltas) == ANSWER
    assert all("\ufffd" not in d.text for d in deltas)
    kinds = events_of(updates)
    assert kinds[:4] == ["POOL_READY", "RUN_PLANNED", "STAGE_PROVISION_STARTED", "STAGE_PROVISION_STARTED"]
    for k in ("WEIGHTS_LOADED", "STAGE_READY", "READINESS_BARRIER_PASSED", "PROMPT_INJECTED"):
        assert k in kinds
    assert kinds.index("READINESS_BARRIER_PASSED") < kinds.index("PROMPT_INJECTED") < kinds.index("TOKEN_RECEIVED")
    assert kinds.count("TOKEN_RECEIVED") == len(script)
    assert kinds[-6:] == ["RUN_COMPLETED", "STOP_RUN_SENT", "STOP_RUN_SENT", "STAGE_STOPPED", "STAGE_STOPPED",
                          "RUN_TORN_DOWN"]
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_COMPLETED and final.reason == "eos" and final.state == opb.RUN_STATE_DONE
    assert final.text == ANSWER and list(final.token_ids) == script
    assert [(p.node_id, p.layer_start, p.layer_end_exclusive) for p in final.placement] == [(11, 0, 15), (12, 15, 30)]
    assert got == final and listed.runs[0] == final
    assert len(tokens.events) == len(script)
    assert sorted(fleet.stopped) == [0, 1] and fleet.closed == 1
    # A watcher of the answer alone gets the same stream less the per-object events (the gateway's).
    assert answer_only == [u for u in updates if not (u.HasField("event") and u.event.kind == pb.TOKEN_RECEIVED)]


def test_bad_requests_are_refused_by_name_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1, 2)) as s:
            cases = [
                (opb.SubmitRunRequest(prompt="hi", model="gpt-9", max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT,
                 "unknown model 'gpt-9'"),
                (opb.SubmitRunRequest(prompt="hi", stages=3, max_tokens=5), grpc.StatusCode.FAILED_PRECONDITION,
                 "3 stage(s) need 3 stage device(s); the pool has 2 on 2 Available node(s)"),
                (opb.SubmitRunRequest(prompt="hi", stages=31, max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT,
                 "has 30 blocks"),
                (opb.SubmitRunRequest(prompt="hi", max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
                (opb.SubmitRunRequest(prompt="hi", max_tokens=-4), grpc.StatusCode.INVALID_ARGUMENT, "got -4"),
                (opb.SubmitRunRequest(prompt="   ", max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty"),
                (opb.SubmitRunRequest(max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT, "neither"),
                (opb.SubmitRunRequest(messages=opb.ChatMessages(), max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT,
                 "messages is empty"),
                (opb.SubmitRunRequest(messages=opb.ChatMessages(messages=[opb.ChatMessage(role="robot", content="x")]),
                                      max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT, "unknown role 'robot'"),
                (opb.SubmitRunRequest(prompt="hi", max_tokens=5, sampling=opb.Sampling(temperature=-1)),
                 grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
                (opb.SubmitRunRequest(prompt="x " * 5000, raw=True, max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT,
                 "the context holds 4096"),
                (opb.SubmitRunRequest(prompt="hi", max_tokens=5, stages=2, node_ids=[1, 1]),  # one stage device
                 grpc.StatusCode.FAILED_PRECONDITION, "node 1 is named 2 times but has 1 stage device(s)"),
                (opb.SubmitRunRequest(prompt="hi", max_tokens=5, stages=2, node_ids=[1]),
                 grpc.StatusCode.INVALID_ARGUMENT, "node_ids must name 2 node(s), one per stage"),
            ]
            seen = []
            for req, _code, needle in cases:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await s.stub.SubmitRun(req)
                seen.append((err.value.code(), needle in err.value.details(), err.value.details()))
            for call, req in [(s.stub.GetRun, opb.GetRunRequest(run_id=42)),
                              (s.stub.StopRun, opb.StopRunRequest(run_id=42)),
                              (s.stub.GetEvents, opb.GetEventsRequest(run_id=42))]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(req)
                seen.append((err.value.code(), "unknown run_id 42" in err.value.details(), err.value.details()))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await collect(s.stub, 42)
            seen.append((err.value.code(), "unknown run_id 42" in err.value.details(), err.value.details()))
            still = await s.stub.ListRuns(opb.ListRunsRequest())
            return cases, seen, still

    cases, seen, still = run(main())
    expected = [(code, True) for _, code, _ in cases] + [(grpc.StatusCode.NOT_FOUND, True)] * 4
    assert [(c, ok) for c, ok, _ in seen] == expected, seen
    assert list(still.runs) == []


def test_prompt_ids_are_validated_by_field_name(tmp_path: Path) -> None:
    vocab = registry().get("").facts.vocab_size

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1, 2)) as s:
            cases = [
                (opb.SubmitRunRequest(prompt_ids=opb.PromptIds(), max_tokens=5), "prompt_ids is empty"),
                (opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=[1, 2, vocab, 3]), max_tokens=5),
                 f"prompt_ids[2] = {vocab} is not below the vocab size {vocab}"),
                (opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=[7] * 4096), max_tokens=5),
                 "prompt_ids is 4096 tokens; the context holds 4096"),
            ]
            seen = []
            for req, needle in cases:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await s.stub.SubmitRun(req)
                seen.append((err.value.code(), needle in err.value.details(), err.value.details()))
            still = await s.stub.ListRuns(opb.ListRunsRequest())
            return seen, still

    seen, still = run(main())
    assert [(c, ok) for c, ok, _ in seen] == [(grpc.StatusCode.INVALID_ARGUMENT, True)] * 3, seen
    assert list(still.runs) == []


def test_prompt_ids_go_in_as_is_and_ignore_eos_runs_to_max_tokens(tmp_path: Path) -> None:
    fleet = FakeFleet([2, 100, 2, 101])  # EOS first and again mid-stream; EOS once the script ends

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=[2, 9690, 198]),
                                                               max_tokens=6, ignore_eos=True))
            return resp, await collect(s.stub, resp.run_id)

    resp, updates = run(main())
    assert resp.prompt_tokens == 3
    assert fleet.injected[0] == (0, (2, 9690, 198))
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_COMPLETED and final.reason == "max_tokens"
    assert list(final.token_ids) == [2, 100, 2, 101, 2, 2]
    deltas = [u.token for u in updates if u.HasField("token")]
    assert [d.end_of_generation for d in deltas] == [True, False, True, False, True, True]


def test_operator_stop_mid_decode(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 101, 102, 103, 104], hold_after=2)

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="count", raw=True, max_tokens=50))
            watch = asyncio.create_task(collect(s.stub, resp.run_id))
            while len(fleet.injected) < 3:
                await asyncio.sleep(0.01)
            stopped = await s.stub.StopRun(opb.StopRunRequest(run_id=resp.run_id, detail="operator said so"))
            fleet.release.set()
            updates = await watch
            return stopped.run, updates

    stopped, updates = run(main())
    assert stopped.outcome == opb.RUN_OUTCOME_STOPPED and stopped.detail == "operator said so"
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_STOPPED and list(final.token_ids) == [100, 101]
    kinds = events_of(updates)
    assert "RUN_STOPPED" in kinds and kinds[-1] == "RUN_TORN_DOWN" and "RUN_COMPLETED" not in kinds
    assert fleet.stopped == [0] and [seq for seq, _ in fleet.injected] == [0, 1, 2]


@pytest.mark.parametrize(("fleet_kw", "reason"), [
    (dict(fault_at_sequence=1), "RUN_FAULT_STEP_FAILED"),
    (dict(fail_stage=1), "RUN_FAULT_PROVISIONING_REJECTED"),
])
def test_faults_end_the_run_with_the_first_reason(tmp_path: Path, fleet_kw: dict, reason: str) -> None:
    fleet = FakeFleet([100, 101, 102], **fleet_kw)

    async def main():
        async with serving(tmp_path, fleet, pool(1, 2)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, stages=2, max_tokens=10))
            return await collect(s.stub, resp.run_id)

    updates = run(main())
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_FAULTED and final.reason == reason
    faulted = [u.event for u in updates if u.HasField("event") and u.event.kind == pb.RUN_FAULTED]
    assert len(faulted) == 1 and faulted[0].reason == reason and faulted[0].component != pb.COMPONENT_UNSPECIFIED
    assert events_of(updates)[-1] == "RUN_TORN_DOWN"


def test_teardown_timeout_is_bounded(tmp_path: Path) -> None:
    fleet = FakeFleet([2], never_stop=True)

    async def main():
        async with serving(tmp_path, fleet, pool(1), timeouts=F.Timeouts(teardown_s=0.2)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=10))
            return await collect(s.stub, resp.run_id)

    updates = run(main())
    torn = updates[-2].event
    assert torn.kind == pb.RUN_TORN_DOWN and torn.reason == "RUN_FAULT_TEARDOWN_TIMEOUT"
    assert updates[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED


def test_a_booting_node_holds_only_the_run_pinned_to_it(tmp_path: Path) -> None:
    async def main():
        members = (node(1), node(2, NodeState.BOOTING))
        async with serving(tmp_path, FakeFleet([2]), members, timeouts=F.Timeouts(pool_s=0.3, teardown_s=2.0)) as s:
            free = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3))
            free_updates = await collect(s.stub, free.run_id)
            pinned = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3, node_ids=[2]))
            nodes = await s.stub.ListNodes(opb.ListNodesRequest())
            return free_updates, await collect(s.stub, pinned.run_id), nodes

    free, pinned, nodes = run(main())
    assert free[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED  # node 2 is not needed: it does not hold the run
    [ready] = [u.event for u in free if u.HasField("event") and u.event.kind == pb.POOL_READY]
    assert "not candidates: 2 is booting" in ready.detail
    final = pinned[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_FAULTED and final.reason == "RUN_FAULT_NODE_UNAVAILABLE"
    assert "pinned node 2 is booting" in final.detail
    waiting = [u.event.detail for u in pinned if u.HasField("event") and u.event.kind == pb.POOL_WAITING]
    assert waiting == ["waiting for pinned node 2 to be Available (it is booting)"]
    assert [(n.node_id, n.readiness, n.provisionable) for n in nodes.nodes] == [
        (1, opb.NODE_READINESS_AVAILABLE, True), (2, opb.NODE_READINESS_BOOTING, False)]
    assert nodes.nodes[0].gpus[0].name == "H100" and nodes.pool_ready


def test_plan_dry_run_and_a_shortfall_refused_at_submit(tmp_path: Path) -> None:
    big, small = (dataclasses.replace(node(i), memory_bytes=m) for i, m in ((1, 8 << 30), (2, 200 << 20)))

    async def main():
        async with serving(tmp_path, FakeFleet([2]), (big, small)) as s:
            ok = await s.stub.Plan(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3, stages=1))
            short = await s.stub.Plan(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3, stages=2))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3, stages=2))
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await s.stub.Plan(opb.SubmitRunRequest(prompt="", max_tokens=3))
            return ok, short, refused.value, bad.value, await s.stub.ListRuns(opb.ListRunsRequest())

    ok, short, refused, bad, runs = run(main())
    assert not ok.refusal and ok.memory_known and ok.split == "memory" and ok.max_seq_len == 4096
    [stage] = ok.placement
    assert (stage.node_id, stage.layer_start, stage.layer_end_exclusive, stage.fits) == (1, 0, 30, True)
    assert stage.total_bytes == stage.weights_bytes + stage.kv_cache_bytes + stage.scratch_bytes + stage.runtime_bytes
    assert 0 < stage.total_bytes < stage.node_memory_bytes == 8 << 30
    assert short.refusal.startswith("RUN_FAULT_DEVICE_OUT_OF_MEMORY: the model does not fit the nodes' memory: stage 1")
    assert [p.fits for p in short.placement] == [True, False] and short.split == "fitted"
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and refused.details() == short.refusal
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not runs.runs  # nothing was started


def test_a_run_that_leaves_the_stage_count_open_gets_the_fewest_that_fit(tmp_path: Path) -> None:
    def pool(memory: int) -> tuple:
        return tuple(dataclasses.replace(node(i), memory_bytes=memory) for i in (1, 2, 3))

    async def main():
        async with serving(tmp_path / "a", FakeFleet([]), pool(8 << 30)) as s:
            whole = await s.stub.Plan(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3))
        async with serving(tmp_path / "b", FakeFleet([]), pool(whole.placement[0].total_bytes * 3 // 4)) as s:
            auto = await s.stub.Plan(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3))
            named = await s.stub.Plan(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3, stages=3))
            return whole, auto, named

    whole, auto, named = run(main())
    assert whole.stages == 1 and whole.stages_fitted  # the whole model fits one node: one stage, no hop
    assert auto.stages == 2 and auto.stages_fitted and not auto.refusal and len(auto.placement) == 2
    assert plan_lines(auto)[0].startswith(f"model {auto.model}: 2 stage(s) (the planner's: the fewest that fit, or more predicted 3x quicker), ")
    assert named.stages == 3 and not named.stages_fitted


def test_a_run_that_leaves_the_stage_count_open_goes_to_hosts_predicted_3x_quicker(tmp_path: Path) -> None:
    """Node 1 holds the model alone but measured 2 ms a layer; nodes 2 and 3 hold three quarters of it each and
    measured 0.1: the open stage count is two, on them (test_placement_quickest.py has the rule's table)."""
    async def main():
        async with serving(tmp_path / "a", FakeFleet([]), (dataclasses.replace(node(1), memory_bytes=8 << 30),)) as s:
            whole = (await s.stub.Plan(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3))).placement[0]
        part = whole.total_bytes * 3 // 4
        members = (dataclasses.replace(node(1), memory_bytes=8 << 30, ms_per_layer=2.0),
                   *(dataclasses.replace(node(i), memory_bytes=part, ms_per_layer=0.1) for i in (2, 3)))
        async with serving(tmp_path / "b", FakeFleet([]), members) as s:
            return await s.stub.Plan(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3))

    auto = run(main())
    assert auto.stages == 2 and auto.stages_fitted and not auto.refusal
    assert sorted(p.node_id for p in auto.placement) == [2, 3]
    assert auto.compute_ms_per_token < 2.0 * 30 / 3


def test_finished_runs_replay_from_the_store_after_restart(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 2])

    async def first():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=10))
            await collect(s.stub, resp.run_id)
            s.store.close()
            return resp.run_id

    async def second(run_id: int):
        async with serving(tmp_path, FakeFleet([2]), pool(1)) as s:
            return await collect(s.stub, run_id)

    run_id = run(first())
    updates = run(second(run_id))
    assert events_of(updates)[0] == "POOL_READY" and events_of(updates)[-1] == "RUN_TORN_DOWN"
    assert updates[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED and list(updates[-1].finished.token_ids) == [100, 2]


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_greedy.json"


@pytest.mark.skipif(not FIXTURE.exists(), reason="llama.cpp fixture not recorded")
def test_submit_path_matches_llamacpp_prompt_and_completion(tmp_path: Path) -> None:
    """SubmitRun (chat or raw) injects exactly llama.cpp's prompt ids; replaying llama.cpp's greedy
    tokens through the fleet streams exactly llama.cpp's completion text."""
    import json

    cases = json.loads(FIXTURE.read_text())["cases"]

    async def one(case: dict):
        fleet = FakeFleet(case["greedy_tokens"], eos=-1)
        async with serving(tmp_path / str(id(case)), fleet, pool(1, 2)) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(
                prompt=case["question"] if case["chat_template"] else case["text"], raw=not case["chat_template"],
                stages=2, max_tokens=len(case["greedy_tokens"])))
            updates = await collect(s.stub, resp.run_id)
            return fleet.injected[0], updates

    for case in cases:
        (tmp_path / str(id(case))).mkdir()
        first, updates = run(one(case))
        assert first == (0, tuple(case["prompt_tokens"]))
        final = updates[-1].finished
        assert final.reason in ("max_tokens", "eos")
        n = len(final.token_ids)
        assert list(final.token_ids) == case["greedy_tokens"][:n]
        if final.reason == "max_tokens":
            assert final.text == case["completion"]
