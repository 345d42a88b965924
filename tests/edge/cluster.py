"""Real processes per host (an arena-manager and an edge driver), on loopback or in a netns Host.

The test process plays the workers: it holds each host's arena (fd hand-out), leases rings,
calls EstablishSend/EstablishRecv over the driver's gRPC socket, fetches the pump's wake
eventfds and produces/consumes through ring-rs. Used by the acceptance tests and bench/edge.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc

import swactor_ring as sr
from swactor.arena.client import ArenaHold, Leased, connect_holder
from swactor.common.ids import new_id
from swactor.common.ringport import native_layout
from swactor.edge.wakefd import fetch_wake_fds
from swactor.v1 import common_pb2, edge_pb2, edge_pb2_grpc
from tests.arena.sync_client import ArenaClient

BIN = Path(sys.executable).parent
EDGE_PORT = 7400


def wait_until(cond: Callable[[], object], what: str, timeout: float = 10.0, interval: float = 0.01) -> None:
    """Poll `cond` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def _wait_for(path: Path, proc: subprocess.Popen[Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before creating {path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not create {path} within {timeout} s")
        time.sleep(0.02)


@dataclass
class EdgeHost:
    """One host: directories, the arena and edge processes, and clients to both."""

    name: str
    root: Path
    addr: str = "127.0.0.1"
    port: int = EDGE_PORT
    netns: Any = None  # tests.harness.Host, or None for the current namespace
    node_id: int = 0
    fingerprint: str = ""
    arena_proc: subprocess.Popen[Any] | None = None
    membership_proc: subprocess.Popen[Any] | None = None
    edge_proc: subprocess.Popen[Any] | None = None
    hold: ArenaHold | None = None
    arena: ArenaClient | None = None
    channel: grpc.Channel | None = None
    stub: edge_pb2_grpc.EdgeDriverStub | None = None
    logs: list[IO[Any]] = field(default_factory=list)
    notify: socket.socket | None = None
    _notified: list[str] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def edge_socket(self) -> Path:
        return self.root / "edge.sock"

    @property
    def wake_socket(self) -> Path:
        return self.root / "edge-wake.sock"

    @property
    def endpoint(self) -> str:
        return f"{self.addr}:{self.port}"

    def init_identity(self) -> None:
        out = subprocess.run(
            [str(BIN / "swactor-edge"), "--init-identity", "--state-dir", str(self.state_dir)],
            capture_output=True, text=True, check=True, timeout=60,
        )
        doc = json.loads(out.stdout)
        self.node_id, self.fingerprint = doc["node_id"], doc["fingerprint"]

    def _spawn(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        log = (self.root / log_name).open("w")
        self.logs.append(log)
        if self.netns is not None:
            return self.netns.spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=env)  # type: ignore[no-any-return]
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )

    def notify_messages(self) -> list[str]:
        """sd_notify datagrams the driver sent so far (its NOTIFY_SOCKET is ours, read by a thread
        as systemd would: an unread notify socket fills up and blocks the sender)."""
        return list(self._notified)

    def _readies(self) -> int:
        return sum(m.startswith("READY=1") for m in self.notify_messages())

    def _read_notify(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                self._notified.append(sock.recv(4096).decode())

    def start_membership(self, secret_file: Path, seed: str | None) -> None:
        """The host's membership service (gossip on addr:7946), sharing the driver's state dir."""
        argv = [
            str(BIN / "swactor-membership"), "--socket", str(self.root / "membership.sock"),
            "--state-dir", str(self.state_dir), "--bind", f"{self.addr}:7946", "--secret-file", str(secret_file),
            "--no-gpu-autodetect",
        ]
        self.membership_proc = self._spawn([*argv, *(["--seed", seed] if seed else [])], "membership.log")
        _wait_for(self.root / "membership.sock", self.membership_proc, f"{self.name} membership")

    def start_arena(self, ceiling: int = 1 << 30) -> None:
        self.arena_proc = self._spawn(
            [
                str(BIN / "swactor-arena"), "--socket", str(self.root / "arena.sock"),
                "--fd-socket", str(self.root / "arena-fd.sock"), "--state-dir", str(self.root / "arena-state"),
                "--ceiling-bytes", str(ceiling),
            ],
            "arena.log",
        )
        _wait_for(self.root / "arena-fd.sock", self.arena_proc, f"{self.name} arena")
        self.hold = connect_holder(self.root / "arena-fd.sock")
        self.arena = ArenaClient(self.hold, self.root / "arena.sock")

    def start_edge(self, peers_file: Path | None, *extra: str) -> None:
        """Start the driver with a static peers file, or (None) following the membership socket
        at <root>/membership.sock."""
        for stale in (self.edge_socket, self.wake_socket):  # left by a SIGKILLed driver
            stale.unlink(missing_ok=True)
        if self.channel is not None:
            self.channel.close()
        if self.notify is None:
            self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.notify.bind(str(self.root / "notify.sock"))
            threading.Thread(target=self._read_notify, args=(self.notify,), daemon=True).start()
        readies = self._readies()
        self.edge_proc = self._spawn(
            [
                str(BIN / "swactor-edge"), "--state-dir", str(self.state_dir), "--socket", str(self.edge_socket),
                "--bind", self.endpoint,
                *(["--peers-file", str(peers_file)] if peers_file else ["--membership-socket", str(self.root / "membership.sock")]),
                "--arena-socket", str(self.root / "arena.sock"), "--arena-fd-socket", str(self.root / "arena-fd.sock"),
                "--wake-socket", str(self.wake_socket), *extra,
            ],
            "edge.log",
            env={"NOTIFY_SOCKET": str(self.root / "notify.sock")},
        )
        _wait_for(self.edge_socket, self.edge_proc, f"{self.name} edge driver")
        # started as systemd's Type=notify counts it: the socket listens a moment before READY=1 is sent
        wait_until(lambda: self._readies() > readies, f"{self.name} edge driver's READY=1", timeout=20)
        self.channel = grpc.insecure_channel(f"unix:{self.edge_socket}")
        grpc.channel_ready_future(self.channel).result(timeout=20)
        self.stub = edge_pb2_grpc.EdgeDriverStub(self.channel)

    def lease(self, edge_id: int, capacity: int, direction: int) -> common_pb2.RingLayout:
        assert self.arena is not None
        spec = common_pb2.RingSpec(data_capacity=capacity, alignment=64, direction=direction)  # type: ignore[arg-type]
        out = self.arena.lease(request_id=new_id(), requester="edge-test", edge_id=edge_id, direction=direction, ring_spec=spec)  # type: ignore[arg-type]
        assert isinstance(out, Leased), out
        return out.layout

    def producer(self, layout: common_pb2.RingLayout) -> sr.Producer:
        """The worker side of an egress ring, waking the driver's send-pump."""
        assert self.hold is not None
        rfd, wfd = fetch_wake_fds(self.wake_socket, layout.ring_id)
        try:
            return sr.Producer(self.hold.map(), native_layout(layout), readable_fd=rfd, writable_fd=wfd)
        finally:
            os.close(rfd)
            os.close(wfd)

    def consumer(self, layout: common_pb2.RingLayout) -> sr.Consumer:
        assert self.hold is not None
        rfd, wfd = fetch_wake_fds(self.wake_socket, layout.ring_id)
        try:
            return sr.Consumer(self.hold.map(), native_layout(layout), readable_fd=rfd, writable_fd=wfd)
        finally:
            os.close(rfd)
            os.close(wfd)

    def rss_kib(self) -> int:
        assert self.edge_proc is not None
        for line in Path(f"/proc/{self.edge_proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def kill_edge(self) -> None:
        assert self.edge_proc is not None
        self.edge_proc.send_signal(signal.SIGKILL)
        self.edge_proc.wait(10)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.arena is not None:
            self.arena.close()
        if self.hold is not None:
            self.hold.close()
        for proc in (self.edge_proc, self.arena_proc, self.membership_proc):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        for log in self.logs:
            log.close()
        if self.notify is not None:
            self.notify.close()


def write_peers(path: Path, hosts: list[EdgeHost]) -> None:
    path.write_text(
        "".join(
            f'[[peer]]\nnode_id = {h.node_id}\nendpoint = "{h.endpoint}"\nfingerprint = "{h.fingerprint}"\n\n'
            for h in hosts
        )
    )


class EventTap:
    """A WatchEdges stream drained by one thread; `wait(kind, edge_id)` returns the next match."""

    def __init__(self, stub: edge_pb2_grpc.EdgeDriverStub) -> None:
        self.call = stub.WatchEdges(edge_pb2.WatchEdgesRequest(replay_current=True))
        self.events: queue.Queue[edge_pb2.EdgeEvent] = queue.Queue()
        self.seen: list[edge_pb2.EdgeEvent] = []
        threading.Thread(target=self._pull, daemon=True).start()

    def _pull(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for ev in self.call:
                self.events.put(ev)

    def wait(self, kind: str, edge_id: int, timeout: float = 10.0) -> edge_pb2.EdgeEvent:
        def match(ev: edge_pb2.EdgeEvent) -> bool:
            return ev.WhichOneof("event") == kind and getattr(ev, kind).edge_id == edge_id

        for ev in self.seen:
            if match(ev):
                self.seen.remove(ev)
                return ev
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                break
            if match(ev):
                return ev
            self.seen.append(ev)
        raise TimeoutError(f"no {kind} event for edge {edge_id} within {timeout} s (saw {self.seen})")

    def close(self) -> None:
        self.call.cancel()


def wait_fd(fd: int, timeout: float) -> bool:
    r, _, _ = select.select([fd], [], [], timeout)
    return bool(r)


def write_all(prod: sr.Producer, data: memoryview, deadline: float) -> None:
    """Blocking producer loop: write, and sleep on the writable eventfd when the ring is full."""
    while data:
        n = prod.write(data)
        data = data[n:]
        if data and not prod.arm_writable():
            if time.monotonic() > deadline:
                raise TimeoutError("producer blocked past its deadline")
            wait_fd(prod.writable_fd, 0.5)
            prod.ack_wake()

