"""Model distribution in a real 2-host pool (network namespaces; only host 0 holds the model):
a full disk, an unreachable model server, a corrupted range and a slow link on a stage host each
end the run with a clear reason or complete it with progress, never leave a bad range in the
cache, and the pool serves the next run (issue 14)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.cluster import DEFAULT_MODEL
from swactor.localcluster.layout import MODEL_PORT
from swactor.localcluster.netns import Netns
from swactor.localcluster.run import RunResult, follow
from swactor.modelfile.header import read_header
from swactor.modelfile.manifest import Manifest
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc

from .conftest import needs_model

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(900), needs_model,
              pytest.mark.skipif(Netns.available() is not None, reason=f"network namespaces: {Netns.available()}")]


def mount_tmpfs(path: Path, size: str, remount: bool = False) -> None:
    opts = f"remount,size={size}" if remount else f"size={size}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path, Path]]:
    d = tmp_path_factory.mktemp("dist")
    model = d / "model.gguf"
    shutil.copy(DEFAULT_MODEL, model)  # corrupted below: never the repository's copy
    cache = d / "h1-weights"
    cache.mkdir()
    mount_tmpfs(cache, "20m")  # smaller than stage 1's ranges: the first run fills it
    spec = ClusterSpec(hosts=2, model=model, netns=True, readiness_timeout_s=300.0,
                       workers={1: {"weights_cache_dir": str(cache)}})
    try:
        with LocalCluster(spec) as cluster:
            yield cluster, model, cache
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def run(cluster: LocalCluster, node_ids: list[int] | None = None) -> RunResult:
    """A 2-stage run; stage k on host k unless `node_ids` says otherwise."""
    with cluster.channel() as ch:
        req = opb.SubmitRunRequest(prompt="The capital of France is", raw=True, stages=2, max_tokens=1,
                                   node_ids=node_ids or cluster.node_ids)
        return follow(orchestrator_pb2_grpc.OrchestratorStub(ch), req, timeout_s=600)


def stage_fault(res: RunResult) -> pb.LifecycleEvent:
    assert res.finished is not None and res.finished.outcome == opb.RUN_OUTCOME_FAULTED, res.finished
    assert res.finished.reason == "RUN_FAULT_WEIGHTS_LOAD_FAILED", (res.finished.reason, res.finished.detail)
    fault = next(e for e in res.events if e.kind == pb.STAGE_FAULTED)  # the first fault is the run's
    assert fault.stage_index == 1 and fault.reason == "RUN_FAULT_WEIGHTS_LOAD_FAILED"
    assert fault.detail in res.finished.detail
    return fault


def in_ns(cluster: LocalCluster, host: int, *argv: str) -> None:
    assert cluster.netns is not None
    subprocess.run([*cluster.netns.exec_prefix(host), *argv], check=True, capture_output=True)


def test_a_full_disk_on_a_stage_host(pool) -> None:
    cluster, _, cache = pool
    fault = stage_fault(run(cluster))
    assert "WeightsFetch.DiskFull" in fault.detail and str(cache) in fault.detail
    mount_tmpfs(cache, "200m", remount=True)


def test_an_unreachable_model_server(pool) -> None:
    cluster, _, _ = pool
    port = cluster.public_port(MODEL_PORT)  # where host 1 dials it (behind NAT, the mapped port)
    rule = ["INPUT", "-p", "tcp", "--sport", str(port), "-j", "DROP"]
    in_ns(cluster, 1, "iptables", "-A", *rule)
    try:
        fault = stage_fault(run(cluster))
    finally:
        in_ns(cluster, 1, "iptables", "-D", *rule)
    assert "WeightsFetch.Unreachable" in fault.detail and f":{port}" in fault.detail


def unfetched_tensor(cache: Path, first_block: int) -> str:
    """A tensor of blocks >= first_block none of whose pieces host 1's cache holds yet (the earlier
    runs of this module fetched part of stage 1 before failing)."""
    [man] = list(cache.glob("*.manifest"))
    m = Manifest.decode(man.read_bytes())
    held: set[int] = set()
    for line in man.with_suffix(".ranges").read_text().splitlines()[1:]:
        rec = json.loads(line)
        held |= set(rec.get("add", []))
        held -= set(rec.get("drop", []))
    for name, (first, count) in sorted(m.tensors.items(), key=lambda kv: -kv[1][0]):
        if name.startswith("blk.") and int(name.split(".")[1]) >= first_block and not held & set(range(first, first + count)):
            return name
    raise AssertionError("host 1 already holds every tensor of stage 1")


def test_a_corrupted_range_is_named_and_dropped(pool) -> None:
    cluster, model, cache = pool
    with open(model, "rb") as f:
        header = read_header(lambda n: (f.seek(0), f.read(n))[1])[0]
    name = unfetched_tensor(cache, 15)
    t = header.tensor_map()[name]
    at = header.data_offset + t.offset + 100
    original = model.read_bytes()[at:at + 16]
    st = model.stat()
    with open(model, "r+b") as f:  # bit rot on the orchestrator's disk: same size and mtime
        f.seek(at)
        f.write(bytes(b ^ 0x5A for b in original))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        fault = stage_fault(run(cluster))
    finally:
        with open(model, "r+b") as f:
            f.seek(at)
            f.write(original)
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "WeightsFetch.ChecksumMismatch" in fault.detail and f"'{name}'" in fault.detail
    [data] = list(cache.glob("*.gguf"))
    with open(data, "rb") as f:
        f.seek(at)
        assert f.read(16) == bytes(16)  # the bad range was punched out, not kept


def test_a_slow_link_reports_progress_and_the_pool_serves_the_run(pool) -> None:
    cluster, _, _ = pool
    assert cluster.netns is not None
    delayer = subprocess.Popen([*cluster.netns.exec_prefix(0), sys.executable, "-m", "tests.harness.nfqueue_delay",
                                "--queue", "5", "--delay-ms", "10", "--tcp-sport", str(MODEL_PORT)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert delayer.stdout is not None and delayer.stdout.readline().strip() == "ready"
        # Swapped placement: each host now needs the other stage's ranges, fetched over the slow link.
        res = run(cluster, node_ids=list(reversed(cluster.node_ids)))
    finally:
        delayer.terminate()
        delayer.wait(10)
    assert res.finished is not None
    assert res.finished.outcome == opb.RUN_OUTCOME_COMPLETED, (res.finished.reason, res.finished.detail)
    for k in (0, 1):
        prog = [e for e in res.events if e.kind == pb.WEIGHTS_DOWNLOAD_PROGRESS and e.stage_index == k]
        assert prog and all(e.counters["rate_bps"] > 0 for e in prog)
        assert prog[-1].counters["bytes_done"] == prog[-1].counters["bytes_total"]
        [done] = [e for e in res.events if e.kind == pb.WEIGHTS_DOWNLOADED and e.stage_index == k]
        assert done.counters["bytes_fetched"] > 0
    assert len(res.token_ids) == 1
