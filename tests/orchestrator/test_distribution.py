"""The orchestrator's side of distribution: models judged from the header alone (at start and at
SubmitRun), URL sources read by Range and materialised resumably, files served with a manifest,
and every source failure a named fault of the runs waiting on it."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.distribution.server import FileTable
from swactor.modelfile.manifest import Manifest
from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.config import DEFAULT_MODEL_NAME
from swactor.orchestrator.fleet.fleet import FleetError
from swactor.orchestrator.models.distributor import Distributor
from swactor.orchestrator.models.models import ModelRegistry
from swactor.orchestrator.models.sources import ModelSource, SourceError
from swactor.orchestrator.planning.planner import RunPlan
from swactor.orchestrator.runs import fsm as F
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb
from tests.fixtures.http_source import HttpSource
from tests.fixtures.synth_gguf import Shape, write_gguf

from .fakes import FakeFleet
from .harness import serving
from .helpers import MODEL_PATH, node, pool

SHAPE = Shape(layers=4, dim=512, ffn=1024, vocab=4096)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    return write_gguf(tmp_path / "src" / "m.gguf", SHAPE)


@pytest.fixture
def http(model: Path) -> Iterator[HttpSource]:
    src = HttpSource(model)
    yield src
    src.close()


def test_an_unusable_model_stops_the_orchestrator_at_start_with_the_reason(tmp_path: Path) -> None:
    bad = write_gguf(tmp_path / "mamba.gguf", arch="mamba")
    base = [sys.executable, "-m", "swactor.orchestrator.main", "--socket", str(tmp_path / "o.sock"), "--tcp", "",
            "--state-dir", str(tmp_path / "state")]
    r = subprocess.run([*base, "--model", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "RUN_FAULT_MODEL_REFUSED" in r.stderr and "UnsupportedArchitecture: architecture 'mamba'" in r.stderr
    cfg = tmp_path / "swactor.toml"
    cfg.write_text('[orchestrator]\nmodel_source = "http://127.0.0.1:9/m.gguf"\n')
    r = subprocess.run([*base, "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "http://127.0.0.1:9/m.gguf" in r.stderr and "(Unreachable)" in r.stderr


def test_a_url_model_is_judged_from_its_header_alone(model: Path, http: HttpSource) -> None:
    reg = ModelRegistry({"m": ModelSource("m", http.url())}, "m")
    loaded = reg.get("m")
    assert loaded.facts.num_layers == SHAPE.layers and loaded.facts.hidden_dim == SHAPE.dim
    assert all(r is not None for _, r in http.requests)  # Range requests only
    assert http.bytes_sent < model.stat().st_size // 4
    bad = ModelRegistry({"m": ModelSource("m", http.url())}, "m")
    http.mode = "404"
    with pytest.raises(RequestError) as e:
        bad.get("m")
    assert "404" in e.value.message and http.url() in e.value.message


def test_submit_refuses_a_model_that_changed_into_an_unsupported_one(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", SHAPE)
    reg = ModelRegistry({"m": path}, "m")
    assert reg.get("m").facts.num_layers == SHAPE.layers
    write_gguf(path, SHAPE, qtype="Q8_K")  # replaced on disk after start (Q8_K: no dequantizer)
    with pytest.raises(RequestError) as e:
        reg.get("m")
    assert e.value.message.startswith("RUN_FAULT_MODEL_REFUSED: model 'm': UnsupportedQuantType")


def plan_for(name: str) -> RunPlan:
    class P:  # only what gguf_source reads
        run_id = 42

        class model:
            model_id = name
    return P()  # type: ignore[return-value]


def distributor(tmp_path: Path, reg: ModelRegistry) -> tuple[Distributor, FileTable]:
    files = FileTable()
    d = Distributor(reg, files, state_dir=tmp_path / "state", cache_dir=tmp_path / "cache", node_id=1,
                    server_port=7442, members=lambda: (node(1),), stall_timeout_s=2.0)
    return d, files


def test_a_url_source_is_materialised_resumably_checked_and_served(tmp_path: Path, model: Path,
                                                                    http: HttpSource) -> None:
    data = model.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    reg = ModelRegistry({"m": ModelSource("m", http.url(), sha)}, "m")
    reg.get("m")
    d, files = distributor(tmp_path, reg)
    events: list[F.Input] = []

    async def go():
        http.mode, http.truncate_after = "truncate", len(data) // 2
        with pytest.raises(FleetError) as e:
            await d.gguf_source(plan_for("m"), events.append)
        assert e.value.reason == pb.RUN_FAULT_WEIGHTS_LOAD_FAILED and "Truncated" in e.value.detail
        sent = http.bytes_sent
        http.mode = "ok"
        src = await d.gguf_source(plan_for("m"), events.append)
        return sent, src

    sent, src = asyncio.run(go())
    assert http.bytes_sent - sent <= len(data) - len(data) // 2 + (1 << 20)  # resumed, not restarted
    assert src.sha256 == sha and src.size == len(data) and src.url == f"https://10.0.0.1:7442/v1/files/{sha}"
    assert src.source_url == http.url()  # the stages fetch their ranges from the URL itself (the server: fallback)
    d.stages_fetch_from_source = False  # [orchestrator].stages_fetch_from_source = false: every byte from the server
    assert asyncio.run(d.gguf_source(plan_for("m"), events.append)).source_url == ""
    served = files.get(sha)
    assert served is not None and served.path.read_bytes() == data
    assert Manifest.decode(served.manifest, expect_digest=src.manifest_sha256).file_sha256 == sha
    kinds = [e.event.kind for e in events if isinstance(e, F.Relay)]
    assert pb.WEIGHTS_DOWNLOAD_STARTED in kinds and kinds[-1] == pb.WEIGHTS_DOWNLOADED
    assert all(e.event.run_id == 42 for e in events if isinstance(e, F.Relay))


@pytest.mark.parametrize(("mode", "words"), [
    ("404", "NotFound"), ("ignore_range", "RangeIgnored"), ("416", "RangeNotSatisfiable"), ("stall", "Stalled"),
])
def test_every_source_failure_faults_the_run_by_name(tmp_path: Path, model: Path, http: HttpSource,
                                                     mode: str, words: str) -> None:
    reg = ModelRegistry({"m": ModelSource("m", http.url())}, "m")
    reg.get("m")
    d, _ = distributor(tmp_path, reg)
    http.mode = mode

    async def go():
        with pytest.raises(FleetError) as e:
            await d.gguf_source(plan_for("m"), lambda _: None)
        return e.value

    err = asyncio.run(go())
    assert err.reason == pb.RUN_FAULT_WEIGHTS_LOAD_FAILED and words in err.detail and "'m'" in err.detail
    assert not list((tmp_path / "cache").glob("*.gguf"))  # nothing half-fetched passes for the model


def test_a_configured_sha256_that_does_not_match_discards_the_download(tmp_path: Path, model: Path,
                                                                      http: HttpSource) -> None:
    src = ModelSource("m", http.url(), "0" * 64)
    with pytest.raises(SourceError) as e:
        src.materialise(tmp_path / "cache")
    assert e.value.reason == "ChecksumMismatch"
    assert not [p for p in (tmp_path / "cache").iterdir() if p.suffix in (".gguf", ".part")]


def test_a_local_file_gets_one_manifest_per_version(tmp_path: Path, model: Path) -> None:
    reg = ModelRegistry({"m": model}, "m")
    d, files = distributor(tmp_path, reg)

    async def go():
        return await d.gguf_source(plan_for("m"), lambda _: None)

    first = asyncio.run(go())
    assert list((tmp_path / "state" / "manifests").glob("*.json"))
    assert files.get(first.sha256).path == model
    assert first.source_url == ""  # a local file has no source but the model server
    write_gguf(model, SHAPE, seed=9)
    d2, _ = distributor(tmp_path, reg)
    second = asyncio.run(d2.gguf_source(plan_for("m"), lambda _: None))
    assert second.sha256 != first.sha256 and len(list((tmp_path / "state" / "manifests").glob("*.json"))) == 2


def test_a_source_failure_faults_the_run_by_name_and_the_next_run_is_served(tmp_path: Path) -> None:
    if not MODEL_PATH.exists():
        pytest.skip("run `make model`")
    src = HttpSource(MODEL_PATH)
    reg = ModelRegistry({DEFAULT_MODEL_NAME: ModelSource(DEFAULT_MODEL_NAME, src.url())}, DEFAULT_MODEL_NAME)
    reg.get("")
    d, _ = distributor(tmp_path, reg)

    class SourcedFleet(FakeFleet):
        """Provisioning waits for the GGUF to be served, as StageControlFleet does."""

        async def provision(self, plan, stage, report):
            await d.gguf_source(plan, report)
            await super().provision(plan, stage, report)

    async def main():
        async with serving(tmp_path, SourcedFleet([2]), pool(1)) as s:
            async def one() -> opb.Run:
                resp = await s.stub.SubmitRun(opb.SubmitRunRequest(prompt="hi", raw=True, max_tokens=2))
                async for u in s.stub.WatchRun(opb.WatchRunRequest(run_id=resp.run_id)):
                    if u.HasField("finished"):
                        return u.finished
                raise AssertionError("no outcome")

            src.mode = "404"
            first = await one()
            src.mode = "ok"
            return first, await one()

    try:
        first, second = asyncio.run(main())
    finally:
        src.close()
    assert first.outcome == opb.RUN_OUTCOME_FAULTED and first.reason == "RUN_FAULT_WEIGHTS_LOAD_FAILED"
    assert "NotFound" in first.detail and src.url() in first.detail
    assert second.outcome == opb.RUN_OUTCOME_COMPLETED, (second.reason, second.detail)


def test_a_url_whose_file_changed_into_an_unsupported_one_is_refused_on_its_copy(tmp_path: Path, model: Path,
                                                                                http: HttpSource) -> None:
    reg = ModelRegistry({"m": ModelSource("m", http.url())}, "m")
    reg.get("m")  # judged at start: fine
    http.path = write_gguf(tmp_path / "q8k.gguf", SHAPE, qtype="Q8_K")  # the hub's file changed since
    d, files = distributor(tmp_path, reg)

    async def go():
        with pytest.raises(FleetError) as e:
            await d.gguf_source(plan_for("m"), lambda _: None)
        return e.value

    err = asyncio.run(go())
    assert err.reason == pb.RUN_FAULT_MODEL_REFUSED and "UnsupportedQuantType" in err.detail
    assert files.get(hashlib.sha256(http.path.read_bytes()).hexdigest()) is None  # never served


def test_a_model_source_path_may_hold_spaces_and_shell_characters() -> None:
    sha = "ab" * 32
    assert ModelSource.parse("m", "/srv/my models/smol 'q4' $x.gguf") == \
        ModelSource("m", "/srv/my models/smol 'q4' $x.gguf")
    assert ModelSource.parse("m", f"/srv/my models/m.gguf sha256={sha.upper()}") == \
        ModelSource("m", "/srv/my models/m.gguf", sha)
    assert ModelSource.parse("m", "https://example.org/m.gguf").is_url
    for bad, needle in [("", "empty source"), ("/m.gguf sha256=12", "is not 'sha256=<64 hex digits>'"),
                        (f"sha256={sha}", "neither an absolute path"), ("models/m.gguf", "neither an absolute path")]:
        with pytest.raises(ValueError, match=needle):
            ModelSource.parse("m", bad)
