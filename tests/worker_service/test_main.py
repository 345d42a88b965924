"""`swactor-worker` as a process, booted from its config against real arena-manager, edge-driver
and membership services: NodeAvailable with the control endpoint, mTLS StageControl, clean SIGINT."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from swactor.common import control_tls
from swactor.v1 import membership_pb2, membership_pb2_grpc, stage_pb2, stage_pb2_grpc

from .plans import provision
from .test_node_edge import Host, free_udp_port

pytestmark = pytest.mark.timeout(120)


def host_memory_total() -> int:
    kib = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    return int(kib) * 1024


def test_service_boots_reports_available_and_serves_control() -> None:
    base = Path(tempfile.mkdtemp(prefix="swm-", dir="/tmp"))
    host: Host | None = None
    worker: subprocess.Popen[bytes] | None = None
    try:
        host = Host(base / "h")
        b = host.base
        (base / "peers.toml").write_text(f'[[peer]]\nnode_id = {host.node_id}\nendpoint = "127.0.0.1:{host.port}"\n'
                                         f'fingerprint = "{host.fingerprint}"\n')
        host.start_edge(base / "peers.toml")
        secret = base / "cluster.secret"
        secret.write_text("main-test-cluster-secret-0123")
        host.start_membership(secret)
        control_port = free_udp_port()
        cfg = base / "worker.toml"
        cfg.write_text("[worker]\n" + "".join(f'{k} = "{v}"\n' for k, v in {
            "control_address": f"127.0.0.1:{control_port}", "secret_file": secret, "state_dir": b / "state",
            "arena_socket": b / "arena.sock", "arena_fd_socket": b / "arena-fd.sock", "edge_socket": b / "edge.sock",
            "edge_wake_socket": b / "edge-wake.sock", "membership_socket": b / "membership.sock",
            "device": "CPU"}.items()))
        deadline = time.monotonic() + 30
        while not all((b / s).exists() for s in ("edge.sock", "membership.sock")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        worker = subprocess.Popen([sys.executable, "-m", "swactor.worker.main", "--config", str(cfg)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        async def check() -> None:
            async with grpc.aio.insecure_channel(f"unix:{b / 'membership.sock'}") as ch:
                stub = membership_pb2_grpc.MembershipStub(ch)
                for _ in range(400):
                    me = (await stub.GetSelf(membership_pb2.GetSelfRequest())).self.metadata
                    if me.state == membership_pb2.NODE_STATE_AVAILABLE:
                        break
                    await asyncio.sleep(0.1)
                assert me.state == membership_pb2.NODE_STATE_AVAILABLE
                assert me.control_endpoint == f"127.0.0.1:{control_port}"
                # a CPU device: a share of MemAvailable when it started (another test's process may have taken some since)
                assert 0 < me.stage_memory_bytes < host_memory_total()
            async with control_tls.channel(secret.read_bytes().strip(), 1, me.control_endpoint, host.node_id) as ch:
                s = stage_pb2_grpc.StageControlStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await s.ProvisionStage(provision(node_id=host.node_id, orchestrator=1, layers=(15, 29)))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert not (await s.StopRun(stage_pb2.StopStageRunRequest(run_id=5))).known

        asyncio.run(check())
        worker.send_signal(signal.SIGINT)
        assert worker.wait(30) == 0
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(10)
        if host is not None:
            host.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_compute_threads_is_validated_by_name_and_reaches_the_backend(tmp_path: Path) -> None:
    from swactor.common.config import ConfigError, load_section
    from swactor.worker.config import WorkerConfig

    default = load_section({}, "worker", WorkerConfig)
    assert default.backend() == {"graph_cache": str(default.graph_cache_path())}
    assert default.graph_cache_path().name == "swactor-graphs"
    cfg = load_section({"worker": {"device": "CPU", "compute_threads": 3, "graph_cache_dir": str(tmp_path / "g")}},
                       "worker", WorkerConfig)
    assert cfg.backend() == {"device": "CPU", "threads": 3, "graph_cache": str(tmp_path / "g")}
    off = load_section({"worker": {"graph_cache": False}}, "worker", WorkerConfig)
    assert off.backend() == {"graph_cache": ""}
    with pytest.raises(ConfigError, match=r"\[worker\]\.compute_threads: must be >= 0"):
        load_section({"worker": {"compute_threads": -2}}, "worker", WorkerConfig)
    with pytest.raises(ConfigError, match=r"\[worker\]\.compute_threads: expected int"):
        load_section({"worker": {"compute_threads": "4"}}, "worker", WorkerConfig)
    (tmp_path / "w.toml").write_text("[worker]\ncompute_threads = -1\n")
    done = subprocess.run([sys.executable, "-m", "swactor.worker.main", "--config", str(tmp_path / "w.toml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "[worker].compute_threads: must be >= 0" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("device", "budget", "gpus", "want"),
    [
        ("CUDA", 5 << 30, {0: (80 << 30, 70 << 30)}, 5 << 30),  # a budget wins over what is measured
        ("CUDA", 0, {0: (80 << 30, 70 << 30)}, 70 << 30),  # the GPU's free memory
        ("NV:1", 0, {0: (80 << 30, 70 << 30), 1: (80 << 30, 9 << 30)}, 9 << 30),
        ("", 0, {0: (24 << 30, 20 << 30)}, 20 << 30),  # tinygrad's default device on a GPU host is the GPU
        ("", 0, {}, int((16 << 30) * 0.8)),  # ... and on a host without one the CPU
        ("CPU", 0, {0: (80 << 30, 70 << 30)}, int((16 << 30) * 0.8)),
        ("CUDA:3", 0, {0: (80 << 30, 70 << 30)}, 0),  # no such GPU: not advertised
        ("METAL", 0, {}, 0),
    ],
)
def test_advertised_stage_memory(device: str, budget: int, gpus: dict, want: int) -> None:
    from swactor.worker.stage_memory import advertised_memory

    assert advertised_memory(device, budget, gpu_memory=gpus.get, host_available=lambda: 16 << 30) == want


@pytest.mark.parametrize(("budget", "limit", "gpus", "want"), [
    (0, 8 << 30, {0: (80 << 30, 70 << 30)}, 8 << 30),  # the device memory limit caps what is measured
    (0, 90 << 30, {0: (80 << 30, 70 << 30)}, 70 << 30),
    (0, 8 << 30, {}, 8 << 30),  # nothing measured: the limit
    (5 << 30, 1 << 20, {0: (80 << 30, 70 << 30)}, 5 << 30),  # memory_bytes is the operator's word
])
def test_a_device_memory_limit_caps_the_measured_stage_memory(budget: int, limit: int, gpus: dict, want: int) -> None:
    from swactor.worker.stage_memory import advertised_memory

    assert advertised_memory("CUDA", budget, limit=limit, gpu_memory=gpus.get, host_available=lambda: 0) == want


def test_memory_bytes_is_validated_by_name() -> None:
    from swactor.common.config import ConfigError, load_section
    from swactor.worker.config import WorkerConfig

    assert load_section({"worker": {"memory_bytes": 1 << 30}}, "worker", WorkerConfig).memory_bytes == 1 << 30
    with pytest.raises(ConfigError, match=r"\[worker\]\.memory_bytes: must be >= 0"):
        load_section({"worker": {"memory_bytes": -1}}, "worker", WorkerConfig)


def test_device_memory_limit_is_validated_and_reaches_the_backend() -> None:
    from swactor.common.config import ConfigError, load_section
    from swactor.worker.config import WorkerConfig

    cfg = load_section({"worker": {"device_memory_limit_bytes": 1 << 30}}, "worker", WorkerConfig)
    assert cfg.backend()["memory_limit"] == 1 << 30
    assert "memory_limit" not in WorkerConfig().backend()  # 0: the device's own limit
    with pytest.raises(ConfigError, match=r"\[worker\]\.device_memory_limit_bytes: must be >= 0"):
        load_section({"worker": {"device_memory_limit_bytes": -1}}, "worker", WorkerConfig)
