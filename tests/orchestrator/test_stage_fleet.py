"""StageControlFleet: the ProvisionStage messages pass the worker's own plan validation, and a whole
run drives a StageControl server over real mutual TLS (a scripted servicer stands in for the nodes)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path

import grpc
import pytest

from swactor.common import control_tls
from swactor.common.sampling import SamplingPolicy
from swactor.orchestrator.fleet.fleet import FleetError
from swactor.orchestrator.fleet.stage_fleet import StageControlFleet, mtls_channels, provision_request
from swactor.orchestrator.planning.planner import plan_run
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import stage_pb2, stage_pb2_grpc
from swactor.worker import plan as worker_plan

from .fakes import FakeFleet
from .harness import serving
from .helpers import model_facts, node

pytestmark = pytest.mark.timeout(60)
SECRET = b"stage fleet test secret 32 bytes"
ORCH = 900


@pytest.mark.parametrize("stages", [1, 3])
def test_provision_requests_pass_the_worker_validation(stages: int) -> None:
    ids = itertools.count(500)
    plan = plan_run(run_id=7, model=model_facts(), pool=tuple(node(i) for i in (1, 2, 3)), stages=stages,
                    max_tokens=8, prompt_tokens=5, sampling=SamplingPolicy(temperature=0.7, top_k=40, top_p=0.9, seed=3),
                    orchestrator_node_id=ORCH, id_source=lambda: next(ids))
    for stage in plan.stages:
        req = provision_request(plan, stage, Path("/models/m.gguf"))
        built = worker_plan.build_plan(req, node_id=stage.node_id, role_id=1)
        assert (built.run_id, built.stage_index, built.stage_count) == (7, stage.stage_index, stages)
        assert built.inbound.edge_id == stage.inbound_edge and built.outbound.edge_id == stage.outbound_edge
        last = stage.stage_index == stages - 1
        assert req.runtime.HasField("sampling") == last
        if last:
            assert req.outbound.consumer_node_id == ORCH and built.role_config["sampling"]["top_k"] == 40
        if stage.stage_index == 0:
            assert req.inbound.producer_node_id == ORCH


def test_a_url_source_s_source_url_reaches_each_stage_s_fetch() -> None:
    """GgufSource.source_url (the distributor sets it for a URL source) -> ProvisionStage -> the worker's FetchRequest."""
    plan = plan_run(run_id=7, model=model_facts(), pool=(node(1), node(2)), stages=2, max_tokens=8, prompt_tokens=5,
                    sampling=SamplingPolicy(), orchestrator_node_id=ORCH)
    src = stage_pb2.GgufSource(url="https://10.0.0.1:7442/v1/files/" + "a" * 64, sha256="a" * 64,
                               manifest_sha256="b" * 64, size=1000, source_url="https://hub.example/m.gguf")
    for stage in plan.stages:
        built = worker_plan.build_plan(provision_request(plan, stage, src), node_id=stage.node_id, role_id=1)
        assert built.fetch is not None and built.fetch.source_url == "https://hub.example/m.gguf"
        assert built.fetch.url == src.url


def test_the_kv_dtype_reaches_each_stage_s_role_config() -> None:
    """[orchestrator].kv_dtype -> RunPlan -> StageRuntimeFacts.kv_dtype -> the worker's role config (StageModel's)."""
    for kv_dtype in ("float16", "float32"):
        plan = plan_run(run_id=7, model=model_facts(), pool=(node(1), node(2)), stages=2, max_tokens=8,
                        prompt_tokens=5, sampling=SamplingPolicy(), orchestrator_node_id=ORCH, kv_dtype=kv_dtype)
        for stage in plan.stages:
            req = provision_request(plan, stage, Path("/models/m.gguf"))
            assert req.runtime.kv_dtype == kv_dtype
            assert worker_plan.build_plan(req, node_id=stage.node_id, role_id=1).role_config["kv_dtype"] == kv_dtype


