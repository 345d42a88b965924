"""A run's sampling as applied and recorded: a sampled run without a seed gets a random one, recorded and the
one its last stage samples with; an explicit seed (0 included) is kept; greedy draws none; top_p 0 is
recorded as the 1.0 applied."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swactor.orchestrator.fleet.stage_fleet import provision_request
from swactor.orchestrator.runs.run_sampling import SEED_LIMIT, applied, new_seed
from swactor.v1 import orchestrator_pb2 as opb
from swactor.worker import plan as worker_plan

from .fakes import FakeFleet
from .harness import serving
from .helpers import pool
from .test_service import collect

pytestmark = pytest.mark.timeout(60)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def draw_42() -> int:
    return 42


@pytest.mark.parametrize(("requested", "policy", "recorded"), [
    # (temperature, top_k, top_p, seed or None) asked (values exact in float32); (top_p, seed) the sampler gets; the recorded seed or None
    ((0.75, 40, 0.875, None), (0.875, 42), 42),
    ((0.75, 0, 0.0, 0), (1.0, 0), 0),  # an explicit 0 is a seed like any other
    ((0.75, 0, 1.0, 7), (1.0, 7), 7),
    ((0.0, 0, 0.0, None), (1.0, 0), None),  # greedy draws nothing
    ((0.0, 0, 0.5, 3), (0.5, 3), 3),
])
def test_applied_fills_in_the_seed_and_top_p_it_uses(requested, policy, recorded) -> None:
    temperature, top_k, top_p, seed = requested
    got, record = applied(opb.Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed), draw_42)
    assert (got.temperature, got.top_k, got.top_p, got.seed) == (temperature, top_k, *policy)
    assert (record.temperature, record.top_k, record.top_p) == (temperature, top_k, policy[0])
    assert (record.seed if record.HasField("seed") else None) == recorded


def test_new_seeds_are_non_zero_and_below_2_to_the_63() -> None:
    seeds = {new_seed() for _ in range(1000)}
    assert len(seeds) == 1000 and all(0 < s < SEED_LIMIT for s in seeds)


def test_a_sampled_run_without_a_seed_records_the_random_seed_its_sampler_got(tmp_path: Path) -> None:
    fleet = FakeFleet([100, 2])
    sampled = opb.Sampling(temperature=0.8, top_k=40)

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            runs = []
            for n in range(2):
                resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt=f"tell a story {n}", raw=True, max_tokens=5,
                                                                   sampling=sampled, client_request_id=f"story-{n}"))
                runs.append((await collect(s.stub, resp.run_id))[-1].finished)
            again = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="tell a story 0", raw=True, max_tokens=5,
                                                                sampling=sampled, client_request_id="story-0"))
            return runs, again

    runs, again = run(main())
    seeds = [r.sampling.seed for r in runs]
    assert all(r.sampling.HasField("seed") for r in runs)
    assert 0 not in seeds and seeds[0] != seeds[1]  # two draws of 63 bits
    assert again.run_id == runs[0].run_id  # a retry is that run, with that seed
    for record, plan in zip(runs, fleet.plans, strict=True):
        assert plan.run_id == record.run_id and plan.sampling.seed == record.sampling.seed
        last = plan.stages[-1]
        provision = provision_request(plan, last, Path("/models/m.gguf"))
        assert provision.runtime.sampling.seed == record.sampling.seed
        built = worker_plan.build_plan(provision, node_id=last.node_id, role_id=1)
        assert built.role_config["sampling"]["seed"] == record.sampling.seed  # what the compute process samples with


def test_an_explicit_seed_0_stays_0_greedy_draws_none_and_top_p_0_is_recorded_as_applied(tmp_path: Path) -> None:
    fleet = FakeFleet([2])
    asked = [opb.Sampling(temperature=0.8, seed=0), opb.Sampling(), opb.Sampling(temperature=0.5, top_p=0.5, seed=9)]

    async def main():
        async with serving(tmp_path, fleet, pool(1)) as s:
            await asyncio.sleep(0.06)
            runs = []
            for sampling in asked:
                resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=3, sampling=sampling))
                runs.append((await collect(s.stub, resp.run_id))[-1].finished)
            return runs

    zero, greedy, nucleus = (r.sampling for r in run(main()))
    assert zero.HasField("seed") and zero.seed == 0 and zero.top_p == 1.0
    assert not greedy.HasField("seed") and greedy.top_p == 1.0
    assert (nucleus.seed, nucleus.top_p) == (9, 0.5)
    assert [(p.sampling.seed, p.sampling.top_p) for p in fleet.plans] == [(0, 1.0), (0, 1.0), (9, 0.5)]
