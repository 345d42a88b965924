"""Judging a model from its header: every refusal names what was wrong."""

from __future__ import annotations

from pathlib import Path

from swactor.modelfile.header import GgufHeader, read_header
from swactor.modelfile.judge import check_stages, judge
from swactor.modelfile.memory import memory_profile
from swactor.modelfile.support import LONGROPE_FACTORS, QK_NORM
from tests.fixtures.synth_gguf import Shape, write_gguf


def header(path: Path) -> GgufHeader:
    with open(path, "rb") as f:
        return read_header(lambda n: (f.seek(0), f.read(n))[1])[0]


def judged(path: Path) -> list[str]:
    return [str(r) for r in judge(header(path), path.stat().st_size)]


def test_a_supported_model_passes(tmp_path: Path) -> None:
    assert judged(write_gguf(tmp_path / "ok.gguf")) == []


def test_architecture_tokenizer_quant_and_tensors_are_named(tmp_path: Path) -> None:
    [r] = judged(write_gguf(tmp_path / "a.gguf", arch="gemma3"))
    assert r.startswith("UnsupportedArchitecture: architecture 'gemma3'")
    [r] = judged(write_gguf(tmp_path / "t.gguf", tokenizer_model="bert"))
    assert r.startswith("UnsupportedTokenizer") and "'bert'" in r
    [r] = judged(write_gguf(tmp_path / "q.gguf", qtype="Q8_K"))  # no dequantizer: not declared
    assert r.startswith("UnsupportedQuantType") and "Q8_K" in r and "token_embd.weight" in r
    [r] = judged(write_gguf(tmp_path / "m.gguf", drop=("blk.1.ffn_up.weight",)))
    assert r == "MissingTensor: 1 tensor(s) missing: blk.1.ffn_up.weight"
    [r] = judged(write_gguf(tmp_path / "x.gguf", extra=(("blk.0.attn_q_norm.weight", (256,), "F32"),)))
    assert r.startswith("UnsupportedArchitecture") and "blk.0.attn_q_norm.weight" in r


def test_qwen3_needs_its_per_head_qk_norms_and_counts_them(tmp_path: Path) -> None:
    shape = Shape(layers=2)
    hd = shape.dim // shape.heads
    norms = tuple((f"blk.{i}.{t}", (hd,), "F32") for i in range(shape.layers) for t in QK_NORM)
    qwen3 = write_gguf(tmp_path / "q3.gguf", shape, arch="qwen3", extra=norms)
    assert judged(qwen3) == []
    [r] = judged(write_gguf(tmp_path / "bare.gguf", shape, arch="qwen3"))
    assert r.startswith("MissingTensor: 4 tensor(s) missing") and "blk.0.attn_q_norm.weight" in r
    [r] = judged(write_gguf(tmp_path / "q2.gguf", shape, arch="qwen2", extra=norms))  # qwen2 has no such part
    assert r.startswith("UnsupportedArchitecture") and "attn_q_norm" in r
    with_norms, without = (memory_profile(header(p)) for p in (qwen3, write_gguf(tmp_path / "l.gguf", shape)))
    assert [a - b for a, b in zip(with_norms.layer_weights, without.layer_weights, strict=True)] == [2 * hd * 4] * shape.layers


def test_phi3_needs_its_fused_matrices_and_counts_them(tmp_path: Path) -> None:
    shape = Shape(layers=2)
    phi3 = write_gguf(tmp_path / "p3.gguf", shape, arch="phi3", fused=True, tied=False)
    assert judged(phi3) == []
    for missing in ("blk.1.attn_qkv.weight", "blk.0.ffn_up.weight"):
        [r] = judged(write_gguf(tmp_path / "m.gguf", shape, arch="phi3", fused=True, drop=(missing,)))
        assert r == f"MissingTensor: 1 tensor(s) missing: {missing}"
    missing, unknown = judged(write_gguf(tmp_path / "split.gguf", shape, arch="phi3"))  # phi3 with llama's block
    assert missing.startswith("MissingTensor") and "blk.0.attn_qkv.weight" in missing
    assert unknown.startswith("UnsupportedArchitecture") and "blk.0.attn_k.weight" in unknown
    missing, unknown = judged(write_gguf(tmp_path / "l.gguf", shape, fused=True))  # llama has no fused matrices
    assert missing.startswith("MissingTensor") and "blk.0.attn_q.weight" in missing
    assert unknown.startswith("UnsupportedArchitecture") and "blk.0.attn_qkv.weight" in unknown
    [r] = judged(write_gguf(tmp_path / "long.gguf", shape, arch="phi3", fused=True,
                            extra=tuple((t, (32,), "F32") for t in LONGROPE_FACTORS)))
    assert r.startswith("UnsupportedArchitecture") and all(t in r for t in LONGROPE_FACTORS) and "LongRoPE" in r
    # the fused matrices are the bytes of their parts: the same profile as the llama block's
    assert memory_profile(header(phi3)) == memory_profile(header(write_gguf(tmp_path / "ll.gguf", shape, tied=False)))


def test_stage_count_against_layers(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "ok.gguf", Shape(layers=4))
    with open(path, "rb") as f:
        h = read_header(lambda n: (f.seek(0), f.read(n))[1])[0]
    assert check_stages(h, 4) is None
    r = check_stages(h, 5)
    assert r is not None and r.reason == "TooManyStages" and "4 blocks" in r.detail
