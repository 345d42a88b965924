"""Placement by measured compute speed, end to end on a real 2-host local cluster on the CPU: host 1's worker and
compute process are held to 15 % of one CPU while the first run decodes (a cgroup CPU quota: they are really
slower, nothing is injected into the planner). The first 2-stage run finds no host measured and splits the blocks evenly; its decode steps
measure each host's time per layer, which the workers gossip (NodeMetadata.step_us_per_layer); `swactor nodes` then
shows both, the dry run predicts each stage's compute from them, and the next run, placed on those figures, gives
the slow host fewer blocks. Both runs' greedy tokens equal llama.cpp's."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from swactor.cli.render import node_line, plan_lines
from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.ready import NotReady, wait_for
from swactor.localcluster.run import RunResult, follow
from swactor.v1 import common_pb2, orchestrator_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb
from tests.harness.cpu_quota import CpuQuota, unavailable
from tests.harness.procs import group_members

from .conftest import needs_model
from .test_pipeline import fixture_case

WHY = unavailable() if os.geteuid() == 0 else "needs root (a cgroup CPU quota)"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_model, pytest.mark.skipif(WHY is not None, reason=str(WHY))]
SLOW_SHARE = 0.15  # of one CPU, for host 1's worker and its compute process together
TOKENS = 12  # 11 decode steps per stage: more than the 5 a host needs to say its speed


def run(stub: orchestrator_pb2_grpc.OrchestratorStub, prompt: list[int],
        on_update: Callable[[opb.RunUpdate, RunResult], None] = lambda u, r: None) -> RunResult:
    res = follow(stub, opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=prompt), stages=2, max_tokens=TOKENS,
                                            ignore_eos=True), on_update, timeout_s=240)
    assert res.finished is not None
    assert res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, (res.finished.reason, res.finished.detail)
    return res


def blocks(res: RunResult) -> dict[int, int]:
    assert res.finished is not None
    return {p.node_id: p.layer_end_exclusive - p.layer_start for p in res.finished.placement}


def test_a_host_measured_slower_gets_fewer_blocks_in_the_next_run() -> None:
    case, n = fixture_case("Write a Python function that reverses a string.", chat=True)
    assert n >= TOKENS
    want = case["greedy_tokens"][:TOKENS]
    spec = ClusterSpec(hosts=2, netns=False, orchestrator={"pool_timeout_s": 20.0, "teardown_timeout_s": 20.0,
                                                           "prefill_chunk": 16})
    with LocalCluster(spec, progress=lambda line: print(line, flush=True)) as cluster, \
            CpuQuota(f"swactor-slow-host-{os.getpid()}", SLOW_SHARE) as quota:
        h0, h1 = cluster.node_ids

        def slow_down(u: opb.RunUpdate, _res: RunResult) -> None:
            """Once host 1's stage is ready (its weights loaded and graphs compiled at full speed: a compile four
            times as long proves nothing), its worker service and compute process go under the quota for the run's
            steps."""
            if u.HasField("event") and u.event.kind == common_pb2.STAGE_READY and u.event.node_id == h1:
                for pid in group_members(cluster.service("h1/worker").pid):
                    quota.add(pid)

        with cluster.channel() as ch:
            stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
            first = run(stub, case["prompt_tokens"], slow_down)
            assert len(quota.pids()) >= 2, quota.pids()  # the worker service and the compute process it started
            assert blocks(first) == {h0: 15, h1: 15}  # nobody measured yet: the balanced split
            assert first.token_ids == want

            def measured() -> dict[int, opb.Node]:
                nodes = {n.node_id: n for n in stub.ListNodes(opb.ListNodesRequest(), timeout=5).nodes}
                if not (nodes[h0].ms_per_layer and nodes[h1].ms_per_layer):
                    raise NotReady(f"ms per layer at the orchestrator: {[nodes[h].ms_per_layer for h in (h0, h1)]}")
                return nodes

            nodes = wait_for("both hosts' speed gossiped", measured, 30)
            for h in (h0, h1):
                assert f"{nodes[h].ms_per_layer:.3f} ms/layer" in node_line(nodes[h])
            dry = stub.Plan(opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=case["prompt_tokens"]), stages=2,
                                                 max_tokens=TOKENS), timeout=10)
            assert dry.split == "speed" and dry.HasField("compute_ms_per_token")
            lines = plan_lines(dry)
            for s in dry.placement:
                assert s.ms_per_layer == nodes[s.node_id].ms_per_layer and s.HasField("compute_ms")
            # The placement is decided on what was measured: host 1 has its CPU back for the next run's load (its new
            # split's graphs) and steps; it says its speed again, which later placements would follow.
            quota.close()
            second = run(stub, case["prompt_tokens"])
            split = blocks(second)
            # the dry run predicted this very placement
            assert {s.node_id: s.layer_end_exclusive - s.layer_start for s in dry.placement} == split
            assert nodes[h1].ms_per_layer > nodes[h0].ms_per_layer, nodes
            assert split[h1] < 15 < split[h0], split
            assert second.token_ids == want
    print(f"ms/layer: host 0 {nodes[h0].ms_per_layer:.3f}, host 1 (quota {SLOW_SHARE} CPU) "
          f"{nodes[h1].ms_per_layer:.3f}; blocks then {split[h0]} + {split[h1]}; the first run decoded "
          f"{first.decode_tok_s or 0:.1f} tok/s with host 1 under the quota")
    print("\n".join(lines))
