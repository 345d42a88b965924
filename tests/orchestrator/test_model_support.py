"""What the orchestrator accepts at SubmitRun is what the workers run (modelfile.support): qwen2 (with
its Q/K/V biases), qwen3 (with its per-head Q/K norms), phi3 (with its fused Q/K/V and gate/up, and LongRoPE's
factor sets where it has them), gemma3 (with its Q/K and
post norms) and every declared quant type are served, an unknown architecture, a type without a
dequantizer or half a bias group is refused naming it, from the header alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from swactor.modelfile import support
from swactor.orchestrator.api.errors import RequestError
from swactor.orchestrator.models.models import ModelRegistry
from tests.fixtures.synth_gguf import Shape, write_gguf

SHAPE = Shape(layers=2, dim=256, ffn=512, vocab=512)
KV = SHAPE.dim * SHAPE.kv_heads // SHAPE.heads


def biases(layers: range, names: tuple[str, ...] = ("attn_q", "attn_k", "attn_v")) -> tuple[tuple[str, tuple[int], str], ...]:
    width = {"attn_q": SHAPE.dim, "attn_k": KV, "attn_v": KV}
    return tuple((f"blk.{i}.{n}.bias", (width[n],), "F32") for i in layers for n in names)


def refusal(path: Path) -> str:
    with pytest.raises(RequestError) as e:
        ModelRegistry({"m": path}, "m").get("m")
    return e.value.message


def test_qwen2_with_biases_is_served(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "q.gguf", SHAPE, arch="qwen2", extra=biases(range(SHAPE.layers)))
    facts = ModelRegistry({"m": path}, "m").get("m").facts
    assert (facts.architecture, facts.num_layers, facts.hidden_dim) == ("qwen2", SHAPE.layers, SHAPE.dim)


def test_qwen3_with_its_qk_norms_is_served_and_without_them_refused(tmp_path: Path) -> None:
    hd = SHAPE.dim // SHAPE.heads
    norms = tuple((f"blk.{i}.{t}", (hd,), "F32") for i in range(SHAPE.layers) for t in support.QK_NORM)
    facts = ModelRegistry({"m": write_gguf(tmp_path / "q3.gguf", SHAPE, arch="qwen3", extra=norms)}, "m").get("m").facts
    assert (facts.architecture, facts.num_layers, facts.hidden_dim) == ("qwen3", SHAPE.layers, SHAPE.dim)
    msg = refusal(write_gguf(tmp_path / "bare.gguf", SHAPE, arch="qwen3"))
    assert "MissingTensor" in msg and "attn_q_norm" in msg


def test_phi3_with_its_fused_matrices_is_served_and_without_them_refused(tmp_path: Path) -> None:
    facts = ModelRegistry({"m": write_gguf(tmp_path / "p3.gguf", SHAPE, arch="phi3", fused=True)}, "m").get("m").facts
    assert (facts.architecture, facts.num_layers, facts.hidden_dim) == ("phi3", SHAPE.layers, SHAPE.dim)
    msg = refusal(write_gguf(tmp_path / "no-qkv.gguf", SHAPE, arch="phi3", fused=True, drop=("blk.1.attn_qkv.weight",)))
    assert "MissingTensor" in msg and "blk.1.attn_qkv.weight" in msg
    long = (("rope_factors_long.weight", (32,), "F32"), ("rope_factors_short.weight", (32,), "F32"))  # LongRoPE: served
    facts = ModelRegistry({"m": write_gguf(tmp_path / "long.gguf", SHAPE, arch="phi3", fused=True, extra=long)}, "m").get("m").facts
    assert facts.architecture == "phi3"
    msg = refusal(write_gguf(tmp_path / "half.gguf", SHAPE, arch="phi3", fused=True, extra=long[:1]))
    assert "MissingTensor" in msg and "rope_factors_short.weight" in msg


def test_gemma3_with_its_norms_is_served_and_without_them_refused(tmp_path: Path) -> None:
    hd = SHAPE.dim // SHAPE.heads
    norms = tuple((f"blk.{i}.{t}", (hd,), "F32") for i in range(SHAPE.layers) for t in support.QK_NORM)
    norms += tuple((f"blk.{i}.{t}", (SHAPE.dim,), "F32") for i in range(SHAPE.layers) for t in support.POST_NORMS)
    path = write_gguf(tmp_path / "g3.gguf", SHAPE, arch="gemma3", extra=norms)
    facts = ModelRegistry({"m": path}, "m").get("m").facts
    assert (facts.architecture, facts.num_layers, facts.hidden_dim) == ("gemma3", SHAPE.layers, SHAPE.dim)
    msg = refusal(write_gguf(tmp_path / "bare.gguf", SHAPE, arch="gemma3", extra=norms[:-1]))
    assert "MissingTensor" in msg and "post_ffw_norm" in msg


@pytest.mark.parametrize("qtype", sorted(support.PACKED_TYPES + support.EXPANDED_TYPES))
def test_every_declared_quant_type_is_served(tmp_path: Path, qtype: str) -> None:
    path = write_gguf(tmp_path / "m.gguf", SHAPE, qtype=qtype, sparse=True)
    assert ModelRegistry({"m": path}, "m").get("m").facts.num_layers == SHAPE.layers


def test_unknown_architecture_type_and_half_a_bias_group_are_refused_by_name(tmp_path: Path) -> None:
    msg = refusal(write_gguf(tmp_path / "a.gguf", SHAPE, arch="mamba"))
    assert msg.startswith("RUN_FAULT_MODEL_REFUSED: model 'm': UnsupportedArchitecture: architecture 'mamba'")
    assert "gemma2, gemma3, llama, phi3, qwen2" in msg
    msg = refusal(write_gguf(tmp_path / "k.gguf", SHAPE, qtype="Q8_K", sparse=True))
    assert "UnsupportedQuantType" in msg and "Q8_K" in msg
    msg = refusal(write_gguf(tmp_path / "b.gguf", SHAPE, arch="qwen2", extra=biases(range(1))))
    assert "UnsupportedArchitecture" in msg and "attn_q.bias" in msg
    msg = refusal(write_gguf(tmp_path / "l.gguf", SHAPE, extra=biases(range(SHAPE.layers))))  # llama has no biases
    assert "UnsupportedArchitecture" in msg and "blk.0.attn_k.bias" in msg
