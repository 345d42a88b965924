"""Acceptance of runs in flight (docs/runs-in-flight.md) with real weights: the orchestrator (gRPC API, admission,
run FSMs, StageControlFleet over mutual TLS) drives real worker StageNodes whose real compute processes run SmolLM2
on the CPU, activations and tokens moving through real rings and real edge-drivers over QUIC on 127.0.0.1 (the
harness of test_pipeline_e2e). Several runs share each stage's weights, a KV slot each, their decode rows batched.

Every run's greedy tokens equal the float64 reference (tests/worker/reference.py) up to its first top-2 gap below
0.02; a run that ends by itself (stopped, its own bad input, its client gone) leaves the others decoding to their exact
end; a compute process lost ends each of its runs once and the next runs complete."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from swactor.orchestrator.fleet.stage_fleet import StageControlFleet, mtls_channels
from swactor.orchestrator.tokens import token_endpoints
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from tests.harness.run_spans import most_at_once, run_span
from tests.worker.reference import Reference
from tests.worker_service import harness, node_fakes

from .harness import Served, serving
from .helpers import MODEL_PATH
from .inproc_edges import start_drivers, stop_drivers
from .test_pipeline_e2e import ORCH, SECRET, StageHost

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420),
              pytest.mark.skipif(not MODEL_PATH.exists(), reason="run `make model`")]

CASES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_greedy.json").read_text())["cases"]
# llama.cpp's tokenisations of the fixture's prompts (3 to 40 tokens) and parts of them: runs join at different times
# (their prefill chunks interleave with the others' decode rows)
CHAT_FRANCE, PLAIN_FRANCE, CHAT_PYTHON, PLAIN_PYTHON, CHAT_ONCE, PLAIN_ONCE = (c["prompt_tokens"] for c in CASES)
PROMPTS = [CHAT_FRANCE, PLAIN_FRANCE, PLAIN_ONCE, CHAT_PYTHON[:21], PLAIN_PYTHON, PLAIN_FRANCE[:3], CHAT_ONCE,
           PLAIN_ONCE + PLAIN_FRANCE[:2]]
GAP = 0.02


def reference_tokens(prompt: list[int], n: int) -> tuple[list[int], int]:
    """The float64 greedy tokens and how many of them are binding: up to the first top-2 gap below 0.02."""
    tokens, gaps = Reference(str(MODEL_PATH.resolve())).greedy(prompt, n)
    binding = next((i + 1 for i, g in enumerate(gaps) if g < GAP), n)
    return tokens, binding


def assert_reference(run: opb.Run, prompt: list[int]) -> None:
    got = list(run.token_ids)
    want, binding = reference_tokens(prompt, len(got))
    assert got[:binding] == want[:binding], (prompt, got, want, binding)


@contextlib.asynccontextmanager
async def pipeline(tmp_path: Path, node_ids: list[int], slots: int) -> AsyncIterator[tuple[Served, list[StageHost], Any]]:
    """The stages hold `slots` runs in flight: each compiles a graph per batch width up to it at its load."""
    arena = harness.Arena(128 << 20)
    drivers = await start_drivers(tmp_path, [ORCH, *node_ids], arena.arena)
    hosts = [StageHost(arena, drivers[n], n) for n in node_ids]

    async def local_ports() -> Any:
        return node_fakes.FakeArenaPort(arena), drivers[ORCH], arena.arena

    fleet = StageControlFleet(mtls_channels(SECRET, ORCH), lambda plan, report: MODEL_PATH.resolve(),
                              endpoints=token_endpoints.RingEndpointFactory(local_ports))
    try:
        for h in hosts:
            await h.start()
        while not all(h.node.available for h in hosts):
            await asyncio.sleep(0.05)
        async with serving(tmp_path, fleet, [h.member for h in hosts], max_seq_len_cap=64,
                           max_slots_per_stage=slots) as served:
            await asyncio.sleep(0.06)
            yield served, hosts, drivers
    finally:
        for h in hosts:
            await h.close()
        await stop_drivers(drivers)
        arena.close()


def request(prompt: list[int], stages: int, max_tokens: int, **kw: Any) -> opb.SubmitRunRequest:
    return opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=prompt), stages=stages, max_tokens=max_tokens,
                                ignore_eos=True, **kw)  # no stop at EOS: it comes early, the comparison goes on


async def run_to_end(served: Served, req: opb.SubmitRunRequest) -> list[opb.RunUpdate]:
    resp = await served.stub.SubmitRun(req)
    return [u async for u in served.stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id))]


def in_flight_at_most(runs: list[list[opb.RunUpdate]]) -> int:
    return most_at_once([run_span(u.event for u in ups if u.HasField("event")) for ups in runs])


def assert_idle(hosts: list[StageHost]) -> None:
    for h in hosts:
        assert h.node.slots_in_use()[0] == 0 and not h.node.scheduler.waiting and h.node.scheduler.in_flight is None


def burst(served: Served, stages: int, n: int) -> Any:
    """n runs of the prompts above submitted at once, each with its own length (they leave at different times)."""
    return asyncio.gather(*(run_to_end(served, request(PROMPTS[i % len(PROMPTS)], stages, 6 + i)) for i in range(n)))


def check_burst(runs: list[list[opb.RunUpdate]], n: int) -> None:
    for i, ups in enumerate(runs):
        final = ups[-1].finished
        assert final.outcome == opb.RUN_OUTCOME_COMPLETED, (final.reason, final.detail)
        assert len(final.token_ids) == 6 + i
        assert_reference(final, PROMPTS[i % len(PROMPTS)])
    assert len({tuple((p.node_id, p.layer_start) for p in ups[-1].finished.placement) for ups in runs}) == 1
    assert in_flight_at_most(runs) >= min(n, 3), in_flight_at_most(runs)


def test_one_stage_one_two_and_four_runs_in_flight_equal_the_reference(tmp_path: Path) -> None:
    async def body() -> None:
        async with pipeline(tmp_path, [2], slots=4) as (served, hosts, _drivers):
            solo = await run_to_end(served, request(PROMPTS[0], 1, 6))
            assert_reference(solo[-1].finished, PROMPTS[0])
            for n in (2, 4):
                check_burst(await burst(served, 1, n), n)
            widths = hosts[0].node.scheduler.widths  # steps by the runs in them: rows of several runs went as one
            assert max(widths) >= 3 and sum(n for w, n in widths.items() if w > 1) >= 5, widths
            assert_idle(hosts)

    asyncio.run(body())


def test_three_stages_eight_runs_in_flight_and_runs_that_end_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """S=3: one run alone, then 8 at once (1..8 in flight as they join and leave); then four in flight where one is
    stopped, one sends a bad object (its own input: a sequence gap on its token-in edge), one's client goes away,
    and the fourth decodes to its exact end; then a compute process is killed under four runs in flight: four
    outcomes, and the next run completes on the restarted process."""
    bad_runs: set[int] = set()
    inject = token_endpoints.RingTokenEndpoints.inject

    async def bad_input(self: Any, sequence: int, token_ids: Any, flags: int = 0) -> None:
        if self.plan.run_id in bad_runs and sequence == 3:  # a producer whose header jumps ahead: the stage expects 3
            sequence = self.writer._egress.next_sequence = 9  # and StrictlyConsecutive (§16) refuses the object
        await inject(self, sequence, token_ids, flags)

    monkeypatch.setattr(token_endpoints.RingTokenEndpoints, "inject", bad_input)

    async def body() -> None:
        async with pipeline(tmp_path, [2, 3, 4], slots=8) as (served, hosts, drivers):
            solo = await run_to_end(served, request(PROMPTS[1], 3, 6))
            assert_reference(solo[-1].finished, PROMPTS[1])
            check_burst(await burst(served, 3, 8), 8)
            assert_idle(hosts)

            # ---- runs that end alone while another decodes on ----
            stub = served.stub
            keeps = asyncio.ensure_future(run_to_end(served, request(PROMPTS[0], 3, 24)))
            stopped = await stub.SubmitRun(request(PROMPTS[2], 3, 40))
            bad = await stub.SubmitRun(request(PROMPTS[5], 3, 40))
            bad_runs.add(bad.run_id)
            gone = await stub.SubmitRun(request(PROMPTS[7], 3, 40, stop_when_unwatched=True))
            watch = stub.WatchRun(opb.WatchRunRequest(run_id=gone.run_id))
            tokens = 0
            async for u in watch:
                tokens += u.HasField("token")
                if tokens == 3:
                    break
            watch.cancel()  # the client vanishes mid-decode
            await asyncio.sleep(0.3)
            await stub.StopRun(opb.StopRunRequest(run_id=stopped.run_id))
            ends = {r: [u async for u in stub.WatchRun(opb.WatchRunRequest(run_id=r))][-1].finished
                    for r in (stopped.run_id, bad.run_id, gone.run_id)}
            assert ends[stopped.run_id].outcome == opb.RUN_OUTCOME_STOPPED
            assert ends[bad.run_id].outcome == opb.RUN_OUTCOME_FAULTED
            assert ends[bad.run_id].reason == "RUN_FAULT_SEQUENCE_VIOLATION", ends[bad.run_id].detail
            assert ends[gone.run_id].outcome == opb.RUN_OUTCOME_STOPPED and "client gone" in ends[gone.run_id].detail
            final = (await keeps)[-1].finished
            assert final.outcome == opb.RUN_OUTCOME_COMPLETED and len(final.token_ids) == 24
            assert_reference(final, PROMPTS[0])
            assert_idle(hosts)

            # ---- a shared part lost: the interior stage's compute process, under four runs in flight ----
            four = [asyncio.ensure_future(run_to_end(served, request(PROMPTS[i], 3, 50))) for i in (1, 2, 5, 7)]
            while hosts[1].node.slots_in_use()[0] < 4 or not all(
                    log.stage.position > 10 for log in hosts[1].node.active_runs()):
                await asyncio.sleep(0.05)
            os.kill(hosts[1].ctl.proc.pid, signal.SIGKILL)
            outcomes = [(await f)[-1].finished for f in four]
            assert [(r.outcome, r.reason) for r in outcomes] == [(opb.RUN_OUTCOME_FAULTED, "RUN_FAULT_WORKER_CRASHED")] * 4
            for ups in [await f for f in four]:
                assert sum(u.HasField("event") and u.event.kind == pb.RUN_FAULTED for u in ups) == 1
            assert_idle(hosts)
            while not hosts[1].node.available:  # the compute process restarted
                await asyncio.sleep(0.1)
            after = await run_to_end(served, request(PROMPTS[5], 3, 6))
            assert after[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED
            assert_reference(after[-1].finished, PROMPTS[5])
            ops = [op for d in drivers.values() for op, _ in d.calls]
            assert ops.count("send") == ops.count("recv") and ops.count("stop") == 2 * ops.count("send")

    asyncio.run(body())