class ScriptedStageControl(stage_pb2_grpc.StageControlServicer):
    """One node that accepts, loads, reports ready and stops when told (or refuses, if `reject`)."""

    def __init__(self, node_id: int, reject: bool, log: list, tearing_down: int = 0, stop_answer_s: float = 0.0) -> None:
        self.node_id = node_id
        self.reject = reject
        self.log = log
        self.tearing_down = tearing_down  # ABORTED answers first: a stage still tearing an earlier run down
        self.request: stage_pb2.ProvisionStageRequest | None = None
        self.stopped = asyncio.Event()
        self.stop_answer_s = stop_answer_s  # StopRun answers this long after the watch reported StageStopped

    async def ProvisionStage(self, request, context):
        self.log.append(("provision", self.node_id, control_tls.peer_orchestrator(context.auth_context())))
        if self.reject:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "another run is active")
        if self.tearing_down:
            self.tearing_down -= 1
            await context.abort(grpc.StatusCode.ABORTED, "run 1 is still tearing down here")
        self.request = request
        return stage_pb2.ProvisionStageResponse(run_id=request.run_id, node_id=self.node_id,
                                                stage_index=request.stage_index)

    async def StopRun(self, request, context):
        self.log.append(("stop", self.node_id, control_tls.peer_orchestrator(context.auth_context())))
        self.stopped.set()
        if self.stop_answer_s:
            await asyncio.sleep(self.stop_answer_s)
            self.log.append(("stop answered", self.node_id, None))  # not reached if the caller cancelled the call
        return stage_pb2.StopStageRunResponse(known=True)

    async def WatchStage(self, request, context):
        req = self.request
        base = dict(run_id=req.run_id, node_id=self.node_id, stage_index=req.stage_index, time_us=5)
        yield stage_pb2.StageUpdate(event=pb.LifecycleEvent(kind=pb.WEIGHTS_LOADED, counters={"layers": 2}), **base)
        yield stage_pb2.StageUpdate(ready=stage_pb2.StageReady(), **base)
        await self.stopped.wait()
        yield stage_pb2.StageUpdate(stopped=stage_pb2.StageStopped(), **base)


async def _with_nodes(tmp_path: Path, reject: set[int], tokens: list[int], tearing_down: dict[int, int] | None = None,
                      stop_answer_s: float = 0.0):
    log: list = []
    servers, members, requests = [], [], []
    for node_id in (1, 2):
        servicer = ScriptedStageControl(node_id, node_id in reject, log, (tearing_down or {}).get(node_id, 0),
                                        stop_answer_s)
        server = grpc.aio.server()
        stage_pb2_grpc.add_StageControlServicer_to_server(servicer, server)
        port = server.add_secure_port("127.0.0.1:0", control_tls.server_credentials(SECRET, node_id))
        await server.start()
        servers.append(server)
        requests.append(servicer)
        members.append(dataclasses.replace(node(node_id), control_endpoint=f"127.0.0.1:{port}"))
    fleet = StageControlFleet(mtls_channels(SECRET, ORCH), lambda plan, report: Path("/models/m.gguf"),
                              endpoints=_Endpoints(FakeFleet(tokens)))
    try:
        async with serving(tmp_path, fleet, members) as s:
            await asyncio.sleep(0.06)
            resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, stages=2, max_tokens=5))
            updates = [u async for u in s.stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id))]
            return log, [r.request for r in requests], updates
    finally:
        for server in servers:
            await server.stop(0.5)


class _Endpoints:
    def __init__(self, fake: FakeFleet) -> None:
        self.fake = fake

    async def open(self, plan, report):
        return await self.fake.open_endpoints(plan, report)


def test_a_run_over_mtls_stage_control(tmp_path: Path) -> None:
    log, requests, updates = asyncio.run(asyncio.wait_for(_with_nodes(tmp_path, set(), [100, 101, 2]), 30))
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_COMPLETED and list(final.token_ids) == [100, 101, 2]
    assert [(r.node_id, r.stage_index) for r in requests] == [(1, 0), (2, 1)]
    # the nodes saw the orchestrator identity in the client certificate, for provisioning and stop
    assert sorted(log) == [("provision", 1, ORCH), ("provision", 2, ORCH), ("stop", 1, ORCH), ("stop", 2, ORCH)]
    kinds = [pb.LifecycleEventKind.Name(u.event.kind) for u in updates if u.HasField("event")]
    assert kinds.count("WEIGHTS_LOADED") == 2 and kinds.count("STAGE_READY") == 2
    assert kinds.count("STAGE_STOPPED") == 2 and kinds[-1] == "RUN_TORN_DOWN"
    relayed = [u.event for u in updates if u.HasField("event") and u.event.kind == pb.WEIGHTS_LOADED]
    assert {(e.node_id, e.stage_index, e.counters["layers"]) for e in relayed} == {(1, 0, 2), (2, 1, 2)}


def test_a_stop_answered_after_the_stage_stopped_is_not_cut_off(tmp_path: Path) -> None:
    """The watch ends on StageStopped, which a node may send before its StopRun answer: closing the watch's channel
    then must not cancel the StopRun still in flight on it."""
    log, _, updates = asyncio.run(asyncio.wait_for(_with_nodes(tmp_path, set(), [5, 2], stop_answer_s=0.1), 30))
    assert updates[-1].finished.outcome == opb.RUN_OUTCOME_COMPLETED
    assert sorted(e for e in log if e[0] == "stop answered") == [("stop answered", 1, None), ("stop answered", 2, None)]


