"""The local cluster itself: a failing service is named with its log, and teardown (also after a
failed bring-up) leaves no process, socket, namespace or directory behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from swactor.localcluster import ClusterError, ClusterSpec, LocalCluster
from swactor.localcluster.netns import Netns
from swactor.localcluster.run import follow
from swactor.v1.orchestrator_pb2 import SubmitRunRequest
from swactor.v1.orchestrator_pb2_grpc import OrchestratorStub
from tests.gateway.helpers import free_port

from .conftest import assert_torn_down, needs_model, processes_mentioning

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), needs_model]


def test_missing_model_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="does not exist"):
        LocalCluster(ClusterSpec(hosts=1, model=tmp_path / "nope.gguf"))


def test_failing_service_is_named_with_its_log_and_everything_is_removed() -> None:
    # An arena that cannot map its memfd: the arena-manager exits at boot.
    spec = ClusterSpec(hosts=2, ceiling_bytes=1 << 62, start_timeout_s=30)
    cluster = LocalCluster(spec)
    with pytest.raises(ClusterError) as e:
        cluster.__enter__()
    msg = str(e.value)
    assert "h0/arena exited" in msg or "h1/arena exited" in msg, msg
    assert "arena_boot_failed" in msg  # the quoted log tail carries the service's own event
    assert cluster.services == [] and cluster.netns is None
    assert cluster.root is not None and not cluster.root.exists()
    assert processes_mentioning(str(cluster.root)) == []


@pytest.mark.parametrize("mode", [pytest.param("netns", marks=pytest.mark.netns), "loopback"])
def test_one_host_runs_and_leaves_nothing(mode: str) -> None:
    if mode == "netns" and Netns.available() is not None:
        pytest.skip(f"network namespaces unavailable: {Netns.available()}")
    cluster = LocalCluster(ClusterSpec(hosts=1, netns=mode == "netns"))
    with cluster:
        pids = [s.pid for s in cluster.services]
        root = cluster.root
        netns = list(cluster.netns.created) if cluster.netns else []
        assert (cluster.netns is not None) == (mode == "netns")
        assert cluster.hosts[0].addr.startswith("10.78." if mode == "netns" else "127.")
        socks = sorted(p.name for p in cluster.hosts[0].run_dir.iterdir())
        assert {"arena.sock", "membership.sock", "edge.sock", "orchestrator.sock"} <= set(socks)
        assert len(pids) == 5
        with cluster.channel() as ch:
            res = follow(OrchestratorStub(ch), SubmitRunRequest(prompt="Once upon a time", raw=True, stages=1,
                                                                max_tokens=3), timeout_s=100)
        assert res.outcome == "completed" and res.token_ids == [28, 260, 2240]  # llama.cpp's greedy start
    assert_torn_down(cluster, pids, root, netns)
    assert cluster.teardown_report["killed"] == [], cluster.teardown_report


def test_ctrl_c_tears_the_cluster_down() -> None:
    port = free_port()  # the OpenAI API it serves, and tears down with the rest
    proc = subprocess.Popen([sys.executable, "-m", "swactor.localcluster", "--hosts", "2", "--openai-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        first = proc.stderr.readline()
        m = re.search(r"dir (/\S+)", first)
        assert m, first
        root = Path(m[1])
        ready_line = proc.stdout.readline()  # printed once the pool is ready
        assert "--address unix:" in ready_line, ready_line + proc.stderr.read()
        assert len(processes_mentioning(str(root))) >= 8
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as health:
            assert json.loads(health.read())["pool_ready"] is True
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert processes_mentioning(str(root)) == []
    assert not root.exists()
    with pytest.raises(OSError):  # the gateway went with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)


def test_demo_ctrl_c_mid_run_stops_the_run_and_tears_down() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "swactor.cli.main", "demo", "--stages", "2", "--hosts", "2",
                             "--max-tokens", "500", "--raw", "--prompt", "Once upon a time", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root: Path | None = None
    lines: list[dict] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            obj = json.loads(line)
            lines.append(obj)
            if obj["type"] == "progress" and root is None:
                m = re.search(r"dir (/\S+)", obj["message"])
                root = Path(m[1]) if m else None
            if obj["type"] == "token":
                break
        assert root is not None and lines[-1]["type"] == "token", (lines[-3:], proc.stderr.read())
        proc.send_signal(signal.SIGINT)
        rest = [json.loads(line) for line in proc.stdout]
        err = proc.stderr.read()
        assert proc.wait(90) == 130, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "interrupted" in err
    progress = [o["message"] for o in rest if o["type"] == "progress"]
    assert any("stopping run" in p for p in progress), progress
    assert processes_mentioning(str(root)) == []
    assert not root.exists()
