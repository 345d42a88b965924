"""Real `swactor-membership` processes, one per network namespace, for tests and bench/membership.py.

Each node gets its own gRPC socket, state dir and log file under a temp dir; the test process
talks to every node over its Unix socket (paths work across network namespaces) and can record
each node's WatchMembers stream.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from swactor.v1 import membership_pb2 as pb
from swactor.v1 import membership_pb2_grpc as pb_grpc
from tests.harness import Host, NetnsCluster

GOSSIP_PORT = 7946
MEMBERSHIP_BIN = str(Path(sys.executable).with_name("swactor-membership"))


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `predicate` until truthy; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except grpc.RpcError as e:  # the node is still starting or just died
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last rpc error: {last_error})")


@dataclass(frozen=True)
class Seen:
    """One watch event as a node saw it, stamped with the test's monotonic clock."""

    at: float
    kind: int
    node_id: int
    incarnation: int


@dataclass
class Watch:
    events: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, node_id: int, kind: int | None = None) -> list[Seen]:
        with self.lock:
            return [e for e in self.events if e.node_id == node_id and (kind is None or e.kind == kind)]


@dataclass
class Node:
    host: Host
    socket: Path
    state_dir: Path
    log_path: Path
    proc: subprocess.Popen[Any]
    channel: grpc.Channel
    stub: pb_grpc.MembershipStub
    node_id: int = 0
    watch: Watch | None = None

    @property
    def gossip(self) -> str:
        return f"{self.host.addr}:{GOSSIP_PORT}"

    def get_self(self) -> pb.GetSelfResponse:
        return self.stub.GetSelf(pb.GetSelfRequest(), timeout=2)

    def members(self, include_departed: bool = False) -> list[pb.Member]:
        return list(self.stub.ListMembers(pb.ListMembersRequest(include_departed=include_departed), timeout=2).members)

    def status_of(self, node_id: int) -> int | None:
        for m in self.members(include_departed=True):
            if m.metadata.node_id == node_id:
                return m.status
        return None

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class MembershipCluster:
    """Starts and stops membership nodes on the hosts of a NetnsCluster."""

    def __init__(self, net: NetnsCluster, workdir: Path, *, secret: bytes | None = None) -> None:
        self.net = net
        self.workdir = workdir
        self.secret_file = self.write_secret(secret or secrets.token_bytes(32), "cluster.secret")
        self.nodes: dict[int, Node] = {}
        self._watch_threads: list[threading.Thread] = []

    def write_secret(self, secret: bytes, name: str) -> Path:
        path = self.workdir / name
        path.write_bytes(secret.hex().encode())
        path.chmod(0o600)
        return path

    def start(
        self,
        index: int,
        *,
        seeds: list[int] | None = None,
        secret_file: Path | None = None,
        extra: list[str] | None = None,
    ) -> Node:
        host = self.net.hosts[index]
        base = self.workdir / f"h{index}"
        base.mkdir(exist_ok=True)
        socket = base / "membership.sock"
        seed_hosts = [0] if seeds is None else seeds
        argv = [
            MEMBERSHIP_BIN,
            "--socket", str(socket),
            "--state-dir", str(base / "state"),
            "--bind", f"{host.addr}:{GOSSIP_PORT}",
            "--secret-file", str(secret_file or self.secret_file),
            "--no-gpu-autodetect",
            "--edge-endpoint", f"{host.addr}:4433",
            "--control-endpoint", f"{host.addr}:7000",
            "--edge-cert-fingerprint", f"{index:064x}",
            "--gpu", f"CPU:fake-{index}:{(index + 1) * 2**30}",
        ]
        for s in seed_hosts:
            argv += ["--seed", f"{self.net.hosts[s].addr}:{GOSSIP_PORT}"]
        argv += extra or []
        log_path = base / f"membership-{time.monotonic_ns()}.log"
        with log_path.open("wb") as log:
            proc = host.spawn(argv, stdout=log, stderr=subprocess.STDOUT)
        channel = grpc.insecure_channel(f"unix:{socket}")
        node = Node(host, socket, base / "state", log_path, proc, channel, pb_grpc.MembershipStub(channel))
        self.nodes[index] = node
        return node

    def ready(self, node: Node, timeout: float = 20.0) -> Node:
        def up() -> bool:
            if node.proc.poll() is not None:
                raise AssertionError(f"membership on {node.host.ns} exited {node.proc.returncode}:\n{node.log_tail()}")
            return node.socket.is_socket() and node.get_self().self.metadata.node_id != 0

        wait_until(up, timeout, f"membership on {node.host.ns} to serve gRPC")
        node.node_id = node.get_self().self.metadata.node_id
        return node

    def start_all(self, indexes: list[int], timeout: float = 30.0) -> list[Node]:
        nodes = [self.start(i) for i in indexes]
        return [self.ready(n, timeout) for n in nodes]

    def watch(self, node: Node) -> Watch:
        """Record `node`'s WatchMembers stream in a daemon thread until the node stops."""
        w = Watch()
        node.watch = w
        call = node.stub.WatchMembers(pb.WatchMembersRequest(include_snapshot=False))

        def run() -> None:
            try:
                for ev in call:
                    with w.lock:
                        w.events.append(Seen(time.monotonic(), ev.kind, ev.member.metadata.node_id, ev.incarnation))
            except grpc.RpcError:
                return

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._watch_threads.append(t)
        return w

    def live_views(self, nodes: list[Node]) -> dict[int, dict[int, pb.Member]]:
        """node_id of each viewer -> {node_id: member} of what it lists as alive."""
        out = {}
        for n in nodes:
            out[n.node_id] = {m.metadata.node_id: m for m in n.members() if m.status == pb.MEMBER_STATUS_ALIVE}
        return out

    def stop_all(self) -> None:
        for n in self.nodes.values():
            n.channel.close()
            if n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait(timeout=5)
