"""Acceptance: a whole run with real weights. The orchestrator (gRPC API, run FSM, StageControlFleet
over mutual TLS, RingTokenEndpoints) drives a real worker StageNode whose real compute process runs
all 30 layers of SmolLM2 on the CPU. Token and ring bytes move through real ring-rs rings in one
memfd arena, carried host to host by real edge-drivers over QUIC on 127.0.0.1 (in this process).
Left out: the arena-manager (rings come from the harness arena) and membership (a static view)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest

import swactor_ring as sr
from swactor.common import control_tls
from swactor.common.grpcio import create_server
from swactor.orchestrator.fleet.stage_fleet import StageControlFleet, mtls_channels
from swactor.orchestrator.tokens import token_endpoints
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import stage_pb2_grpc
from swactor.worker import ctl as ctl_mod
from swactor.worker import ctl_fsm
from swactor.worker import node as worker_node
from swactor.worker import service as worker_service
from swactor.worker.process import wire
from tests.worker_service import harness, node_fakes

from .harness import serving
from .helpers import GRAPH_CACHE, MODEL_PATH, node
from .inproc_edges import start_drivers, stop_drivers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not MODEL_PATH.exists(), reason="run `make model`")]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_greedy.json"
SECRET = b"pipeline end-to-end test secret!"
ORCH, STAGE_NODE = 900, 2
MAX_TOKENS = 6


class StageHost:
    """One stage node: a real compute process (CPU) behind the real StageControl servicer."""

    def __init__(self, arena, driver, node_id: int) -> None:
        self.node_id = node_id
        core = ctl_fsm.CtlCore(arena.size, sr.RING_VERSION, {"device": "CPU", "graph_cache": str(GRAPH_CACHE)},
                                  init_timeout_s=120, stop_timeout_s=10)
        self.ctl = ctl_mod.GpuWorkerCtl(core, arena.fd, python=sys.executable)
        self.node = worker_node.StageNode(node_id, self.ctl, node_fakes.FakeArenaPort(arena), driver,
                                          node_fakes.FakeMembership(), control_endpoint="127.0.0.1:1",
                                          orchestrator_node_id=ORCH)
        self.server, self.port, _ = create_server(
            tcp_address="127.0.0.1:0", service_names=[worker_service.SERVICE_NAME],
            server_credentials=control_tls.server_credentials(SECRET, node_id),
            options=control_tls.keepalive_options(server=True))
        stage_pb2_grpc.add_StageControlServicer_to_server(worker_service.StageControlServicer(self.node), self.server)

    async def start(self) -> None:
        await self.server.start()
        await self.node.start()

    @property
    def member(self):
        return dataclasses.replace(node(self.node_id), control_endpoint=f"127.0.0.1:{self.port}")

    async def close(self) -> None:
        await self.server.stop(None)
        await self.node.close()
        self.ctl.send(wire.ShutdownWorker("Graceful"))
        await asyncio.wait_for(self.ctl.wait_exited(), 20)
        await self.ctl.close()


async def _pipeline(tmp_path: Path, requests: list[opb.SubmitRunRequest]):
    arena = harness.Arena(64 << 20)
    drivers = await start_drivers(tmp_path, [ORCH, 2, 3], arena.arena)
    hosts = [StageHost(arena, drivers[2], 2), StageHost(arena, drivers[3], 3)]

    async def local_ports():
        return node_fakes.FakeArenaPort(arena), drivers[ORCH], arena.arena

    fleet = StageControlFleet(mtls_channels(SECRET, ORCH), lambda plan, report: MODEL_PATH.resolve(),
                              endpoints=token_endpoints.RingEndpointFactory(local_ports))
    results = []
    try:
        for h in hosts:
            await h.start()
        while not all(h.node.available for h in hosts):
            await asyncio.sleep(0.05)
        async with serving(tmp_path, fleet, [h.member for h in hosts], max_seq_len_cap=64) as s:
            await asyncio.sleep(0.06)
            for req in requests:
                resp = await s.stub.SubmitRun(req)
                results.append([u async for u in s.stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id))])
        return results, [(n, op, e) for n, d in drivers.items() for op, e in d.calls]
    finally:
        for h in hosts:
            await h.close()
        await stop_drivers(drivers)
        arena.close()


QUESTION = "What is the capital of France?"


def test_runs_with_real_weights_one_and_two_stages(tmp_path: Path) -> None:
    chat1 = opb.SubmitRunRequest(prompt=QUESTION, stages=1, max_tokens=MAX_TOKENS, node_ids=[2])
    raw = opb.SubmitRunRequest(prompt=QUESTION, raw=True, stages=1, max_tokens=MAX_TOKENS, node_ids=[2])  # warm
    chat2 = opb.SubmitRunRequest(prompt=QUESTION, stages=2, max_tokens=MAX_TOKENS, node_ids=[2, 3])
    (one, eos, two), calls = asyncio.run(_pipeline(tmp_path, [chat1, raw, chat2]))
    for updates in (one, eos, two):
        final = updates[-1].finished
        assert final.outcome == opb.RUN_OUTCOME_COMPLETED, (final.reason, final.detail)
        kinds = [pb.LifecycleEventKind.Name(u.event.kind) for u in updates if u.HasField("event")]
        for k in ("WEIGHTS_LOADED", "STAGE_READY", "READINESS_BARRIER_PASSED", "PROMPT_INJECTED", "TOKEN_RECEIVED",
                  "RUN_COMPLETED", "STOP_RUN_SENT", "STAGE_STOPPED"):
            assert k in kinds, k
        assert kinds[-1] == "RUN_TORN_DOWN" and not updates[-2].event.reason  # stages + endpoints confirmed
    t1, t2 = list(one[-1].finished.token_ids), list(two[-1].finished.token_ids)
    print(f"1 stage: {t1} {one[-1].finished.text!r}; 2 stages: {t2}; raw: {list(eos[-1].finished.token_ids)}")
    assert len(t1) == MAX_TOKENS and one[-1].finished.reason == "max_tokens"
    assert t2 == t1  # splitting the layers over two nodes does not change the greedy tokens
    assert [p.layer_end_exclusive for p in two[-1].finished.placement] == [15, 30]
    # llama.cpp's first greedy token for the raw prompt is <|im_end|> by a wide margin (1.8 logits):
    # the pipeline agrees and the run ends at once on EOS.
    assert list(eos[-1].finished.token_ids) == [2] and eos[-1].finished.reason == "eos"
    # every edge was established and stopped at both of its hosts (6 edges over 3 runs)
    ops = [op for _, op, _ in calls]
    assert ops.count("send") == ops.count("recv") == 7 and ops.count("stop") == 14
