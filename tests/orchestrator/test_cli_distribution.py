"""The CLI's view of distribution: a progress line per download event, and `swactor models`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swactor.cli import render
from swactor.v1 import common_pb2 as pb
from swactor.v1 import orchestrator_pb2 as opb

from .fakes import FakeFleet
from .harness import registry, serving
from .helpers import pool
from .test_cli import cli

pytestmark = pytest.mark.timeout(90)


def ev(kind: int, stage: int | None = 1, **counters: int) -> pb.LifecycleEvent:
    e = pb.LifecycleEvent(kind=kind, node_id=7)
    if stage is not None:
        e.stage_index = stage
    for k, v in counters.items():
        e.counters[k] = v
    return e


def test_download_events_become_one_progress_line_each() -> None:
    assert render.download_line(ev(pb.WEIGHTS_DOWNLOAD_STARTED, bytes_total=24_000_000, bytes_cached=1_800_000)) == \
        "stage 1: weights download started: 24.0 MB, 1.8 MB already cached"
    assert render.download_line(ev(pb.WEIGHTS_DOWNLOAD_PROGRESS, bytes_done=12_000_000, bytes_total=24_000_000,
                                   rate_bps=60_000_000, eta_ms=200)) == \
        "stage 1: weights 12.0 MB/24.0 MB (50%), 60.0 MB/s, ETA 0.2 s"
    assert render.download_line(ev(pb.WEIGHTS_DOWNLOADED, None, bytes_total=98_000_000, bytes_fetched=98_000_000,
                                   duration_ms=2000)) == \
        "orchestrator: weights downloaded: 98.0 MB fetched of 98.0 MB in 2.0 s (49.0 MB/s)"
    assert render.download_line(ev(pb.STAGE_READY)) is None


def test_cached_weights_print_no_download_at_zero_bytes_per_second() -> None:
    """A stage whose cache holds every byte says so once, with no "download started" and no "0 B/s" lines."""
    assert render.download_line(ev(pb.WEIGHTS_DOWNLOAD_STARTED, bytes_total=24_000_000, bytes_cached=24_000_000)) is None
    assert render.download_line(ev(pb.WEIGHTS_DOWNLOAD_PROGRESS, bytes_done=24_000_000, bytes_total=24_000_000,
                                   rate_bps=0, eta_ms=0)) is None
    assert render.download_line(ev(pb.WEIGHTS_DOWNLOADED, bytes_total=24_000_000, bytes_fetched=0, duration_ms=3)) == \
        "stage 1: weights already cached: 24.0 MB, nothing fetched"


def test_models_lines_name_models_and_each_hosts_cache() -> None:
    resp = opb.ListModelsResponse(
        models=[opb.ServedModel(name="m", source="/m.gguf", state="ready", sha256="ab" * 32, size=98_000_000,
                                architecture="llama", num_layers=30, is_default=True)],
        nodes=[opb.NodeWeights(node_id=3, used_bytes=54_000_000, files=[opb.NodeCachedFile(
                   sha256="ab" * 32, model="m", size=98_000_000, bytes_held=54_000_000, pieces_held=224,
                   pieces_total=573, in_use=True)]),
               opb.NodeWeights(node_id=4, error="UNAVAILABLE: down")])
    lines = render.models_lines(resp)
    assert lines[0].startswith("model m (default): ready llama 30 layers sha256 abababababab")
    assert lines[1] == "node 3: cache 54.0 MB used, no limit"
    assert lines[2] == "  m: 54.0 MB of 98.0 MB held (224/573 pieces), in use"
    assert lines[3] == "node 4: cannot ask: UNAVAILABLE: down"


def test_swactor_models_against_the_orchestrator(tmp_path: Path) -> None:
    registry().get("")  # judged, as main() does at start

    async def main():
        async with serving(tmp_path, FakeFleet([2]), pool(1)) as s:
            return await cli(s.socket, "models")

    rc, out, err = asyncio.run(main())
    assert rc == 0, err
    assert out.startswith("model smollm2-135m-instruct (default): judged llama 30 layers")
