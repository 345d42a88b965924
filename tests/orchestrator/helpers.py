"""Shared builders for orchestrator unit tests (fake model facts and membership views)."""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.orchestrator.fleet.nodes import GpuInfo, NodeInfo, NodeState
from swactor.orchestrator.models.gguf_model import ModelFacts

MODEL_PATH = Path(__file__).resolve().parents[2] / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# The compute processes of the in-process pipelines share one compiled-graph cache, as a host's do
# ([worker].graph_cache): a layer graph of a batch width is captured once in a test session, not again by every
# stage, test and restarted process. Empty at the session's start, so every session captures what it runs once.
GRAPH_CACHE = Path(tempfile.mkdtemp(prefix="swactor-test-graphs-"))
atexit.register(shutil.rmtree, GRAPH_CACHE, True)


def model_facts(num_layers: int = 30, hidden: int = 576, context: int = 8192) -> ModelFacts:
    return ModelFacts(model_id="test-model", path=Path("/nonexistent.gguf"), architecture="llama",
                      num_layers=num_layers, hidden_dim=hidden, max_seq_len=context, vocab_size=49152,
                      eos_token_id=2)


def node(node_id: int, state: NodeState = NodeState.AVAILABLE) -> NodeInfo:
    return NodeInfo(node_id=node_id, state=state, edge_endpoint=f"10.0.0.{node_id}:7000",
                    control_endpoint=f"10.0.0.{node_id}:7001", hostname=f"h{node_id}",
                    gpus=(GpuInfo(0, "CUDA", "H100", 80 << 30),))


def pool(*ids: int, state: NodeState = NodeState.AVAILABLE) -> tuple[NodeInfo, ...]:
    return tuple(node(i, state) for i in ids)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (root only; skips otherwise), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its file system has no space left; returns it (unlink to free)."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    return filler
