"""A stage node with the real GpuWorkerCtl and compute process (real weights, real memfd rings):
provision -> StageReady; warm second run; SIGKILL -> WorkerCrashed + StageFault; teardown; restart."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import pytest

import swactor_ring as sr
from swactor.v1 import common_pb2, stage_pb2
from swactor.worker.ctl import GpuWorkerCtl
from swactor.worker.ctl_fsm import CtlCore, CtlState, WorkerCrashed
from swactor.worker.node import StageNode
from swactor.worker.process import wire

from .harness import Arena
from .node_fakes import UNLEASED, FakeArenaPort, FakeDriverPort, FakeMembership
from .plans import MODEL, provision

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not os.path.exists(MODEL), reason="run `make model`")]


async def until(node: StageNode, run_id: int, kind: str, timeout: float = 90) -> stage_pb2.StageUpdate:
    async def go() -> stage_pb2.StageUpdate:
        async for u in node.watch(run_id):
            if u.WhichOneof("update") == kind:
                return u
            if u.WhichOneof("update") == "fault" and kind == "ready":
                raise AssertionError(f"run {run_id} faulted while waiting for {kind}: {u.fault}")
        raise AssertionError(f"run {run_id} ended without {kind}")

    return await asyncio.wait_for(go(), timeout)


async def wait_for(cond: Any, timeout: float = 60) -> None:
    async def go() -> None:
        while not cond():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(go(), timeout)


def test_stage_node_with_real_worker_crash_and_restart() -> None:
    arena = Arena(8 << 20)

    async def body() -> None:
        core = CtlCore(arena.size, sr.RING_VERSION, {"device": "CPU"}, init_timeout_s=60, stop_timeout_s=10)
        ctl = GpuWorkerCtl(core, arena.fd, python=sys.executable)
        seen: list[Any] = []
        ctl.subscribe(seen.append)
        arena_port, driver, membership = FakeArenaPort(arena), FakeDriverPort(), FakeMembership()
        node = StageNode(3, ctl, arena_port, driver, membership, control_endpoint="h:1", lease_window_s=UNLEASED)
        await node.start()
        try:
            await wait_for(lambda: node.available)
            assert membership.states == ["available:h:1"]  # §8: arena mapped + WorkerReady + driver up
            node.provision(provision(node_id=3, orchestrator=1, run_id=1), caller_orchestrator=1)
            ready = await until(node, 1, "ready")
            assert ready.ready.warm_weights is False
            assert [op for op, _ in arena_port.calls] == ["lease", "lease", "attach", "attach"]
            assert sorted(driver.calls) == [("recv", 101), ("send", 102)]
            node.stop_run(1)
            await until(node, 1, "stopped")
            released = [r for op, r in arena_port.calls if op == "release"]
            assert len(released) == 2  # both rings returned after pump stop + RingQuiesced (§38)

            node.provision(provision(node_id=3, orchestrator=1, run_id=2, in_edge=201, out_edge=202),
                           caller_orchestrator=1)
            assert (await until(node, 2, "ready")).ready.warm_weights is True  # same weights: reused
            gen = core.worker_generation
            assert ctl.proc is not None
            os.kill(ctl.proc.pid, signal.SIGKILL)
            fault = (await until(node, 2, "fault")).fault
            assert fault.reason == common_pb2.RUN_FAULT_WORKER_CRASHED
            assert fault.component == common_pb2.COMPONENT_WORKER_CTL
            crashed = [e for e in seen if isinstance(e, WorkerCrashed)]
            assert crashed and crashed[0].worker_generation == gen and crashed[0].returncode == -signal.SIGKILL
            ring_faults = [e for e in seen if isinstance(e, wire.RingFault) and e.reason == common_pb2.RING_FAULT_WORKER_PROCESS_EXITED]
            assert len(ring_faults) == 2
            assert any(s.startswith("faulted:") for s in membership.states)
            node.stop_run(2)
            await until(node, 2, "stopped")
            # a new worker generation comes up once the stage no longer depends on the old one
            await wait_for(lambda: core.state is CtlState.RUNNING and core.worker_generation == gen + 1)
            await wait_for(lambda: node.available)
        finally:
            await node.close()
            ctl.send(wire.ShutdownWorker("Graceful"))
            await asyncio.wait_for(ctl.wait_exited(), 20)
            await ctl.close()

    try:
        asyncio.run(body())
    finally:
        arena.close()
