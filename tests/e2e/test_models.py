"""Other model files through the whole pipeline: local clusters serving SmolLM2 re-packed as `qwen2` at S = 2 (Q/K/V
biases, NeoX rotation), as `qwen3` at S = 3 (per-head Q/K norms) and as `phi3` at S = 2 (fused QKV and gate-up
matrices; tests/fixtures/gguf_fixtures.py), tokens equal to the float64 reference; a
file the workers would refuse is refused by `swactor demo --model` / `python -m swactor.localcluster --model`
before anything starts, naming what is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from swactor.localcluster import ClusterError, ClusterSpec, LocalCluster
from swactor.localcluster.run import follow
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc
from tests.fixtures import gguf_fixtures

from .conftest import assert_torn_down, needs_model

PROMPT = [1780, 314, 260, 3575, 282, 4649, 47]  # "What is the capital of France?" (no near-tie in its first 12 greedy steps)
STEPS = 8


def float64_reference(path: Path, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    mod = sys.modules.get("reference")  # tests/worker's own import of it, when this process ran those first
    if mod is None:
        spec = importlib.util.spec_from_file_location("reference", Path(__file__).parents[1] / "worker" / "reference.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["reference"] = mod  # its dataclasses look their module up by name (this file run alone failed)
        spec.loader.exec_module(mod)
    return mod.Reference(path).greedy(prompt, n)


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_model
@pytest.mark.parametrize(("build", "stages"), [(gguf_fixtures.build_qwen2, 2), (gguf_fixtures.build_qwen3, 3),
                                               (gguf_fixtures.build_phi3, 2)], ids=["qwen2-s2", "qwen3-s3", "phi3-s2"])
def test_other_families_run_end_to_end(build: Callable[[], Path], stages: int) -> None:
    path = build()
    want, gaps = float64_reference(path, PROMPT, STEPS)
    cut = next((i for i, g in enumerate(gaps) if g < 0.02), STEPS)
    assert cut >= STEPS // 2, f"reference near-tie at step {cut}"
    # One run slot and the prompt row by row: each stage compiles its decode graph only (the family's graphs are new
    # to the graph cache; prefill chunks and runs in flight are the default model's tests)
    spec = ClusterSpec(hosts=stages, model=path, orchestrator={"max_slots_per_stage": 1, "prefill_chunk": 0})
    cluster = LocalCluster(spec, progress=lambda line: print(line, flush=True))
    with cluster:
        pids, root = [s.pid for s in cluster.services], cluster.root
        netns = list(cluster.netns.created) if cluster.netns else []
        with cluster.channel() as ch:
            req = opb.SubmitRunRequest(stages=stages, max_tokens=STEPS, ignore_eos=True)
            req.prompt_ids.ids.extend(PROMPT)
            res = follow(orchestrator_pb2_grpc.OrchestratorStub(ch), req, timeout_s=200)
    assert res.outcome == "completed", res.summary()
    assert res.token_ids[:cut] == want[:cut] and len(res.token_ids) == STEPS
    assert_torn_down(cluster, pids, root, netns)


def _gguf(path: Path, arch: str) -> Path:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_model_refused_before_anything_starts(tmp_path: Path) -> None:
    bad = _gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ClusterError, match=r"UnsupportedArchitecture.*'gpt2'"):
        LocalCluster(ClusterSpec(hosts=1, model=bad))
    demo = subprocess.run([sys.executable, "-m", "swactor.cli.main", "demo", "--model", str(bad), "--hosts", "1"],
                          capture_output=True, text=True, timeout=60)
    assert demo.returncode == 2 and "'gpt2' is not supported" in demo.stderr, demo.stderr
    lc = subprocess.run([sys.executable, "-m", "swactor.localcluster", "--model", str(bad)], capture_output=True, text=True,
                        timeout=60)
    assert lc.returncode == 2 and "'gpt2' is not supported" in lc.stderr, lc.stderr
