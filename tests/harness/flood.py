"""Hostile traffic against one host of a local cluster in network namespaces (issue 13).

    with Flood(cluster, target=0) as flood:     # an outsider namespace on the cluster's bridge
        ...                                      # junk Initials + wrong-certificate handshakes
    flood.reports                                # {"junk": {...}, "bad_certs": {...}}

or `flood.start("bad_certs")`, later `flood.start("junk")`, then `flood.stop()` (the reports).

The outsider is one more namespace on the bridge (`Netns.add_host`): not a member, no services.
From it run two processes: `udp_flood.py` (junk Initials at the rate one sender process achieves)
and `bad_handshakes.py` (repeated aioquic handshakes with a certificate nobody knows). Helpers read
what the target's edge driver reports (GetStatus admission counters), its RSS, and the kernel's
UDP receive-buffer drops inside its namespace. Used by tests/e2e/test_flood.py and bench/flood.py.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from swactor.localcluster import LocalCluster
from swactor.localcluster.layout import EDGE_PORT
from swactor.v1 import edge_pb2, edge_pb2_grpc

HERE = Path(__file__).resolve().parent


class Flood:
    def __init__(self, cluster: LocalCluster, target: int = 0, *, junk: bool = True, bad_certs: bool = True,
                 concurrency: int = 2, junk_port: int | None = None) -> None:
        if cluster.netns is None:
            raise RuntimeError("a flood needs the local cluster in network namespaces (root)")
        self.cluster = cluster
        self.target = target
        self.kinds = [k for k, on in (("junk", junk), ("bad_certs", bad_certs)) if on]
        self.concurrency = concurrency
        self.edge_port = cluster.public_port(EDGE_PORT)  # behind NAT (localcluster/nat.py): the mapped one
        # another port than the edge's: the same packets, no driver behind them
        self.junk_port = self.edge_port if junk_port is None else junk_port
        self.outsider: int | None = None
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.reports: dict[str, dict[str, Any]] = {}

    @property
    def target_addr(self) -> str:
        return self.cluster.hosts[self.target].addr

    def start(self, *kinds: str) -> None:
        """Start the senders of `kinds` (default: all this flood was made with) not running yet."""
        netns = self.cluster.netns
        assert netns is not None
        if self.outsider is None:
            self.outsider = netns.add_host()
        prefix = list(netns.exec_prefix(self.outsider))
        scripts = {"junk": [str(HERE / "udp_flood.py"), self.target_addr, str(self.junk_port)],
                   "bad_certs": [str(HERE / "bad_handshakes.py"), self.target_addr, str(self.edge_port),
                                 "--concurrency", str(self.concurrency)]}
        for kind in kinds or self.kinds:
            if kind not in self.kinds:
                raise ValueError(f"this flood has no {kind!r} sender (it has {self.kinds})")
            if kind in self.procs:
                continue
            self.procs[kind] = subprocess.Popen([*prefix, sys.executable, *scripts[kind]], stdout=subprocess.PIPE,
                                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    def stop(self) -> dict[str, dict[str, Any]]:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for kind, proc in self.procs.items():
            try:
                out, _ = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            self.reports[kind] = json.loads(lines[-1]) if lines else {"error": f"no report (exit {proc.returncode})"}
        self.procs = {}
        return self.reports

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs.values())

    def __enter__(self) -> Flood:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.procs:
            self.stop()


def edge_pid(cluster: LocalCluster, host: int) -> int:
    return cluster.service(f"{cluster.hosts[host].name}/edge").pid


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class RssSampler:
    """VmRSS of one process every `interval` s on a thread: the peak between start() and stop()."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_kib(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def admission(cluster: LocalCluster, host: int) -> edge_pb2.AdmissionStatus:
    with grpc.insecure_channel(f"unix:{cluster.hosts[host].sock('edge')}") as ch:
        return edge_pb2_grpc.EdgeDriverStub(ch).GetStatus(edge_pb2.GetStatusRequest(), timeout=10).admission


def udp_rcvbuf_errors(cluster: LocalCluster, host: int) -> int:
    """UDP datagrams the kernel dropped for full receive buffers in the host's namespace."""
    assert cluster.netns is not None
    out = subprocess.run([*cluster.netns.exec_prefix(host), "cat", "/proc/net/snmp"], capture_output=True,
                         text=True, timeout=10, check=True).stdout
    head, vals = [line.split() for line in out.splitlines() if line.startswith("Udp:")][:2]
    return int(dict(zip(head[1:], vals[1:], strict=True)).get("RcvbufErrors", 0))


def wait_for(cond: Any, what: str, timeout: float = 30.0, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
