"""The generated stubs in the package are exactly what the .proto files produce now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "packaging" / "gen_protos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    fresh = _load_generator().generate(tmp_path)
    installed = ROOT / "services" / "swactor" / "v1"
    assert fresh, "no stubs generated"
    for path in fresh:
        current = installed / path.name
        assert current.exists(), f"{current} missing: run `make protos`"
        assert current.read_bytes() == path.read_bytes(), f"{current} is stale: run `make protos`"
    stale_extra = {p.name for p in installed.glob("*_pb2*.py*")} - {p.name for p in fresh}
    assert not stale_extra, f"stubs without a .proto: {sorted(stale_extra)}"


def test_every_lifecycle_event_of_the_spec_exists() -> None:
    from swactor.v1 import common_pb2

    required = """node_started node_available node_faulted pool_ready run_planned stage_provision_started
    weights_download_started weights_downloaded weights_loaded edge_provision_started edge_ready stage_ready
    readiness_barrier_passed prompt_injected object_loaded execute_step_started object_produced
    step_completed token_received run_completed run_faulted stop_run_sent stage_stopped run_torn_down""".split()
    names = set(common_pb2.LifecycleEventKind.keys())
    assert {n.upper() for n in required} <= names
