"""A stage node provisioned with a URL: the StageController fetches its ranges from a real model
server (mutual TLS) into the weights cache before ConfigureRole, reports the download, and lists
the cache over StageControl.ListWeights. Worker and edges are the node fakes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from swactor.common import control_tls
from swactor.common.grpcio import create_server
from swactor.distribution.cache import WeightsCache
from swactor.distribution.fetcher import Target
from swactor.distribution.stagefetch import FetchPool
from swactor.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from swactor.worker.node import StageNode
from swactor.worker.process import wire
from swactor.worker.service import SERVICE_NAME, StageControlServicer
from tests.distribution.served import ORCH as SERVER_ORCH
from tests.distribution.served import SECRET as SERVER_SECRET
from tests.distribution.served import serve as serve_model
from tests.fixtures.synth_gguf import Shape, write_gguf

from .node_fakes import UNLEASED, FakeArenaPort, FakeCtl, FakeDriverPort, FakeMembership
from .plans import provision

pytestmark = pytest.mark.timeout(60)
NODE = 5
SHAPE = Shape(layers=30, dim=576, ffn=1536, vocab=2048)  # the plan's layer counts are SmolLM2's


def url_provision(served, *, run_id: int, digest: str | None = None) -> stage_pb2.ProvisionStageRequest:
    m = served.manifest
    req = provision(node_id=NODE, orchestrator=SERVER_ORCH, run_id=run_id)
    req.gguf_source.CopyFrom(stage_pb2.GgufSource(url=served.url, sha256=m.file_sha256,
                                                  manifest_sha256=digest or m.digest(), size=m.size))
    return req


async def updates(s, run_id: int, until: str) -> list[stage_pb2.StageUpdate]:
    out = []
    async for u in s.WatchStage(stage_pb2.WatchStageRequest(run_id=run_id), timeout=30):
        out.append(u)
        if u.WhichOneof("update") in (until, "fault"):
            break
    return out


@contextlib.asynccontextmanager
async def stage_control(tmp_path: Path, ctl: FakeCtl) -> AsyncIterator[stage_pb2_grpc.StageControlStub]:
    """A stage node fetching into tmp_path/weights from the test model server, behind its real mTLS
    StageControl server; the orchestrator's stub to it."""
    ctx = control_tls.model_client_context(SERVER_SECRET, NODE)
    pool = FetchPool(WeightsCache(tmp_path / "weights"), lambda u, name: Target(u, ctx, name), progress_interval_s=0.0)
    node = StageNode(NODE, ctl, FakeArenaPort(), FakeDriverPort(), FakeMembership(), weights=pool,
                     lease_window_s=UNLEASED)
    server, port, _ = create_server(tcp_address="127.0.0.1:0", service_names=[SERVICE_NAME],
                                    server_credentials=control_tls.server_credentials(SERVER_SECRET, NODE),
                                    options=control_tls.keepalive_options(server=True))
    stage_pb2_grpc.add_StageControlServicer_to_server(StageControlServicer(node), server)
    await server.start()
    await node.start()
    ch = control_tls.channel(SERVER_SECRET, SERVER_ORCH, f"127.0.0.1:{port}", NODE)
    try:
        yield stage_pb2_grpc.StageControlStub(ch)
    finally:
        await ch.close()
        await server.stop(None)
        await node.close()


def test_a_url_stage_fetches_then_configures_and_lists_its_cache(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    served = serve_model(write_gguf(tmp_path / "src" / "m.gguf", SHAPE), piece_bytes=64 << 10)
    ctl = FakeCtl()

    async def body() -> None:
        async with stage_control(tmp_path, ctl) as s:
            await s.ProvisionStage(url_provision(served, run_id=77))
            ups = await updates(s, 77, "ready")
            assert ups[-1].HasField("ready"), ups[-1]
            kinds = [common_pb2.LifecycleEventKind.Name(u.event.kind) for u in ups if u.HasField("event")]
            started, done = kinds.index("WEIGHTS_DOWNLOAD_STARTED"), kinds.index("WEIGHTS_DOWNLOADED")
            assert started < kinds.index("WEIGHTS_DOWNLOAD_PROGRESS") < done < kinds.index("WEIGHTS_LOADED")
            [configure] = [c for c in ctl.sent if isinstance(c, wire.ConfigureRole)]
            path = configure.config["gguf_path"]
            assert path == str(tmp_path / "weights" / f"{served.manifest.file_sha256}.gguf")
            assert configure.config["gguf_sha256"] == ""  # ranges verified; the sparse file is not hashed again
            listing = await s.ListWeights(stage_pb2.ListWeightsRequest())
            [f] = listing.files
            assert f.sha256 == served.manifest.file_sha256 and f.in_use and 0 < f.bytes_held < f.size
            await s.StopRun(stage_pb2.StopStageRunRequest(run_id=77))
            await updates(s, 77, "stopped")
            # A plan whose manifest digest is not the server's: refused by name, nothing fetched.
            await s.ProvisionStage(url_provision(served, run_id=78, digest="0" * 64))
            fault = (await updates(s, 78, "fault"))[-1].fault
            assert fault.reason == common_pb2.RUN_FAULT_WEIGHTS_LOAD_FAILED
            assert fault.cause == "WeightsFetch.ManifestMismatch"
            await s.StopRun(stage_pb2.StopStageRunRequest(run_id=78))

    try:
        asyncio.run(body())
    finally:
        served.close()


def test_a_load_failure_makes_the_next_fetch_recheck_the_cache_copy(tmp_path: Path) -> None:
    """The compute process could not load the cache file (it was cut short under the worker): the stage
    faults, and the node's next fetch re-hashes the copy and fetches again what the cut took."""
    import os

    (tmp_path / "src").mkdir()
    served = serve_model(write_gguf(tmp_path / "src" / "m.gguf", SHAPE), piece_bytes=64 << 10)
    ctl = FakeCtl(role_failure=common_pb2.ROLE_FAILURE_WEIGHTS_LOAD_FAILED)

    async def body() -> None:
        path = tmp_path / "weights" / f"{served.manifest.file_sha256}.gguf"
        async with stage_control(tmp_path, ctl) as s:
            await s.ProvisionStage(url_provision(served, run_id=81))
            first = (await updates(s, 81, "fault"))[-1]
            assert first.fault.cause == "ROLE_FAILURE_WEIGHTS_LOAD_FAILED", first
            await s.StopRun(stage_pb2.StopStageRunRequest(run_id=81))
            await updates(s, 81, "stopped")
            fetched = served.served_bytes()
            os.truncate(path, path.stat().st_size // 2)  # what the load would have met
            ctl.role_failure = None
            await s.ProvisionStage(url_provision(served, run_id=82))
            ups = await updates(s, 82, "ready")
            assert ups[-1].HasField("ready"), ups[-1]
            again = served.served_bytes() - fetched
            assert 0 < again < fetched, (again, fetched)  # the cut part only, not the whole stage
            await s.StopRun(stage_pb2.StopStageRunRequest(run_id=82))
            await updates(s, 82, "stopped")

    try:
        asyncio.run(body())
    finally:
        served.close()
