"""The support declaration and the compute core agree (the declaration is what the orchestrator judges
by and what the compute core loads by)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

from swactor.modelfile import support
from swactor.orchestrator.models.gguf_model import TokenizerData
from swactor.orchestrator.tokens.tokenizer import Tokenizer
from swactor.worker.compute import gguf_weights, linear, quant


def test_quant_types_are_what_the_compute_core_loads() -> None:
    assert {q.name for q in quant.BLOCK} == set(support.QUANT_TYPES)
    assert set(support.QUANT_TYPES) <= set(QT.__members__)
    assert len(support.QUANT_TYPES) == len(support.FLOAT_TYPES + support.PACKED_TYPES + support.EXPANDED_TYPES)
    assert {q.name for q in linear.PACKED} == set(support.PACKED_TYPES)
    for name in sorted(support.QUANT_TYPES):  # each declared type dequantizes, with our code or gguf's
        n, nb = GGML_QUANT_SIZES[QT[name]]
        out = quant.dequantize(np.zeros((2, nb), np.uint8), QT[name], n, f"t.{name}")
        assert out.shape == (2, n) and out.dtype == np.float32, name


@pytest.mark.parametrize("qtype", sorted((q for q in QT if q.name not in support.QUANT_TYPES), key=lambda q: q.name))
def test_undeclared_types_are_refused_by_the_compute_core(qtype: QT) -> None:
    with pytest.raises(quant.UnsupportedQuant) as e:
        quant.row_bytes(qtype, 256, "blk.0.attn_q.weight")
    assert e.value.reason == "UnsupportedQuantType" and qtype.name in str(e.value)


def test_architectures_are_what_the_compute_core_implements() -> None:
    assert set(support.ARCHITECTURES) == {"llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3"}
    layer = {f"{t}.weight" for t in gguf_weights.LAYER_TENSORS}
    assert {f"{t}.weight" for t in gguf_weights.QK_NORM_TENSORS} == set(support.QK_NORM)
    assert {f"{t}.weight" for t in gguf_weights.POST_NORM_TENSORS} == set(support.POST_NORMS)
    fused = {f"{t}.weight" for t in gguf_weights.FUSED_TENSORS}
    assert fused == {support.ATTN_QKV, support.FFN_GATE_UP}
    parts = {f"{p}.weight" for ps in gguf_weights.FUSED_TENSORS.values() for p in ps}
    assert parts <= layer
    experts = {f"{t}.weight" for t in gguf_weights.EXPERT_TENSORS}
    assert experts == set(support.EXPERT_FFN) and set(support.DENSE_FFN) <= layer
    for arch in support.ARCHITECTURES.values():  # the llama block (its fused form where declared), Q/K and post norms
        block = (layer - parts) | fused if arch.fused_qkv_gate_up else layer
        if arch.moe == "always":  # the experts in place of the dense FFN
            block = (block - set(support.DENSE_FFN)) | experts
        if arch.moe != "never":  # a file with experts: its blocks are the dense block's with the experts' FFN
            assert set(arch.block_tensors(True)) == (block - set(support.DENSE_FFN)) | experts | (
                set(support.QK_NORM) if arch.qk_norm else set())
        else:
            assert arch.block_tensors(True) == arch.layer_tensors
        assert set(arch.layer_tensors) == block | (set(support.QK_NORM) if arch.qk_norm else set()) | (
            set(support.POST_NORMS) if arch.post_norms else set())
    a = support.ARCHITECTURES
    assert [(n, a[n].rope_neox, a[n].qk_norm, a[n].fused_qkv_gate_up, a[n].optional_layer_groups)
            for n in ("llama", "qwen2", "qwen3", "phi3")] == [
        ("llama", False, False, False, ()), ("qwen2", True, False, False, (support.QKV_BIAS,)),
        ("qwen3", True, True, False, ()), ("phi3", True, False, True, ())]
    gemma = [(n, a[n].rope_neox, a[n].qk_norm, a[n].embed_scale, a[n].post_norms, a[n].gelu, a[n].swa_period,
              a[n].swa_rope_base, a[n].attn_softcap, a[n].final_softcap) for n in ("gemma2", "gemma3")]
    assert gemma == [("gemma2", True, False, True, True, True, 2, None, 50.0, 30.0),
                     ("gemma3", True, True, True, True, True, 6, 10000.0, None, 0.0)]
    assert not any(a[n].embed_scale or a[n].post_norms or a[n].gelu or a[n].swa_period for n in ("llama", "qwen2", "qwen3", "phi3"))
    assert support.ROPE_SCALING_TYPES == ("none", "linear", "yarn", "llama3", "longrope")
    assert {n: x.moe for n, x in a.items() if x.moe != "never"} == {"llama": "optional", "qwen3moe": "always"}
    assert (a["qwen3moe"].rope_neox, a["qwen3moe"].qk_norm) == (True, True)


@pytest.mark.parametrize("model", sorted(support.TOKENIZER_MODELS))
def test_tokenizer_models_are_what_the_tokenizer_implements(model: str) -> None:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "a", "b", "ab", "\u0120", "\u2581"]
    data = TokenizerData(model=model, pre="default", tokens=tokens, token_types=[2, 3, 3] + [6] * 256 + [1] * 5,
                         merges=["a b"], bos_id=1, eos_id=2, eot_id=None, eom_id=None, pad_id=None, add_bos=False,
                         add_eos=False, chat_template=None, scores=[0.0] * len(tokens), unk_id=0,
                         add_space_prefix=False)
    tok = Tokenizer(data)
    assert tok.kind == model and tok.decode(tok.encode("ab", add_special=False)) == "ab"


def test_the_orchestrator_judges_without_the_worker() -> None:
    import subprocess
    import sys

    code = ("import sys; import swactor.orchestrator.main, swactor.modelfile.judge; "
            "bad = [m for m in sys.modules if m.startswith('swactor.worker')]; print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
