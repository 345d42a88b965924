"""A host with two stage devices (issue 24 item 2, docs/operations.md "Several GPUs per host"), end to end on a real
2-host local cluster on the CPU: host 0 (the orchestrator's) declares [worker].stage_devices = 2, so its worker runs
two compute processes and the pool has three stage devices on two hosts. A 3-stage run is placed with stages 0 and 1
on host 0's two devices and stage 2 on host 1; its greedy tokens equal the float64 reference, and the edge between
stages 0 and 1 (like the orchestrator's token edge into stage 0) moves its objects inside host 0's edge-driver: no
QUIC connection to the host itself, no datagram."""

from __future__ import annotations

import json

import pytest

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.run import follow
from swactor.v1 import edge_pb2, orchestrator_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb
from tests.worker.reference import Reference

from .conftest import FIXTURE, needs_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_model]

TOKENS = 12
GAP = 0.02


def prompt_ids() -> list[int]:
    """llama.cpp's tokenisation of the fixture's chat prompt."""
    cases = json.loads(FIXTURE.read_text())["cases"]
    return next(c["prompt_tokens"] for c in cases if c["question"].startswith("Write a Python") and c["chat_template"])


def test_two_stages_on_one_host_s_two_devices_give_the_exact_tokens_over_a_local_edge() -> None:
    spec = ClusterSpec(hosts=2, workers={0: {"stage_devices": 2}},
                       orchestrator={"pool_timeout_s": 20.0, "teardown_timeout_s": 20.0, "prefill_chunk": 16})
    with LocalCluster(spec, progress=lambda line: print(line, flush=True)) as cluster:
        h0, h1 = cluster.node_ids
        prompt = prompt_ids()
        with cluster.channel() as ch:
            stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
            nodes = {n.node_id: n for n in stub.ListNodes(opb.ListNodesRequest()).nodes}
            assert (nodes[h0].stage_devices, nodes[h1].stage_devices) == (2, 1)
            res = follow(stub, opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=prompt), stages=3, max_tokens=TOKENS,
                                                    ignore_eos=True), timeout_s=240)
            assert res.finished is not None
            assert res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, (res.finished.reason, res.finished.detail)
            placed = [(p.node_id, p.device_index) for p in sorted(res.finished.placement, key=lambda p: p.stage_index)]
            assert placed == [(h0, 0), (h0, 1), (h1, 0)], placed  # the host's devices filled before crossing
            want, gaps = Reference(str(spec.model.resolve())).greedy(prompt, TOKENS)
            binding = next((i + 1 for i, g in enumerate(gaps) if g < GAP), TOKENS)
            assert res.token_ids[:binding] == want[:binding], (res.token_ids, want, binding)
            metrics = {n.node_id: n.host for n in stub.GetPoolMetrics(opb.GetPoolMetricsRequest()).nodes}
        local_edge = res.finished.placement[0].outbound_edge_id
        status = cluster.edge_status(0)
        assert not [c for c in status.connections if c.peer_node_id == h0], "a QUIC connection from host 0 to itself"
        assert not [t for t in metrics[h0].traffic if t.peer_node_id == h0 and (t.sent_datagrams or t.received_datagrams)]
        assert [t for t in metrics[h0].traffic if t.peer_node_id == h1 and t.sent_datagrams]  # stage 1 -> stage 2: QUIC
        # the local edge's ends both live in host 0's driver while the run is up; afterwards every lease is released
        assert local_edge not in {e.edge_id for e in status.edges}
        leases = [lease for lease in cluster.arena_stats(0).leases if lease.edge_id == local_edge]
        assert not leases, leases
        sent_local = [t for t in metrics[h0].transfers if t.peer_node_id == h0 and t.role == edge_pb2.EDGE_ROLE_SEND]
        print(f"placement {placed}; tokens {res.token_ids}; local objects {[t.objects for t in sent_local]}; "
              f"TTFT {res.ttft_s:.2f} s, decode {res.decode_tok_s:.2f} tok/s")
