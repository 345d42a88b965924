"""The orchestrator follows a real `swactor-membership` process (loopback, no root): the node turns
Available in ListNodes, and a run placed on it completes through a fake fleet."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from swactor.orchestrator.fleet.membership_client import follow_membership
from swactor.v1 import membership_pb2 as mpb
from swactor.v1 import membership_pb2_grpc
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import serving

pytestmark = pytest.mark.timeout(90)
MEMBERSHIP_BIN = Path(sys.executable).with_name("swactor-membership")
FINGERPRINT = "ab" * 32


@pytest.mark.skipif(not MEMBERSHIP_BIN.exists(), reason="swactor-membership is not installed in this venv")
def test_orchestrator_view_follows_real_membership(tmp_path: Path) -> None:
    sock = tmp_path / "membership.sock"
    secret = tmp_path / "secret"
    secret.write_bytes(b"orchestrator test secret 32 byte")
    log = (tmp_path / "membership.log").open("wb")
    proc = subprocess.Popen(
        [str(MEMBERSHIP_BIN), "--socket", str(sock), "--state-dir", str(tmp_path / "m"), "--bind", "127.0.0.1:0",
         "--secret-file", str(secret), "--no-gpu-autodetect", "--gpu", "CUDA:H100:85899345920",
         "--edge-endpoint", "127.0.0.1:7000", "--edge-cert-fingerprint", FINGERPRINT,
         "--control-endpoint", "127.0.0.1:7001"],
        stdout=log, stderr=subprocess.STDOUT)

    async def main():
        deadline = time.monotonic() + 20
        while not sock.is_socket():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "membership.log").read_text()
            await asyncio.sleep(0.1)
        async with serving(tmp_path, FakeFleet([100, 2])) as s:
            follower = asyncio.create_task(follow_membership(sock, s.orch.set_members, retry_s=0.1))
            try:
                while not s.orch.members:
                    await asyncio.sleep(0.05)
                booting = await s.stub.ListNodes(opb.ListNodesRequest())
                async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
                    await membership_pb2_grpc.MembershipStub(ch).SetLocalState(
                        mpb.SetLocalStateRequest(state=mpb.NODE_STATE_AVAILABLE), timeout=5)
                while not any(m.provisionable for m in s.orch.members):
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.1)  # PoolReady window
                available = await s.stub.ListNodes(opb.ListNodesRequest())
                resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="x", raw=True, max_tokens=4))
                updates = [u async for u in s.stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id))]
                return booting, available, updates
            finally:
                follower.cancel()

    try:
        booting, available, updates = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    assert booting.nodes[0].readiness == opb.NODE_READINESS_BOOTING and not booting.pool_ready
    (n,) = available.nodes
    assert n.readiness == opb.NODE_READINESS_AVAILABLE and n.provisionable and available.pool_ready
    assert (n.edge_endpoint, n.control_endpoint) == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert [(g.kind, g.name, g.memory_bytes) for g in n.gpus] == [("CUDA", "H100", 85899345920)]
    final = updates[-1].finished
    assert final.outcome == opb.RUN_OUTCOME_COMPLETED and final.placement[0].node_id == n.node_id
