"""Judging a model from its header: every refusal names what was wrong."""

from __future__ import annotations

from pathlib import Path

from swactor.modelfile.header import read_header
from swactor.modelfile.judge import check_stages, judge
from tests.fixtures.synth_gguf import Shape, write_gguf


def judged(path: Path) -> list[str]:
    with open(path, "rb") as f:
        h = read_header(lambda n: (f.seek(0), f.read(n))[1])[0]
    return [str(r) for r in judge(h, path.stat().st_size)]


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


def test_stage_count_against_layers(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "ok.gguf", Shape(layers=4))
    with open(path, "rb") as f:
        h = read_header(lambda n: (f.seek(0), f.read(n))[1])[0]
    assert check_stages(h, 4) is None
    r = check_stages(h, 5)
    assert r is not None and r.reason == "TooManyStages" and "4 blocks" in r.detail
