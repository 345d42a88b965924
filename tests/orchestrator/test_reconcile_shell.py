"""Restart reconciliation against real node control code: a run provisioned by a previous
orchestrator process on two real `swactor.worker` StageNodes (behind their real StageControl
servicer, mutual TLS) is found in the store, stopped with StopRun, confirmed by WatchStage and
recorded torn down; the nodes are masked in the view until then. Below the nodes: the worker's fakes."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from swactor.common import control_tls
from swactor.common.grpcio import create_server
from swactor.orchestrator.fleet import reconcile as R
from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState
from swactor.orchestrator.fleet.reconcile_shell import MtlsControl, ReconcileShell
from swactor.orchestrator.runs.store import RunStore
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import stage_pb2_grpc
from swactor.worker import node as worker_node
from swactor.worker import service as worker_service
from swactor.worker.stage_fsm import StageState
from tests.worker_service import node_fakes
from tests.worker_service.plans import provision

from .helpers import node

pytestmark = pytest.mark.timeout(60)
SECRET = b"orchestrator restart reconciliation secret"
ORCH, RUN = 900, 4242


class FakeLocal:
    def __init__(self, left: str = "") -> None:
        self.left = left
        self.released: list[tuple[int, ...]] = []

    async def orphans(self) -> tuple[int, ...]:
        return (555,)

    async def release_edges(self, edge_ids: tuple[int, ...]) -> str:
        self.released.append(edge_ids)
        return self.left


def interrupted_run(store: RunStore, nodes: list[int]) -> list[opb.Run]:
    run = opb.Run(run_id=RUN, state=opb.RUN_STATE_RUNNING, stages=len(nodes), created_us=1)
    for i, node_id in enumerate(nodes):
        run.placement.add(stage_index=i, node_id=node_id, inbound_edge_id=300 + i, outbound_edge_id=301 + i)
    store.put(run)
    return store.recover(now_us=2)


async def start_nodes(node_ids: list[int]) -> tuple[list[worker_node.StageNode], list, list[NodeInfo]]:
    nodes, servers, members = [], [], []
    for node_id in node_ids:
        stage_node = worker_node.StageNode(node_id, node_fakes.FakeCtl(), node_fakes.FakeArenaPort(),
                                           node_fakes.FakeDriverPort(), node_fakes.FakeMembership(),
                                           control_endpoint="127.0.0.1:1", orchestrator_node_id=ORCH,
                                           lease_window_s=node_fakes.UNLEASED)  # only StopRun may end the run
        server, port, _ = create_server(tcp_address="127.0.0.1:0", service_names=[worker_service.SERVICE_NAME],
                                        server_credentials=control_tls.server_credentials(SECRET, node_id),
            options=control_tls.keepalive_options(server=True))
        stage_pb2_grpc.add_StageControlServicer_to_server(worker_service.StageControlServicer(stage_node), server)
        await server.start()
        await stage_node.start()
        nodes.append(stage_node)
        servers.append(server)
        members.append(dataclasses.replace(node(node_id), control_endpoint=f"127.0.0.1:{port}"))
    return nodes, servers, members


async def provision_as_previous_process(member: NodeInfo, stage_index: int) -> None:
    """What the crashed orchestrator did: ProvisionStage, then it died (its channel is gone)."""
    async with control_tls.channel(SECRET, ORCH, member.control_endpoint, member.node_id) as ch:
        req = provision(node_id=member.node_id, orchestrator=ORCH, run_id=RUN, stage_index=stage_index,
                        layers=(15 * stage_index, 15 * stage_index + 15), in_edge=300 + stage_index,
                        out_edge=301 + stage_index)
        await stage_pb2_grpc.StageControlStub(ch).ProvisionStage(req)


def channel(member: NodeInfo):
    return control_tls.channel(SECRET, ORCH, member.control_endpoint, member.node_id)


def test_restart_stops_the_previous_processes_stages_and_records_the_teardown(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "o.sqlite3")
    (run,) = interrupted_run(store, [11, 12])
    assert run.reason == "RUN_FAULT_ORCHESTRATOR_RESTARTED"
    published: list[tuple[NodeInfo, ...]] = []
    local = FakeLocal()

    async def body() -> None:
        nodes, servers, members = await start_nodes([11, 12])
        try:
            for i, m in enumerate(members):
                await provision_as_previous_process(m, i)
            await node_fakes_wait(lambda: all(any(r.stage.state is StageState.READY for r in n.runs.values()) for n in nodes))
            shell = ReconcileShell(R.Reconciler((R.Leftover.of(run),)), MtlsControl(channel), local, store,
                                   published.append)
            shell.on_view(tuple(members))
            assert [m.state for m in published[-1]] == [NodeState.BOOTING, NodeState.BOOTING]  # busy: masked
            await asyncio.wait_for(shell.run(), 20)
            assert all(r.stage.state is StageState.STOPPED for n in nodes for r in n.runs.values())
            assert [m.state for m in published[-1]] == [NodeState.AVAILABLE, NodeState.AVAILABLE]
        finally:
            for server in servers:
                await server.stop(None)
            for n in nodes:
                await n.close()

    asyncio.run(body())
    assert local.released == [(300, 302, 555)]  # the run's token edges and the arena's orphans
    kinds = [pb.LifecycleEventKind.Name(e.kind) for e in store.events(RUN)]
    assert kinds[0] == "RUN_FAULTED" and kinds[-1] == "RUN_TORN_DOWN"
    assert sorted(kinds[1:-1]) == ["STAGE_STOPPED", "STAGE_STOPPED", "STOP_RUN_SENT", "STOP_RUN_SENT"]
    final = store.events(RUN, pb.RUN_TORN_DOWN)[0]
    assert final.reason == "" and dict(final.counters) == {"stages_stopped": 2, "stages_unconfirmed": 0}
    record = store.get(RUN)
    assert record is not None and record.torn_down_us and record.reason == "RUN_FAULT_ORCHESTRATOR_RESTARTED"


def test_an_unreachable_node_is_retried_until_it_leaves_the_pool(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "o.sqlite3")
    (run,) = interrupted_run(store, [13])
    ghost = dataclasses.replace(node(13), control_endpoint="127.0.0.1:9")  # nobody listens there

    async def body() -> None:
        core = R.Reconciler((R.Leftover.of(run),))
        shell = ReconcileShell(core, MtlsControl(channel), FakeLocal(), store, lambda view: None)
        shell.on_view((ghost,))
        task = asyncio.create_task(shell.run())
        await node_fakes_wait(lambda: core.targets[(RUN, 0)].attempts >= 2)  # retried
        assert not task.done()
        shell.on_view((dataclasses.replace(ghost, state=NodeState.LEFT),))
        await asyncio.wait_for(task, 10)

    asyncio.run(body())
    (ev,) = store.events(RUN, pb.STAGE_STOPPED)
    assert ev.reason == "RUN_FAULT_MEMBERSHIP_LOST"
    assert store.events(RUN, pb.RUN_TORN_DOWN)[0].reason == ""


async def node_fakes_wait(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        while not cond():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(go(), timeout)
