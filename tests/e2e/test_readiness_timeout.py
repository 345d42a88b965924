"""A local cluster whose stages cannot be ready in time: the run faults with the spec's
RUN_FAULT_READINESS_TIMEOUT instead of hanging for the production 600 s, the StopRun that follows
abandons the weight fetch or load still in flight (no WEIGHTS_LOADED), the node is provisionable again and
`swactor demo`'s summary names the fault."""

from __future__ import annotations

import contextlib
import json
import tomllib
from pathlib import Path

import pytest

from swactor.cli.demo import Printer
from swactor.localcluster import ClusterSpec, LocalCluster, ready
from swactor.localcluster.run import follow
from swactor.v1 import common_pb2 as pb
from swactor.v1.orchestrator_pb2 import SubmitRunRequest
from swactor.v1.orchestrator_pb2_grpc import OrchestratorStub

from .conftest import needs_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), needs_model]


def abandoned_preparation(log: Path) -> str:
    """What the stop abandoned, from the worker's structured events: the weight load (the compute process
    ended it LoadCancelled) or, when the timeout fell while the stage was still fetching its ranges from the
    model server (distribution, docs/distribution.md), the fetch before any load began."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            ev = json.loads(line)
            if isinstance(ev, dict):
                events.append(ev)
    names = [ev.get("event") for ev in events]
    if any(ev.get("event") == "role_load_ended" and ev.get("reason") == "ROLE_FAILURE_LOAD_CANCELLED" for ev in events):
        return "load cancelled"
    if "weights_fetch_started" in names and "role_load_started" not in names and "stage_state" in names:
        return "fetch abandoned before the load"
    raise ready.NotReady(f"no role_load_ended LoadCancelled (and a load was started) in {log}")


def test_readiness_timeout_is_a_run_fault_and_the_stop_abandons_the_load(capsys: pytest.CaptureFixture[str]) -> None:
    # 0.5 s without progress: the stage must compile its graphs (graph_cache = false), and one layer graph alone takes
    # seconds to compile on a CPU with no progress event inside it. (With the host's graph cache warm, a load reports
    # progress every few layers and never stalls 0.5 s: the readiness budget rightly lets it finish.)
    spec = ClusterSpec(hosts=1, netns=False, readiness_timeout_s=0.5, compute_threads=1,
                       workers={0: {"graph_cache": False}})
    with LocalCluster(spec) as cluster:
        cfg = tomllib.loads(cluster.hosts[0].config_path.read_text())
        assert cfg["orchestrator"]["readiness_timeout_s"] == 0.5 and cfg["worker"]["compute_threads"] == 1
        with cluster.channel() as ch:
            stub = OrchestratorStub(ch)
            res = follow(stub, SubmitRunRequest(prompt="Once upon a time", raw=True, stages=1, max_tokens=3),
                         timeout_s=120)
            assert res.finished is not None
            assert res.outcome == "faulted" and res.finished.reason == "RUN_FAULT_READINESS_TIMEOUT", res.summary()
            assert "not ready within 0.5s" in res.finished.detail
            kinds = [e.kind for e in res.events]
            assert pb.RUN_FAULTED in kinds and pb.RUN_TORN_DOWN in kinds, kinds
            assert res.finished.torn_down_us > 0
            assert pb.WEIGHTS_LOADED not in kinds, "the stop waited for the load instead of abandoning it"
            assert res.token_ids == []
            ready.wait_for("pool after the faulted run", lambda: ready.pool_ready(stub, set(cluster.node_ids)), 30)
        # the worker dropped what was in flight: the load (the compute process's event) or the fetch before it
        ready.wait_for("the preparation abandoned", lambda: abandoned_preparation(cluster.service("h0/worker").log), 60)
    Printer(as_json=False).summary(res, hosts=1, stages=1)
    err = capsys.readouterr().err
    assert "outcome: faulted (RUN_FAULT_READINESS_TIMEOUT)" in err and "not ready within 0.5s" in err, err
