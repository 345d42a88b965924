"""Weight load failures (spec §36 "weight download/load/bind failure"), each checked end to end
(tests/faults/checks.py), at the two places they can happen:

- on the orchestrator, which judges a model from its header before any host is touched (issue 14):
  a served model's file removed, truncated or rewritten with a quant type the workers cannot run, and
  a run asking for more stages than the model has blocks, are refused at SubmitRun by name;
- on a stage host, whose weights cache holds the ranges the orchestrator's judged file gave it: the
  cache file removed or truncated, or its header rewritten, under a live worker. The stage's next
  cold load (the compute process restarted first: a warm role would not read the file again) faults
  the run RUN_FAULT_WEIGHTS_LOAD_FAILED naming what is wrong, and the next run completes with no
  restart: the stage distrusts its copy after such a fault and fetches again what is gone or bad.

The served models are copies of the default GGUF in the test's tmp dir (never committed); the
orchestrator is restarted once with them and put back after the module.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from gguf import GGMLQuantizationType as QT

from swactor.localcluster.cluster import DEFAULT_MODEL
from swactor.modelfile.params import open_header
from swactor.orchestrator.fleet.node_events import POOL_EVENTS_RUN_ID
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from tests.faults.checks import C, FaultCheck, expect, refused_at_submit, with_detail
from tests.faults.pool import FaultPool, NotYet, wait_until

INTERIOR = 1
MODELS = ("gone", "cut", "q81")  # served copies this module damages, one each


@pytest.fixture(scope="module")
def served(pool_holder: list[FaultPool], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The orchestrator restarted serving copies of the default model as MODELS (judged good at its start)."""
    pool = pool_holder[0]
    root = tmp_path_factory.mktemp("models")
    files = {name: root / f"{name}.gguf" for name in MODELS}
    for path in files.values():
        shutil.copyfile(DEFAULT_MODEL, path)
        with path.open("ab") as f:  # other bytes than the default's (the model server serves files by SHA-256)
            f.write(path.name.encode().ljust(32, b"\0"))
    cfg = pool.host_config(0, "served-copies", orchestrator={"models": [f"{n}={p}" for n, p in files.items()]})
    pool.restart("h0/orchestrator", config=cfg)
    pool.wait_pool()
    try:
        yield files
    finally:
        pool.restart("h0/orchestrator")
        pool.wait_pool()


def retype(path: Path, tensor: str, qtype: QT) -> None:
    """Rewrite the GGML type of `tensor` in the GGUF header at `path`, in place (same size)."""
    header = open_header(DEFAULT_MODEL)  # every file retyped here is laid out like the default model
    with path.open("r+b") as f:
        prefix = f.read(header.data_offset)
        name = tensor.encode()
        at = prefix.find(struct.pack("<Q", len(name)) + name)
        assert at >= 0, f"{tensor} not in the header of {path}"
        at += 8 + len(name)
        (n_dims,) = struct.unpack_from("<I", prefix, at)
        f.seek(at + 4 + 8 * n_dims)
        f.write(struct.pack("<I", int(qtype)))


# ---- judged on the orchestrator: refused at SubmitRun ----


def test_model_file_missing(pool: FaultPool, served: dict[str, Path], request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "weights: model file missing (orchestrator)", expect(), test=request.node.nodeid)
    t = time.time()
    served["gone"].unlink()
    refused_at_submit(check, lambda: pool.submit(model="gone"), t, grpc.StatusCode.FAILED_PRECONDITION, "model 'gone'")
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