def test_a_refusing_node_faults_the_run_by_name(tmp_path: Path) -> None:
    log, _, updates = asyncio.run(asyncio.wait_for(_with_nodes(tmp_path, {2}, [2]), 30))
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_FAULTED and final.reason == "RUN_FAULT_PROVISIONING_REJECTED"
    assert "FAILED_PRECONDITION: another run is active" in final.detail and "node 2" in final.detail
    assert [pb.LifecycleEventKind.Name(u.event.kind) for u in updates if u.HasField("event")][-1] == "RUN_TORN_DOWN"
    assert ("stop", 1, ORCH) in log and ("stop", 2, ORCH) not in log  # only the accepted stage is stopped


def test_a_node_still_tearing_down_is_asked_again_and_the_run_completes(tmp_path: Path) -> None:
    log, _, updates = asyncio.run(asyncio.wait_for(_with_nodes(tmp_path, set(), [7, 2], {2: 3}), 30))
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_COMPLETED and list(final.token_ids) == [7, 2], final
    assert log.count(("provision", 2, ORCH)) == 4 and log.count(("provision", 1, ORCH)) == 1


def test_unreachable_node_is_node_unavailable() -> None:
    async def main():
        plan = plan_run(run_id=7, model=model_facts(), pool=(node(1),), stages=1, max_tokens=8, prompt_tokens=5,
                        sampling=SamplingPolicy(), orchestrator_node_id=ORCH)
        stage = plan.stages[0]
        unreachable = dataclasses.replace(stage, node=dataclasses.replace(stage.node, control_endpoint="127.0.0.1:1"))
        made, closed = [], []

        def channels(stage):
            ch = mtls_channels(SECRET, ORCH)(stage)
            made.append(ch)
            close = ch.close

            async def tracked_close(grace=None):
                closed.append(ch)
                await close(grace)

            ch.close = tracked_close
            return ch

        fleet = StageControlFleet(channels, lambda p, r: Path("/m.gguf"), call_timeout_s=3)
        with pytest.raises(FleetError) as err:
            await fleet.provision(plan, unreachable, lambda inp: None)
        # no watch will ever close it: a channel kept would reconnect when the node is back, and hold that
        assert made and closed == made
        return err.value

    err = asyncio.run(main())
    assert err.reason == pb.RUN_FAULT_NODE_UNAVAILABLE and "UNAVAILABLE" in err.detail


def test_a_connect_that_failed_is_waited_for_once_before_the_run_faults() -> None:
    """The node's control port answers only after the first connect failed (a SYN lost twice over a lossy link
    looks the same to the orchestrator): the ProvisionStage that never left waits for the next connect and goes."""

    class Log:
        def __init__(self) -> None:
            self.retried = asyncio.Event()

        def info(self, event: str, **kw) -> None:
            if event == "provision_retried":
                self.retried.set()

        warning = error = info

    async def main():
        import socket

        with socket.socket() as s:  # a port nothing listens on yet: connection refused
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        plan = plan_run(run_id=7, model=model_facts(), pool=(node(1),), stages=1, max_tokens=8, prompt_tokens=5,
                        sampling=SamplingPolicy(), orchestrator_node_id=ORCH)
        stage = plan.stages[0]
        stage = dataclasses.replace(stage, node=dataclasses.replace(stage.node, control_endpoint=f"127.0.0.1:{port}"))
        fleet = StageControlFleet(mtls_channels(SECRET, ORCH), lambda p, r: Path("/m.gguf"), call_timeout_s=30)
        fleet.log = log = Log()
        provisioning = asyncio.ensure_future(fleet.provision(plan, stage, lambda inp: None))
        await asyncio.wait_for(log.retried.wait(), 10)  # the first call failed to connect
        servicer = ScriptedStageControl(1, False, [])
        server = grpc.aio.server()
        stage_pb2_grpc.add_StageControlServicer_to_server(servicer, server)
        server.add_secure_port(f"127.0.0.1:{port}", control_tls.server_credentials(SECRET, 1))
        await server.start()
        try:
            await asyncio.wait_for(provisioning, 20)
            assert servicer.request is not None and servicer.request.run_id == 7  # sent once, after the connect
            await fleet.stop_stage(plan, stage)
        finally:
            await server.stop(0.5)

    asyncio.run(main())
