"""A node with several stage devices (worker/devices.py): device names, one control API routing to each device's
StageNode over real gRPC with mutual TLS (node ports are fakes), and the node's one membership state."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from swactor.common import control_tls
from swactor.common.config import ConfigError
from swactor.common.grpcio import create_server
from swactor.v1 import stage_pb2, stage_pb2_grpc
from swactor.worker.ctl_fsm import CtlState, WorkerCrashed
from swactor.worker.devices import DeviceMembership, StageDevices, stage_device_names
from swactor.worker.node import StageNode
from swactor.worker.service import SERVICE_NAME, StageControlServicer

from .node_fakes import FakeArenaPort, FakeCtl, FakeDriverPort, FakeMembership
from .plans import provision

pytestmark = pytest.mark.timeout(60)

SECRET = b"0123456789abcdef-cluster-secret"
NODE, ORCH = 5, 1


@pytest.mark.parametrize(("device", "count", "gpus", "names"), [
    ("CUDA", 0, 4, ["CUDA:0", "CUDA:1", "CUDA:2", "CUDA:3"]),
    ("CUDA", 0, 1, ["CUDA"]),
    ("CUDA", 2, 4, ["CUDA:0", "CUDA:1"]),
    ("CUDA:3", 0, 4, ["CUDA:3"]),
    ("CPU", 0, 0, ["CPU"]),
    ("CPU", 3, 0, ["CPU", "CPU", "CPU"]),
    ("AMD", 2, 0, ["AMD:0", "AMD:1"]),
])
def test_stage_device_names(device: str, count: int, gpus: int, names: list[str]) -> None:
    assert stage_device_names(device, count, gpus) == names


def test_stage_device_names_refuse_an_indexed_device_for_several() -> None:
    with pytest.raises(ConfigError, match=r"stage_devices = 2 with \[worker\].device = 'CUDA:1'.*CUDA:0..CUDA:1"):
        stage_device_names("CUDA:1", 2, 4)
    with pytest.raises(ConfigError, match="must be >= 0"):
        stage_device_names("CPU", -1, 0)


def two_devices(membership: FakeMembership) -> tuple[StageDevices, list[FakeCtl]]:
    per_device = DeviceMembership(membership, 2)
    ctls = [FakeCtl(), FakeCtl()]
    nodes = [StageNode(NODE, ctl, FakeArenaPort(), FakeDriverPort(), per_device.device(i),
                       control_endpoint="127.0.0.1:1", device_index=i) for i, ctl in enumerate(ctls)]
    return StageDevices(nodes), ctls


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_two_stages_of_one_run_on_two_devices_are_routed_by_stage() -> None:
    async def body() -> None:
        membership = FakeMembership()
        devices, _ = two_devices(membership)
        server, port, _ = create_server(tcp_address="127.0.0.1:0", service_names=[SERVICE_NAME],
                                        server_credentials=control_tls.server_credentials(SECRET, NODE),
                                        options=control_tls.keepalive_options(server=True))
        stage_pb2_grpc.add_StageControlServicer_to_server(StageControlServicer(devices), server)
        await server.start()
        try:
            await devices.nodes[0].start()
            await settle()
            assert devices.nodes[0].available and membership.states == []  # one device ready is not the node ready
            await devices.nodes[1].start()
            await settle()
            assert membership.states == ["available:127.0.0.1:1"] and membership.generations == [2]
            async with control_tls.channel(SECRET, ORCH, f"127.0.0.1:{port}", NODE) as ch:
                s = stage_pb2_grpc.StageControlStub(ch)
                # stages 0 and 1 of run 7 on devices 0 and 1; the edge 102 between them is local to the node
                first = provision(node_id=NODE, orchestrator=ORCH, run_id=7, stage_index=0, stage_count=3,
                                  layers=(0, 10), in_edge=101, out_edge=102, role_id=1)
                second = provision(node_id=NODE, orchestrator=ORCH, run_id=7, stage_index=1, stage_count=3,
                                   layers=(10, 20), in_edge=102, out_edge=103, role_id=2)
                second.inbound.producer_node_id = NODE
                first.outbound.consumer_node_id = NODE
                second.device_index = 1
                await s.ProvisionStage(first)
                await s.ProvisionStage(second)
                assert [n.runs[7].stage_index for n in devices.nodes] == [0, 1]
                with pytest.raises(grpc.aio.AioRpcError) as bad:
                    third = provision(node_id=NODE, orchestrator=ORCH, run_id=8, stage_index=0, stage_count=3)
                    third.device_index = 2
                    await s.ProvisionStage(third)
                assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "device_index 2: this node has 2 stage device(s)" in (bad.value.details() or "")

                async def until_ready(stage: int) -> list[stage_pb2.StageUpdate]:
                    out = []
                    async for u in s.WatchStage(stage_pb2.WatchStageRequest(run_id=7, stage_index=stage), timeout=20):
                        out.append(u)
                        if u.WhichOneof("update") == "ready":
                            return out
                    raise AssertionError("no ready")

                for stage in (0, 1):
                    assert {u.stage_index for u in await until_ready(stage)} == {stage}
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    async for _ in s.WatchStage(stage_pb2.WatchStageRequest(run_id=7, stage_index=2), timeout=5):
                        pass
                assert missing.value.code() == grpc.StatusCode.NOT_FOUND
                stopped = await s.StopRun(stage_pb2.StopStageRunRequest(run_id=7, stage_index=1))
                assert stopped.known
                await settle()
                assert not devices.nodes[1].runs[7].active and devices.nodes[0].runs[7].active
                assert (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=7))).known  # the rest of the run
                await settle()
                assert not any(n.runs[7].active for n in devices.nodes)
        finally:
            await server.stop(None)
            for node in devices.nodes:
                await node.close()

    asyncio.run(body())


def test_the_node_is_faulted_while_any_device_is_and_available_again_after() -> None:
    async def body() -> None:
        membership = FakeMembership()
        devices, ctls = two_devices(membership)
        for node in devices.nodes:
            await node.start()
        await settle()
        assert membership.states == ["available:127.0.0.1:1"]
        ctls[1].state = CtlState.FAILED
        ctls[1]._emit(WorkerCrashed(1, -9, "killed"))  # device 1's compute process died: the node restarts it
        await settle()
        assert membership.states[1].startswith("faulted:")
        await settle()
        assert membership.states[-1] == "available:127.0.0.1:1" and membership.generations[-1] == 3
        for node in devices.nodes:
            await node.close()

    asyncio.run(body())
