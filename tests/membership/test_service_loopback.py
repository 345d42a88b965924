"""The real service over loopback (no root needed): gRPC API, CLI errors, and no false death
while the Python side of a node holds the GIL and blocks its event loop."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from swactor.common.secret import gossip_key
from swactor.membership.client import MembershipClient
from swactor.membership.config import MembershipConfig
from swactor.membership.kinship_backend import KinshipBackend
from swactor.membership.main import swim_settings
from swactor.membership.node import MembershipNode, NodeTimings
from swactor.v1 import membership_pb2 as pb
from swactor.v1 import membership_pb2_grpc as pb_grpc
from tests.membership.cluster import MEMBERSHIP_BIN, wait_until

SECRET = b"loopback test secret, 32 bytes.."


class Proc:
    def __init__(self, tmp: Path, name: str, *extra: str, env: dict[str, str] | None = None) -> None:
        self.socket = tmp / f"{name}.sock"
        secret = tmp / "secret"
        secret.write_bytes(SECRET)
        self.log = tmp / f"{name}.log"
        argv = [MEMBERSHIP_BIN, "--socket", str(self.socket), "--state-dir", str(tmp / name),
                "--bind", "127.0.0.1:0", "--secret-file", str(secret), "--no-gpu-autodetect", *extra]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.channel = grpc.insecure_channel(f"unix:{self.socket}")
        self.stub = pb_grpc.MembershipStub(self.channel)
        wait_until(lambda: self.proc.poll() is None and self.socket.is_socket() and self.get_self(), 20,
                   f"{name} to serve ({self.log.read_text()[-2000:]})")
        self.addr = self.get_self().self.gossip_address

    def get_self(self) -> pb.GetSelfResponse:
        return self.stub.GetSelf(pb.GetSelfRequest(), timeout=2)

    def close(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Proc, Proc]]:
    a = Proc(tmp_path, "a")
    b = Proc(tmp_path, "b", "--seed", a.addr)
    try:
        yield a, b
    finally:
        b.close()
        a.close()


def test_grpc_api_over_a_unix_socket(pair: tuple[Proc, Proc]) -> None:
    a, b = pair
    wait_until(lambda: len(a.stub.ListMembers(pb.ListMembersRequest(), timeout=2).members) == 2, 15, "a pair")
    me = a.get_self()
    assert me.cluster == "swactor" and me.self.is_self and me.self.status == pb.MEMBER_STATUS_ALIVE
    assert me.counters.alive == 2

    watch = b.stub.WatchMembers(pb.WatchMembersRequest(include_snapshot=True), timeout=15)
    snap = [next(watch), next(watch)]
    assert all(e.snapshot and e.kind == pb.MEMBER_EVENT_KIND_JOIN for e in snap)
    assert {e.member.metadata.node_id for e in snap} == {me.self.metadata.node_id, b.get_self().self.metadata.node_id}

    with pytest.raises(grpc.RpcError) as err:
        a.stub.SetLocalState(pb.SetLocalStateRequest(state=pb.NODE_STATE_AVAILABLE, edge_endpoint="x"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "edge_endpoint" in err.value.details()

    fp = "cd" * 32
    a.stub.SetLocalState(pb.SetLocalStateRequest(
        state=pb.NODE_STATE_FAULTED, reason="RUN_FAULT_WORKER_CRASHED", edge_cert_fingerprint=fp), timeout=5)
    ev = next(e for e in watch if e.kind == pb.MEMBER_EVENT_KIND_METADATA_CHANGED)
    assert ev.member.metadata.node_id == me.self.metadata.node_id
    assert ev.member.metadata.state == pb.NODE_STATE_FAULTED
    assert ev.member.metadata.state_reason == "RUN_FAULT_WORKER_CRASHED"
    assert ev.member.metadata.edge_cert_fingerprint == fp
    assert ev.incarnation > me.self.incarnation
    watch.cancel()


def test_no_false_death_while_this_process_holds_the_gil(tmp_path: Path) -> None:
    """A node whose Python side is stuck (GIL held in C, event loop blocked) for twice the
    suspicion timeout still answers probes: the protocol runs on the engine's own thread."""
    peer = Proc(tmp_path, "peer")
    try:
        asyncio.run(_hold_gil_while_member(peer))
    finally:
        peer.close()


