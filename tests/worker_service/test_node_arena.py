"""The stage node against the real arena-manager service: leases, worker attach/detach and release
through swactor.arena.client, the arena memfd handed over SCM_RIGHTS and inherited by the worker."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import swactor_ring as sr
from swactor.arena.client import ArenaHandoutError, AsyncArenaClient, connect_holder
from swactor.edgeend.adapters import ArenaClientPort
from swactor.worker.ctl import GpuWorkerCtl
from swactor.worker.ctl_fsm import CtlCore
from swactor.worker.node import StageNode
from swactor.worker.process import wire

from .harness import start_arena
from .node_fakes import UNLEASED, FakeDriverPort, FakeMembership
from .plans import MODEL, provision
from .test_node_process import until, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not os.path.exists(MODEL), reason="run `make model`")]


def test_stage_node_leases_and_releases_real_arena_rings() -> None:
    base = Path(tempfile.mkdtemp(prefix="sw-", dir="/tmp"))
    arena_proc = start_arena(base)

    async def body() -> None:
        for _ in range(100):
            try:
                hold = connect_holder(base / "arena-fd.sock")
                break
            except ArenaHandoutError:
                await asyncio.sleep(0.05)
        hold.map()
        client = AsyncArenaClient(hold, base / "arena.sock")
        core = CtlCore(hold.arena_len, sr.RING_VERSION, {"device": "CPU"}, init_timeout_s=60)
        ctl = GpuWorkerCtl(core, hold.fd)
        node = StageNode(3, ctl, ArenaClientPort(client), FakeDriverPort(), FakeMembership(),
                         lease_window_s=UNLEASED)
        await node.start()
        try:
            await wait_for(lambda: node.available)
            node.provision(provision(node_id=3, orchestrator=1, run_id=5), caller_orchestrator=1)
            await until(node, 5, "ready")
            stats = await client.stats()
            assert len(stats.leases) == 2
            assert all(lease.attached_holder_ids == [hold.holder_id] for lease in stats.leases)  # worker ring hold
            assert sorted(lease.edge_id for lease in stats.leases) == [101, 102]
            node.stop_run(5)
            await until(node, 5, "stopped")
            stats = await client.stats()
            assert list(stats.leases) == [] and stats.leased_bytes == 0  # §38: every lease released
        finally:
            await node.close()
            ctl.send(wire.ShutdownWorker("Graceful"))
            await asyncio.wait_for(ctl.wait_exited(), 20)
            await ctl.close()
            await client.close()
            hold.close()

    try:
        asyncio.run(body())
    finally:
        arena_proc.terminate()
        arena_proc.wait(20)
        shutil.rmtree(base, ignore_errors=True)
