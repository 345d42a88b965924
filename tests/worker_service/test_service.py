"""StageControl over real gRPC/TCP with mutual TLS from the cluster secret; node ports are fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from swactor.common import control_tls
from swactor.common.grpcio import create_server
from swactor.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from swactor.worker.node import StageNode
from swactor.worker.service import SERVICE_NAME, StageControlServicer
from swactor.worker.stage_fsm import StageState

from .node_fakes import FakeArenaPort, FakeCtl, FakeDriverPort, FakeMembership
from .plans import provision

pytestmark = pytest.mark.timeout(60)

SECRET = b"0123456789abcdef-cluster-secret"
NODE, ORCH = 5, 1


async def serve(fn: Callable[[Any, StageNode, FakeMembership], Awaitable[None]], *, ctl: FakeCtl | None = None,
                pinned: int | None = None, lease_window_s: float = 5.0) -> None:
    ctl = ctl or FakeCtl()
    membership = FakeMembership()
    node = StageNode(NODE, ctl, FakeArenaPort(), FakeDriverPort(), membership, control_endpoint="127.0.0.1:1",
                     orchestrator_node_id=pinned, lease_window_s=lease_window_s)
    server, port, _ = create_server(tcp_address="127.0.0.1:0", service_names=[SERVICE_NAME],
                                    server_credentials=control_tls.server_credentials(SECRET, NODE),
                                    options=control_tls.keepalive_options(server=True))
    stage_pb2_grpc.add_StageControlServicer_to_server(StageControlServicer(node), server)
    await server.start()
    await node.start()
    try:
        await fn(port, node, membership)
    finally:
        await server.stop(None)
        await node.close()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def stub(port: int, *, secret: bytes = SECRET, orch: int = ORCH, node: int = NODE) -> tuple[Any, Any]:
    ch = control_tls.channel(secret, orch, f"127.0.0.1:{port}", node)
    return ch, stage_pb2_grpc.StageControlStub(ch)


async def updates(s: Any, run_id: int, until: str) -> list[stage_pb2.StageUpdate]:
    out = []
    async for u in s.WatchStage(stage_pb2.WatchStageRequest(run_id=run_id), timeout=20):
        out.append(u)
        if u.WhichOneof("update") == until:
            break
    return out


def test_provision_ready_stop_and_warm_second_run() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()  # let WorkerReady and the membership report land
        assert node.available and membership.states == ["available:127.0.0.1:1"]
        ch, s = stub(port)
        async with ch:
            resp = await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=77))
            assert (resp.run_id, resp.node_id, resp.stage_index) == (77, NODE, 1)
            ups = await updates(s, 77, "ready")
            kinds = [common_pb2.LifecycleEventKind.Name(u.event.kind) for u in ups if u.HasField("event")]
            assert kinds[:2] == ["STAGE_PROVISION_STARTED", "EDGE_PROVISION_STARTED"]
            assert {"WEIGHTS_LOAD_PROGRESS", "WEIGHTS_LOADED", "EDGE_READY"} <= set(kinds)
            assert ups[-1].ready.warm_weights is False and all(u.run_id == 77 and u.node_id == NODE for u in ups)
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=78))
            assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # active, not tearing down: no retry
            with pytest.raises(grpc.aio.AioRpcError) as dup:
                await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=77))
            assert dup.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=77))).known
            ups = await updates(s, 77, "stopped")  # replay from the start, ends after StageStopped
            assert ups[-1].HasField("stopped")
            assert not (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=12345))).known
            await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=78))
            ups = await updates(s, 78, "ready")
            assert ups[-1].ready.warm_weights is True
            with pytest.raises(grpc.aio.AioRpcError) as nf:
                await updates(s, 999, "ready")
            assert nf.value.code() == grpc.StatusCode.NOT_FOUND

    asyncio.run(serve(body))


def test_rejections() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            for req, code in [
                (provision(node_id=NODE + 1, orchestrator=ORCH), grpc.StatusCode.PERMISSION_DENIED),
                (provision(node_id=NODE, orchestrator=ORCH + 1), grpc.StatusCode.PERMISSION_DENIED),
                (provision(node_id=NODE, orchestrator=ORCH, layers=(15, 29)), grpc.StatusCode.INVALID_ARGUMENT),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await s.ProvisionStage(req)
                assert info.value.code() == code, info.value.details()
        ch, s = stub(port, orch=ORCH + 7)  # a valid orchestrator certificate, but not the pinned one
        async with ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH + 7))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "authorised orchestrator" in (info.value.details() or "")

    asyncio.run(serve(body, pinned=ORCH))


def test_stop_and_watch_only_from_the_orchestrator_that_provisioned_the_run() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        ch, s = stub(port)
        other_ch, other = stub(port, orch=ORCH + 3)  # holds the cluster secret, names another orchestrator
        async with ch, other_ch:
            await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH, run_id=77))
            await updates(s, 77, "ready")
            for call in (other.StopRun(stage_pb2.StopStageRunRequest(run_id=77)),
                         updates(other, 77, "ready")):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert f"provisioned by orchestrator {ORCH}" in (info.value.details() or "")
            assert node.runs[77].stage.state is StageState.READY  # untouched
            # a run it does not know: nothing to protect, the usual answers
            assert not (await other.StopRun(stage_pb2.StopStageRunRequest(run_id=12345))).known
            assert (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=77))).known
            assert (await updates(s, 77, "stopped"))[-1].HasField("stopped")

    asyncio.run(serve(body))


def test_tls_refuses_strangers_and_non_orchestrators() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        ch, s = stub(port, secret=b"another-cluster-secret-entirely")
        async with ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await s.StopRun(stage_pb2.StopStageRunRequest(run_id=1), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        ch, s = stub(port, node=NODE + 1)  # the server is node 5, not the node we meant to reach
        async with ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await s.StopRun(stage_pb2.StopStageRunRequest(run_id=1), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        ca, key, cert = control_tls._leaf(SECRET, control_tls.node_name(9), server=False)
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=[
                ("grpc.ssl_target_name_override", control_tls.node_name(NODE))]) as ch:
            s = stage_pb2_grpc.StageControlStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await s.ProvisionStage(provision(node_id=NODE, orchestrator=9), timeout=5)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED

    asyncio.run(serve(body))


def test_weights_failure_is_a_stage_fault() -> None:
    async def body(port: int, node: StageNode, membership: FakeMembership) -> None:
        await settle()
        ch, s = stub(port)
        async with ch:
            await s.ProvisionStage(provision(node_id=NODE, orchestrator=ORCH))
            ups = await updates(s, 77, "fault")
            f = ups[-1].fault
            assert f.reason == common_pb2.RUN_FAULT_WEIGHTS_LOAD_FAILED and f.component == common_pb2.COMPONENT_WORKER
            assert f.cause == "ROLE_FAILURE_WEIGHTS_NOT_FOUND"
            await s.StopRun(stage_pb2.StopStageRunRequest(run_id=77))
            assert (await updates(s, 77, "stopped"))[-1].HasField("stopped")

    asyncio.run(serve(body, ctl=FakeCtl(role_failure=common_pb2.ROLE_FAILURE_WEIGHTS_NOT_FOUND)))
