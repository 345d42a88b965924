"""Judging a model from its header: every refusal names what was wrong."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType

from swactor.modelfile.header import GgufHeader, read_header
from swactor.modelfile.judge import check_stages, judge
from swactor.modelfile.memory import memory_profile
from swactor.modelfile.params import LlamaParams, ModelRefused, read_params
from swactor.modelfile.support import LONGROPE_FACTORS, POST_NORMS, QK_NORM
from swactor.worker.compute import GGUFModel
from tests.fixtures.gguf_fixtures import (
    SMALL_EXPERT_FFN,
    SMALL_EXPERTS,
    Field,
    small_fields,
    small_moe,
    write_raw,
)
from tests.fixtures.synth_gguf import Shape, write_gguf


def header(path: Path) -> GgufHeader:
    with open(path, "rb") as f:
        return read_header(lambda n: (f.seek(0), f.read(n))[1])[0]


def judged(path: Path) -> list[str]:
    return [str(r) for r in judge(header(path), path.stat().st_size)]


def test_a_supported_model_passes(tmp_path: Path) -> None:
    assert judged(write_gguf(tmp_path / "ok.gguf")) == []


def test_architecture_tokenizer_quant_and_tensors_are_named(tmp_path: Path) -> None:
    [r] = judged(write_gguf(tmp_path / "a.gguf", arch="mamba"))
    assert r.startswith("UnsupportedArchitecture: architecture 'mamba'")
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


def test_gemma3_needs_its_norms_and_counts_them(tmp_path: Path) -> None:
    shape = Shape(layers=2)
    hd = shape.dim // shape.heads
    qk = tuple((f"blk.{i}.{t}", (hd,), "F32") for i in range(shape.layers) for t in QK_NORM)
    post = tuple((f"blk.{i}.{t}", (shape.dim,), "F32") for i in range(shape.layers) for t in POST_NORMS)
    gemma3 = write_gguf(tmp_path / "g3.gguf", shape, arch="gemma3", tokenizer_model="llama", extra=qk + post)
    assert judged(gemma3) == []
    [r] = judged(write_gguf(tmp_path / "bare.gguf", shape, arch="gemma3", tokenizer_model="llama", extra=qk))
    assert r.startswith("MissingTensor: 4 tensor(s) missing") and "blk.0.post_attention_norm.weight" in r
    [r] = judged(write_gguf(tmp_path / "l.gguf", shape, extra=post))  # the llama block has no such part
    assert r.startswith("UnsupportedArchitecture") and "post_ffw_norm" in r
    [r] = judged(write_gguf(tmp_path / "g2.gguf", shape, arch="gemma2", tokenizer_model="llama", extra=post, tied=False))
    assert r.startswith("UnsupportedArchitecture") and "output.weight" in r  # llama.cpp's gemma2 reads the embedding
    with_norms, without = (memory_profile(header(p)) for p in (gemma3, write_gguf(tmp_path / "plain.gguf", shape)))
    per_layer = 2 * hd * 4 + 2 * shape.dim * 4
    assert [a - b for a, b in zip(with_norms.layer_weights, without.layer_weights, strict=True)] == [per_layer] * shape.layers


def test_gemma_hyper_parameters_as_llama_cpp_reads_them(tmp_path: Path) -> None:
    """Sliding window, its layers and RoPE, soft-caps and the 27B attention scale from the keys llama.cpp reads
    (src/models/gemma3.cpp, gemma2.cpp), with its defaults where a key is absent."""
    def params(arch: str, *keys: tuple[str, object, GGUFValueType], layers: int = 12) -> LlamaParams:
        fields = [f for f in small_fields(arch) if not f.key.endswith(".block_count")]
        fields += [Field(f"{arch}.block_count", layers, GGUFValueType.UINT32), *(Field(f"{arch}.{k}", v, t) for k, v, t in keys)]
        path = tmp_path / f"{arch}-{len(list(tmp_path.iterdir()))}.gguf"
        write_raw(path, arch, fields, {})
        return read_params(header(path))

    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    p = params("gemma3", ("attention.sliding_window", 512, u32), ("rope.freq_base", 1e6, f32))
    assert p.swa_window == 512 and [i for i, s in enumerate(p.swa_layers) if not s] == [5, 11]
    assert (p.rope_base, p.rope_base_swa, p.embed_scale, p.attn_softcap, p.final_softcap) == (1e6, 10000.0, 16.0, 0.0, 0.0)
    assert p.post_norms and p.gelu and p.qk_norm and p.rope_neox and p.attn_scale == 1 / 8  # head_dim 64
    p = params("gemma3", ("attention.sliding_window", 512, u32), ("attention.sliding_window_pattern", 4, u32),
               ("rope.freq_base_swa", 5e4, f32), ("rope.scaling.type", "linear", GGUFValueType.STRING),
               ("rope.scaling.factor", 8.0, f32))
    assert [i for i, s in enumerate(p.swa_layers) if not s] == [3, 7, 11] and p.rope_base_swa == 5e4
    assert p.rope_scaling.factor == 8.0 and p.rope_scaling_swa.kind == "none"  # only the global layers are scaled
    assert not any(params("gemma3").swa_layers)  # no window key: every layer global
    head_dim_32 = (("attention.key_length", 32, u32), ("attention.value_length", 32, u32))
    assert params("gemma3", *head_dim_32).attn_scale == 1 / math.sqrt(32)
    assert params("gemma3", *head_dim_32, layers=62).attn_scale == 1 / 8  # the 27B's: 1/sqrt(256 / 4 heads)
    p = params("gemma2")
    assert (p.swa_window, p.attn_softcap, p.final_softcap) == (4096, 50.0, 30.0) and p.swa_layers[:4] == (True, False, True, False)
    assert p.rope_base_swa == p.rope_base and p.rope_scaling_swa == p.rope_scaling and not p.qk_norm
    with pytest.raises(ModelRefused, match="sliding_window_pattern"):
        params("gemma3", ("attention.sliding_window", 512, u32), ("attention.sliding_window_pattern", [True, False], GGUFValueType.ARRAY))


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
    # the fused matrices are the bytes of their parts: the same profile as the llama block's
    assert memory_profile(header(phi3)) == memory_profile(header(write_gguf(tmp_path / "ll.gguf", shape, tied=False)))


def test_longrope_factors_are_read_and_malformed_ones_refused_by_name(tmp_path: Path) -> None:
    """A phi3 file with both LongRoPE sets of [rope_dim/2] (head_dim 64: 32) is served, as longrope scaling whose original
    context defaults to the file's context_length, its planner memory that of the file without them (host-side: only
    the RoPE tables, counted already, reach the device); a set of another length, half the pair, the sets in an
    architecture that does not declare them, or beside rope_freqs, are refused naming the tensor."""
    shape = Shape(layers=2)
    sets = tuple((t, (32,), "F32") for t in LONGROPE_FACTORS)
    long = write_gguf(tmp_path / "long.gguf", shape, arch="phi3", fused=True, extra=sets)
    assert judged(long) == []
    s = read_params(header(long)).rope_scaling
    assert (s.kind, s.original_context, s.attn_factor) == ("longrope", 2048, 1.0)
    plain = write_gguf(tmp_path / "plain.gguf", shape, arch="phi3", fused=True)
    assert memory_profile(header(long)) == memory_profile(header(plain))
    [r] = judged(write_gguf(tmp_path / "len.gguf", shape, arch="phi3", fused=True,
                            extra=(sets[0], (LONGROPE_FACTORS[1], (64,), "F32"))))
    assert r.startswith("MalformedGGUF") and f"{LONGROPE_FACTORS[1]!r} has shape [64], not [32]" in r
    for present, missing in (LONGROPE_FACTORS, LONGROPE_FACTORS[::-1]):
        [r] = judged(write_gguf(tmp_path / "half.gguf", shape, arch="phi3", fused=True, extra=((present, (32,), "F32"),)))
        assert r.startswith("MissingTensor") and present in r and missing in r
    [r] = judged(write_gguf(tmp_path / "llama.gguf", shape, extra=sets))
    assert r.startswith("UnsupportedArchitecture") and LONGROPE_FACTORS[0] in r and "phi3" in r
    [r] = judged(write_gguf(tmp_path / "both.gguf", shape, arch="phi3", fused=True, extra=(*sets, ("rope_freqs.weight", (32,), "F32"))))
    assert r.startswith("UnsupportedRopeScaling") and "rope_freqs.weight" in r


def test_stage_count_against_layers(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "ok.gguf", Shape(layers=4))
    with open(path, "rb") as f:
        h = read_header(lambda n: (f.seek(0), f.read(n))[1])[0]
    assert check_stages(h, 4) is None
    r = check_stages(h, 5)
    assert r is not None and r.reason == "TooManyStages" and "4 blocks" in r.detail


@pytest.mark.parametrize("arch", ["qwen3moe", "llama"])
def test_experts_are_needed_named_and_counted(tmp_path: Path, arch: str) -> None:
    """A Mixture-of-Experts file (qwen3moe; Mixtral-style llama) runs with its router and every expert's stacked
    matrices; a missing one, a router the compute does not implement or a dense FFN beside the experts is refused by
    name; the memory estimate counts every expert (a stage holds them all, though a token reads 2 of 4)."""
    u32 = GGUFValueType.UINT32

    def write(name: str, drop: tuple[str, ...] = (), keys: tuple[Field, ...] = (),
              extra: dict[str, tuple[np.ndarray, QT]] | None = None) -> Path:
        fields, tensors = small_moe(arch, drop=drop, keys=keys)
        write_raw(tmp_path / name, arch, fields, {**tensors, **(extra or {})})
        return tmp_path / name

    ok = write("ok.gguf")
    assert judged(ok) == []
    p = read_params(header(ok))
    assert (p.n_experts, p.n_experts_used, p.ffn_dim, p.expert_weights_norm) == (4, 2, SMALL_EXPERT_FFN, True)
    [r] = judged(write("m.gguf", drop=("blk.1.ffn_down_exps.weight",)))
    assert r == "MissingTensor: 1 tensor(s) missing: blk.1.ffn_down_exps.weight"
    with pytest.raises(ModelRefused, match=r"MissingTensor: tensor 'blk.0.ffn_gate_inp.weight'"):
        GGUFModel(write("r.gguf", drop=("blk.0.ffn_gate_inp.weight",))).stage_tensors(0, 1)
    [r] = judged(write("g.gguf", keys=(Field(f"{arch}.expert_gating_func", 2, u32),)))
    assert r.startswith("UnsupportedArchitecture") and f"{arch}.expert_gating_func 2" in r and "softmax" in r
    [r] = judged(write("k.gguf", keys=(Field(f"{arch}.expert_used_count", 5, u32),)))
    assert r.startswith("MalformedGGUF") and "expert_used_count 5" in r
    dense = {"blk.0.ffn_gate.weight": (np.zeros((SMALL_EXPERT_FFN, 256), np.float32), QT.F32)}
    [r] = judged(write("d.gguf", extra=dense))  # a dense FFN beside the experts: nothing would read it
    assert r.startswith("UnsupportedArchitecture") and "blk.0.ffn_gate.weight" in r
    shared = {"blk.0.ffn_up_shexp.weight": (np.zeros((SMALL_EXPERT_FFN, 256), np.float32), QT.F32)}
    [r] = judged(write("s.gguf", extra=shared))  # neither family has a shared expert in llama.cpp
    assert r.startswith("UnsupportedArchitecture") and "blk.0.ffn_up_shexp.weight" in r
    experts = 3 * SMALL_EXPERTS * SMALL_EXPERT_FFN * 256 * 4 + SMALL_EXPERTS * 256 * 4  # float32 experts and router
    norms = 2 * 256 * 4 + (2 * 64 * 4 if arch == "qwen3moe" else 0)
    attn = (256 * 256 * 2 + 128 * 256 * 2) * 4
    assert memory_profile(header(ok)).layer_weights == (experts + norms + attn,) * 2


def test_qwen3moe_without_expert_count_is_refused(tmp_path: Path) -> None:
    fields, tensors = small_moe("qwen3moe")
    write_raw(tmp_path / "q.gguf", "qwen3moe", [f for f in fields if f.key != "qwen3moe.expert_count"], tensors)
    [r] = judged(tmp_path / "q.gguf")
    assert r.startswith("MissingMetadata") and "qwen3moe.expert_count" in r
