"""A stage node wired to the real services of two hosts on loopback: arena-managers, QUIC
edge-drivers (static peers) and the worker's compute process. The test plays the peer host
(orchestrator side): it writes the token-in object through its own edge-driver and reads the
activation object the stage sends back, and checks it against StageModel(0, 15) in-process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import swactor_ring as sr
from swactor.arena.client import AsyncArenaClient, Leased, connect_holder
from swactor.common.layout import Layout
from swactor.common.ringport import native_layout
from swactor.edge.wakefd import fetch_wake_fds
from swactor.edgeend.adapters import (
    ArenaClientPort,
    EdgeDriverPort,
)
from swactor.v1 import common_pb2, membership_pb2, membership_pb2_grpc
from swactor.worker.ctl import GpuWorkerCtl
from swactor.worker.ctl_fsm import CtlCore
from swactor.worker.membership import MembershipClientPort
from swactor.worker.node import StageNode
from swactor.worker.process import wire

from .harness import start_arena
from .node_fakes import UNLEASED
from .plans import MODEL, provision, ring
from .test_node_process import until, wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not os.path.exists(MODEL), reason="run `make model`")]

PROMPT = [1, 4093, 314, 253, 2726]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Host:
    def __init__(self, base: Path) -> None:
        base.mkdir()
        self.base = base
        self.arena = start_arena(base)
        out = subprocess.run([sys.executable, "-m", "swactor.edge.main", "--state-dir", str(base / "state"),
                              "--init-identity"], capture_output=True, text=True, check=True, timeout=60)
        ident = json.loads(out.stdout.strip().splitlines()[-1])
        self.node_id, self.fingerprint = int(ident["node_id"]), ident["fingerprint"]
        self.port = free_udp_port()
        self.edge: subprocess.Popen[bytes] | None = None
        self.membership: subprocess.Popen[bytes] | None = None

    def start_membership(self, secret: Path) -> None:
        b = self.base
        self.membership = subprocess.Popen(
            [sys.executable, "-m", "swactor.membership.main", "--config", str(b / "swactor.toml"), "--socket",
             str(b / "membership.sock"), "--state-dir", str(b / "state"), "--bind", f"127.0.0.1:{free_udp_port()}",
             "--secret-file", str(secret), "--no-gpu-autodetect"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start_edge(self, peers: Path) -> None:
        b = self.base
        self.edge = subprocess.Popen(
            [sys.executable, "-m", "swactor.edge.main", "--config", str(b / "swactor.toml"), "--socket",
             str(b / "edge.sock"), "--state-dir", str(b / "state"), "--bind", f"127.0.0.1:{self.port}",
             "--peers-file", str(peers), "--arena-socket", str(b / "arena.sock"), "--arena-fd-socket",
             str(b / "arena-fd.sock"), "--wake-socket", str(b / "edge-wake.sock")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        for p in (self.edge, self.membership, self.arena):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()


async def peer_ring(client: AsyncArenaClient, edge_id: int, direction: int) -> wire.Layout:
    out = await client.lease(request_id=edge_id * 10, requester="test-peer", edge_id=edge_id, direction=direction,
                             ring_spec=ring(direction))  # type: ignore[arg-type]
    assert isinstance(out, Leased), out
    return Layout.from_pb(out.layout)


def read_object(cons: Any, deadline: float) -> tuple[Any, bytes]:
    buf = b""
    while len(buf) < 40:
        assert time.monotonic() < deadline
        cons.wait_readable(1.0)
        buf += cons.read(40 - len(buf))
    h = sr.ObjectHeader.parse(buf, 1 << 30, 1)
    payload = b""
    while len(payload) < h.extent:
        assert time.monotonic() < deadline
        cons.wait_readable(1.0)
        payload += cons.read(h.extent - len(payload))
    return h, payload


def test_stage_over_real_arena_and_edge_drivers() -> None:
    base = Path(tempfile.mkdtemp(prefix="swe-", dir="/tmp"))
    hosts: list[Host] = []
    try:
        h, p = Host(base / "h"), Host(base / "p")
        hosts += [h, p]
        peers = base / "peers.toml"
        peers.write_text("".join(f'[[peer]]\nnode_id = {x.node_id}\nendpoint = "127.0.0.1:{x.port}"\n'
                                 f'fingerprint = "{x.fingerprint}"\n' for x in hosts))
        for x in hosts:
            x.start_edge(peers)
        secret = base / "cluster.secret"
        secret.write_text("test-cluster-secret-0123456789")
        h.start_membership(secret)
        deadline = time.monotonic() + 30
        while not all((x.base / "edge.sock").exists() for x in hosts) or not (h.base / "membership.sock").exists():
            assert time.monotonic() < deadline and all(x.edge.poll() is None for x in hosts)  # type: ignore[union-attr]
            time.sleep(0.05)
        asyncio.run(scenario(h, p))
    finally:
        for x in hosts:
            x.stop()
        shutil.rmtree(base, ignore_errors=True)


async def scenario(h: Host, p: Host) -> None:
    hold = connect_holder(h.base / "arena-fd.sock")
    hold.map()
    client = AsyncArenaClient(hold, h.base / "arena.sock")
    ctl = GpuWorkerCtl(CtlCore(hold.arena_len, sr.RING_VERSION, {"device": "CPU"}, init_timeout_s=60), hold.fd)
    driver = EdgeDriverPort(h.base / "edge.sock", h.base / "edge-wake.sock")
    membership = MembershipClientPort(h.base / "membership.sock")
    node = StageNode(h.node_id, ctl, ArenaClientPort(client), driver, membership, control_endpoint="127.0.0.1:7441",
                     lease_window_s=UNLEASED)
    peer_hold = connect_holder(p.base / "arena-fd.sock")
    peer_arena = peer_hold.map()
    peer_client = AsyncArenaClient(peer_hold, p.base / "arena.sock")
    peer_driver = EdgeDriverPort(p.base / "edge.sock", p.base / "edge-wake.sock")
    await node.start()
    try:
        await wait_for(lambda: node.available)
        stub = membership_pb2_grpc.MembershipStub(membership._channel)
        for _ in range(100):  # §8: NodeAvailable reached membership, with the control endpoint
            me = (await stub.GetSelf(membership_pb2.GetSelfRequest())).self.metadata
            if me.state == membership_pb2.NODE_STATE_AVAILABLE:
                break
            await asyncio.sleep(0.05)
        assert me.state == membership_pb2.NODE_STATE_AVAILABLE and me.control_endpoint == "127.0.0.1:7441"
        node.provision(provision(node_id=h.node_id, orchestrator=p.node_id, run_id=9, stage_index=0,
                                 layers=(0, 15), in_edge=301, out_edge=302, max_seq=32, peer=p.node_id),
                       caller_orchestrator=p.node_id)
        # the peer host: token-in producer (edge 301 -> h), activation consumer (edge 302 <- h)
        tin = await peer_ring(peer_client, 301, common_pb2.RING_DIRECTION_EGRESS)
        act = await peer_ring(peer_client, 302, common_pb2.RING_DIRECTION_INGRESS)
        await peer_driver.establish_send(301, h.node_id, tin)
        await peer_driver.establish_recv(302, h.node_id, act)
        r, w = fetch_wake_fds(p.base / "edge-wake.sock", tin.ring_id)
        prod = sr.Producer(peer_arena, native_layout(tin), readable_fd=r, writable_fd=w)
        r2, w2 = fetch_wake_fds(p.base / "edge-wake.sock", act.ring_id)
        cons = sr.Consumer(peer_arena, native_layout(act), readable_fd=r2, writable_fd=w2)
        ready = await until(node, 9, "ready", timeout=120)
        assert ready.HasField("ready")

        from swactor.worker.compute import StageModel

        ref = StageModel(MODEL, 0, 15, max_seq_len=32)
        deadline = time.monotonic() + 150
        for seq, ids in enumerate([PROMPT, [42]]):
            data = np.array(ids, np.int32).tobytes()
            assert prod.write(bytes(sr.ObjectHeader(70 + seq, seq, len(data)).encode()) + data) == 40 + len(data)
            hdr, payload = await asyncio.to_thread(read_object, cons, deadline)
            assert (hdr.sequence, hdr.object_id, hdr.extent) == (seq, 70 + seq, len(ids) * 576 * 4)
            want = ref.step(np.array(ids, np.int32), 0 if seq == 0 else len(PROMPT))
            np.testing.assert_allclose(np.frombuffer(payload, np.float32).reshape(len(ids), 576), want,
                                       rtol=1e-4, atol=1e-4)
        node.stop_run(9)
        await until(node, 9, "stopped", timeout=60)
        for _ in range(100):  # the driver's pump detach may land just after our release
            stats = await client.stats()
            if not stats.leases:
                break
            await asyncio.sleep(0.05)
        assert list(stats.leases) == []  # pump stopped, ring quiesced, lease released (§38)
        await peer_driver.stop_edge(301, tin.ring_id)
        await peer_driver.stop_edge(302, act.ring_id)
        for fd in (r, w, r2, w2):
            os.close(fd)
    finally:
        await node.close()
        ctl.send(wire.ShutdownWorker("Graceful"))
        await asyncio.wait_for(ctl.wait_exited(), 20)
        await ctl.close()
        await driver.close()
        await membership.close()
        await peer_driver.close()
        await client.close()
        await peer_client.close()
        hold.close()
        peer_hold.close()