def test_model_file_truncated(pool: FaultPool, served: dict[str, Path], request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "weights: model file truncated (orchestrator)", expect(), test=request.node.nodeid)
    t = time.time()
    os.truncate(served["cut"], served["cut"].stat().st_size // 2)
    refused_at_submit(check, lambda: pool.submit(model="cut"), t, grpc.StatusCode.FAILED_PRECONDITION,
                      "RUN_FAULT_MODEL_REFUSED: model 'cut': MalformedGGUF")
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


def test_model_unsupported_quant(pool: FaultPool, served: dict[str, Path], request: pytest.FixtureRequest) -> None:
    check = FaultCheck(pool, "weights: unsupported quant type Q8_1 (orchestrator)", expect(), test=request.node.nodeid)
    t = time.time()
    retype(served["q81"], "blk.0.attn_q.weight", QT.Q8_1)
    refused_at_submit(check, lambda: pool.submit(model="q81"), t, grpc.StatusCode.FAILED_PRECONDITION,
                      "RUN_FAULT_MODEL_REFUSED: model 'q81': UnsupportedQuantType")
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


def test_layer_range_beyond_model(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    """More stages than the model has blocks: no stage could get a layer range inside the model."""
    check = FaultCheck(pool, "weights: layer range beyond the model (31 stages of 30 blocks)", expect(),
                       test=request.node.nodeid)
    blocks = int(open_header(DEFAULT_MODEL).get("llama.block_count"))
    req = opb.SubmitRunRequest(prompt_ids=opb.PromptIds(ids=[1, 2, 3]), stages=blocks + 1, max_tokens=2)
    t = time.time()
    refused_at_submit(check, lambda: pool.stub.SubmitRun(req, timeout=30), t, grpc.StatusCode.INVALID_ARGUMENT,
                      f"{blocks + 1} stages requested but model")
    check.no_leases((0, 1, 2))
    check.survivors_alive()
    check.next_run()


# ---- on a stage host: its weights cache damaged under a live worker ----


def cache_file(pool: FaultPool, host: int) -> Path:
    """The host's weights cache copy of the default model (the only model its runs used)."""
    files = list((pool.hosts[host].state_dir / "weights").glob("*.gguf"))
    assert len(files) == 1, f"h{host}: expected one cached GGUF, found {files}"
    return files[0]


def cold_compute(pool: FaultPool, host: int) -> None:
    """Restart the host's compute process (SIGKILL; its worker starts a new one) so the next run loads cold,
    and wait until the orchestrator has seen the node Available again (not a stale Available from before)."""
    t, node = time.time(), pool.node_id(host)

    def available_again() -> None:
        if not any(e.kind == pb.NODE_AVAILABLE and e.node_id == node and e.time_us / 1e6 > t
                   for e in pool.get_events(POOL_EVENTS_RUN_ID)):
            raise NotYet(f"no NODE_AVAILABLE of node {node} since its compute process was killed")

    os.kill(pool.compute_pid(host), 9)
    wait_until("node available again", available_again, 90)
    pool.wait_pool()


def interior_tensor() -> str:
    """A tensor of the interior stage's layers (the middle block of a 3-way even split)."""
    return f"blk.{int(open_header(DEFAULT_MODEL).get('llama.block_count')) // 2}.attn_q.weight"


def stage_fault(pool: FaultPool, request: pytest.FixtureRequest, fault: str, damage: object, component: int,
                detail_has: str, *, cold: bool) -> None:
    check = FaultCheck(pool, fault, expect((pb.RUN_FAULT_WEIGHTS_LOAD_FAILED, component), detail_has=detail_has),
                       test=request.node.nodeid)
    if cold:
        cold_compute(pool, INTERIOR)
    t = time.time()
    damage(cache_file(pool, INTERIOR))  # type: ignore[operator]
    try:
        with_detail(check, check.outcome(pool.submit(max_tokens=4), t))
        check.no_leases((0, 1, 2))
        check.survivors_alive()
    except BaseException:
        pool.restart(f"h{INTERIOR}/worker")  # a new worker process re-checks its whole cache
        raise
    # Nothing restarted: the faulted stage distrusted its cache copy, so the next fetch re-checks it and
    # fetches again what is gone or bad (worker/weights.py).
    check.next_run()


def test_stage_cache_file_missing(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    stage_fault(pool, request, "weights: stage cache file missing (interior)", Path.unlink,
                C.COMPONENT_STAGE_CONTROLLER, "WeightsFetch.CacheIo", cold=False)


def test_stage_cache_file_truncated(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    name = interior_tensor()

    def cut(path: Path) -> None:  # the cache copy is laid out like the default model
        header = open_header(DEFAULT_MODEL)
        os.truncate(path, header.data_offset + header.tensor_map()[name].offset + 1)

    stage_fault(pool, request, "weights: stage cache file truncated (interior)", cut, C.COMPONENT_WORKER,
                f"tensor '{name}' ends at byte", cold=True)


def test_stage_cache_unsupported_quant(pool: FaultPool, request: pytest.FixtureRequest) -> None:
    name = interior_tensor()
    stage_fault(pool, request, "weights: stage cache header rewritten to Q8_1 (interior)",
                lambda path: retype(path, name, QT.Q8_1), C.COMPONENT_WORKER, name, cold=True)