async def _hold_gil_while_member(peer: Proc) -> None:
    cfg = MembershipConfig(bind="127.0.0.1:0", seeds=[peer.addr])
    md = pb.NodeMetadata(node_id=4242, software_version="test", state=pb.NODE_STATE_BOOTING)
    node = MembershipNode(
        KinshipBackend(swim_settings(cfg, 4242, gossip_key(SECRET, cfg.cluster), md)), md, cfg.seeds,
        NodeTimings(0.2, 60.0, 1.0),
    )
    await node.start()
    try:
        def seen_by_peer() -> pb.Member | None:
            for m in peer.stub.ListMembers(pb.ListMembersRequest(include_departed=True), timeout=2).members:
                if m.metadata.node_id == 4242:
                    return m
            return None

        deadline = time.monotonic() + 15
        while not ((m := seen_by_peer()) and m.status == pb.MEMBER_STATUS_ALIVE):
            assert time.monotonic() < deadline, "peer never saw the in-process node"
            await asyncio.sleep(0.1)
        since = m.status_since_us
        suspicions = peer.get_self().counters.suspicions

        # sum() over a range runs in C without releasing the GIL: nothing else in this process
        # runs Python meanwhile. 6 s is twice the 3 s suspicion timeout of a 2-node cluster.
        # A noisy calibration can undershoot, so top up in further C calls until 6 s have passed
        # (the event loop stays blocked throughout; only the gaps between calls can switch threads).
        n, t0 = 10**6, time.monotonic()
        sum(range(n))
        per_item = max((time.monotonic() - t0) / n, 1e-9)
        t0 = time.monotonic()
        held = 0.0
        while held < 6.0:
            sum(range(int((6.0 - held) / per_item) + 1))
            held = time.monotonic() - t0
        assert held >= 4.0, f"GIL held only {held:.1f} s; calibration failed"

        await asyncio.sleep(1.0)
        after = seen_by_peer()
        assert after is not None and after.status == pb.MEMBER_STATUS_ALIVE
        assert after.status_since_us == since, "peer saw a liveness change while the GIL was held"
        assert peer.get_self().counters.suspicions == suspicions
    finally:
        await node.stop(graceful=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bind", "nowhere"], "bind must be IP:PORT"),
        (["--secret-file", "/nonexistent/secret"], "does not exist"),
        (["--edge-endpoint", "no-port"], "edge_endpoint must be host:port"),
        (["--gpu", "CUDA:x"], "KIND:NAME:MEMORY_BYTES"),
        (["--config", "/nonexistent.toml"], "does not exist"),
        (["--seed", "bad seed"], "seed must be host:port"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path, args: list[str], message: str) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    base = ["--socket", str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "st"),
            "--secret-file", str(secret), "--bind", "127.0.0.1:0", "--no-gpu-autodetect"]
    done = subprocess.run([MEMBERSHIP_BIN, *base, *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_config_file_unknown_key_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "swactor.toml"
    cfg.write_text("[membership]\nprobe_intervall_s = 1.0\n")
    done = subprocess.run([MEMBERSHIP_BIN, "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "probe_intervall_s" in done.stderr



def test_systemd_readiness_and_member_counts_in_status(tmp_path: Path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = tmp_path / "notify.sock"
    notify.bind(str(notify_path))
    notify.settimeout(10)
    a = Proc(tmp_path, "a", env={"NOTIFY_SOCKET": str(notify_path)})
    b = None
    try:
        first = notify.recv(4096).decode()
        assert "READY=1" in first and "STATUS=members: 1 alive" in first
        assert a.socket.is_socket()  # readiness comes after the gRPC socket is bound
        b = Proc(tmp_path, "b", "--seed", a.addr)
        while "STATUS=members: 2 alive" not in (msg := notify.recv(4096).decode()):
            pass
        b.close()  # graceful: a should count one left member
        while "1 left" not in (msg := notify.recv(4096).decode()):
            pass
        assert msg == "STATUS=members: 1 alive, 0 suspect, 0 dead, 1 left"
        a.proc.terminate()
        assert a.proc.wait(timeout=10) == 0
        while "STOPPING=1" not in notify.recv(4096).decode():
            pass
    finally:
        if b is not None:
            b.close()
        a.close()
        notify.close()


def test_gossip_address_in_use_exits_2_naming_it(tmp_path: Path) -> None:
    a = Proc(tmp_path, "a")
    try:
        secret = tmp_path / "secret"
        done = subprocess.run(
            [MEMBERSHIP_BIN, "--socket", str(tmp_path / "x.sock"), "--state-dir", str(tmp_path / "x"),
             "--secret-file", str(secret), "--bind", a.addr, "--no-gpu-autodetect"],
            capture_output=True, text=True, timeout=30,
        )
        assert done.returncode == 2
        assert f"cannot bind the gossip socket {a.addr}" in done.stderr and "Traceback" not in done.stderr
        assert a.proc.poll() is None
    finally:
        a.close()


def test_client_sets_available_and_the_peer_sees_it(pair: tuple[Proc, Proc]) -> None:
    a, b = pair

    async def body() -> None:
        async with MembershipClient(a.socket) as client:
            me = await client.set_local_state(pb.NODE_STATE_AVAILABLE, control_endpoint="127.0.0.1:7001",
                                              stage_memory_bytes=5 << 30)
            assert me.is_self and me.metadata.state == pb.NODE_STATE_AVAILABLE
            assert (await client.get_self()).self.metadata.control_endpoint == "127.0.0.1:7001"
            assert len(await client.list_members(include_departed=True)) >= 1

    asyncio.run(body())
    node_id = a.get_self().self.metadata.node_id

    def b_sees_available() -> bool:
        members = b.stub.ListMembers(pb.ListMembersRequest(), timeout=2).members
        return any(m.metadata.node_id == node_id and m.metadata.state == pb.NODE_STATE_AVAILABLE
                   and m.metadata.control_endpoint == "127.0.0.1:7001" and m.metadata.stage_memory_bytes == 5 << 30
                   for m in members)

    wait_until(b_sees_available, 10, "the peer to see AVAILABLE")


def test_each_node_measures_its_peers_rtt_and_learns_theirs(pair: tuple[Proc, Proc]) -> None:
    a = pair[0]
    ids = {p.get_self().self.metadata.node_id for p in pair}

    def both_ways() -> dict[tuple[int, int], pb.MemberRtt]:
        got = {(r.from_node_id, r.to_node_id): r for r in a.stub.GetRtts(pb.GetRttsRequest(), timeout=2).rtts}
        return got if len(got) == 2 else {}

    rtts = wait_until(both_ways, 20, "a to measure b and to learn b's row")
    assert set(rtts) == {(x, y) for x in ids for y in ids if x != y}
    assert all(0 < r.rtt_us < 200_000 for r in rtts.values()), rtts  # loopback: well under a WAN's
    own = a.get_self().self.metadata.node_id
    assert a.stub.GetRtts(pb.GetRttsRequest(), timeout=2).rtts[0].from_node_id == own  # its own first


def test_the_service_starts_on_the_probe_timings_its_last_run_kept(tmp_path: Path) -> None:
    """The real service with a kept advice in its state directory: its engine starts on those timings (said), and it
    serves; a second node joins it."""
    from swactor.membership.probe_timing import ADVICE_FILE

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ADVICE_FILE).write_text('{"probe_timeout_s": 1.3, "probe_interval_s": 2.6}')
    a = Proc(tmp_path, "a")
    b = Proc(tmp_path, "b", "--seed", a.addr)
    try:
        applied = [json.loads(line) for line in a.log.read_text().splitlines() if "membership_probe_timing_applied" in line]
        assert [(e["probe_timeout_s"], e["probe_interval_s"], e["configured_probe_timeout_s"]) for e in applied] == \
            [(1.3, 2.6, 0.5)]
        assert "membership_probe_timing_applied" not in b.log.read_text()  # nothing kept there: as configured
        wait_until(lambda: len(a.stub.ListMembers(pb.ListMembersRequest(), timeout=2).members) == 2, 15, "a pair")
    finally:
        b.close()
        a.close()
