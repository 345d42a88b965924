"""Shared builders for orchestrator unit tests (fake model facts and membership views)."""

from __future__ import annotations

from pathlib import Path

from swactor.orchestrator.gguf_model import ModelFacts
from swactor.orchestrator.nodes import GpuInfo, NodeInfo, NodeState

MODEL_PATH = Path(__file__).resolve().parents[2] / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


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
