from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter

from swactor.worker.compute.gguf_weights import (
  LAYER_TENSORS,
  GGUFModel,
  LoadProgress,
  ModelRefused,
  RawTensor,
  fused_parts,
  load_stage,
)
from swactor.worker.compute.quant import UnsupportedQuant


def test_default_model_params(gguf_model: GGUFModel) -> None:
  p = gguf_model.params
  assert (p.n_layers, p.dim, p.ffn_dim, p.n_heads, p.n_kv_heads, p.head_dim) == (30, 576, 1536, 9, 3, 64)
  assert (p.rope_base, p.rope_dim, p.rope_scaling.kind, p.vocab_size, p.context_length) == (100000.0, 64, "none", 49152, 8192)
  assert p.norm_eps == pytest.approx(1e-5) and p.eos_token_id == 2


@pytest.mark.parametrize("rng", [(-1, 3), (3, 3), (5, 2), (0, 31)])
def test_bad_layer_range_refused(gguf_model: GGUFModel, rng: tuple[int, int]) -> None:
  with pytest.raises(ModelRefused) as e:
    load_stage(gguf_model, *rng)
  assert e.value.reason == "InvalidLayerRange" and str(rng[0]) in str(e.value)


def test_middle_stage_loads_only_its_range(gguf_model: GGUFModel) -> None:
  seen: list[LoadProgress] = []
  w = load_stage(gguf_model, 10, 13, on_progress=seen.append)
  assert len(w.layers) == 3 and w.token_embd is None and w.output is None and not w.is_first and not w.is_last
  assert [s.layers_loaded for s in seen] == [1, 2, 3, 3] and all(s.layers_total == 3 for s in seen)
  assert seen[-1].bytes_loaded == seen[-1].bytes_total > 0
  assert all(a.bytes_loaded < b.bytes_loaded for a, b in itertools.pairwise(seen[:3]))
  assert w.layers[0]["attn_q"].shape == (576, 576) and w.layers[0]["ffn_down"].dtype == np.float32


def test_first_and_last_stage_tensors(gguf_model: GGUFModel, model_path: str) -> None:
  first, last = load_stage(gguf_model, 0, 1), load_stage(model_path, 29, 30, keep=frozenset(), on_progress=None)
  assert first.token_embd is not None and first.output is None
  assert last.token_embd is None and last.output is not None and last.output.shape == (49152, 576) and last.output_norm is not None
  np.testing.assert_array_equal(last.output, gguf_model.tensor("token_embd.weight").dequantize())  # tied head


def test_keep_leaves_blocks_as_memmap_views(gguf_model: GGUFModel) -> None:
  w = load_stage(gguf_model, 0, 1, keep=frozenset({QT.Q4_1}))
  q = w.layers[0]["attn_q"]
  assert isinstance(q, RawTensor) and isinstance(q.data.base, np.memmap | np.ndarray) and q.data.shape == (576, 360)


def _tiny_gguf(path: pathlib.Path, arch: str) -> str:
  wr = GGUFWriter(str(path), arch)
  wr.add_block_count(1)
  wr.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()  # noqa: E702
  return str(path)


def test_non_llama_refused(tmp_path: pathlib.Path) -> None:
  with pytest.raises(ModelRefused) as e:
    GGUFModel(_tiny_gguf(tmp_path / "g.gguf", "gpt2"))
  assert e.value.reason == "UnsupportedArchitecture" and "gpt2" in str(e.value)


def test_llama_missing_metadata_refused(tmp_path: pathlib.Path) -> None:
  with pytest.raises(ModelRefused) as e:
    GGUFModel(_tiny_gguf(tmp_path / "l.gguf", "llama"))
  assert e.value.reason == "MissingMetadata"


def test_garbage_file_refused(tmp_path: pathlib.Path) -> None:
  (bad := tmp_path / "bad.gguf").write_bytes(b"not a gguf at all" * 10)
  with pytest.raises(ModelRefused) as e:
    GGUFModel(bad)
  assert e.value.reason == "MalformedGGUF"


def _llama_with(path: pathlib.Path, qt: QT, type_id: int | None = None) -> str:
  """A one-layer llama whose blk.0.attn_q is of type qt (zero blocks); type_id: then patched to that raw type id."""
  from gguf import GGUFValueType
  from gguf.constants import GGML_QUANT_SIZES

  from tests.fixtures.gguf_fixtures import Field, write_raw
  u32 = GGUFValueType.UINT32
  fields = [Field(f"llama.{k}", v, u32) for k, v in [("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 256),
            ("attention.head_count", 4), ("context_length", 64), ("vocab_size", 8)]]
  fields.append(Field("llama.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32))
  n, nb = GGML_QUANT_SIZES[qt]
  tensors = {"blk.0.attn_q.weight": (np.zeros((256, 256 // n * nb), np.uint8), qt)}
  tensors |= {f"blk.0.{k}.weight": (np.zeros((256, 256), np.float32), QT.F32) for k in LAYER_TENSORS if k not in ("attn_q", "attn_norm", "ffn_norm")}
  tensors |= {f"blk.0.{k}.weight": (np.ones(256, np.float32), QT.F32) for k in ("attn_norm", "ffn_norm")}
  write_raw(path, "llama", fields, tensors)
  if type_id is not None:  # tensor info: u64 name length, name, u32 n_dims, u64 dims..., u32 type
    raw = bytearray(path.read_bytes())
    at = raw.index(b"blk.0.attn_q.weight") + len("blk.0.attn_q.weight") + 4 + 2 * 8
    raw[at:at + 4] = np.uint32(type_id).tobytes()
    path.write_bytes(bytes(raw))
  return str(path)


def test_unknown_type_id_refused_naming_tensor(tmp_path: pathlib.Path) -> None:
  with pytest.raises(UnsupportedQuant) as e:
    GGUFModel(_llama_with(tmp_path / "u.gguf", QT.Q8_0, type_id=99))
  assert e.value.reason == "UnsupportedQuantType" and "blk.0.attn_q.weight" in str(e.value) and "99" in str(e.value)


def test_type_without_dequantizer_refused_naming_type_and_tensor(tmp_path: pathlib.Path) -> None:
  m = GGUFModel(_llama_with(tmp_path / "k.gguf", QT.Q8_K))
  with pytest.raises(UnsupportedQuant) as e:
    load_stage(m, 0, 1, keep=frozenset())
  assert "Q8_K" in str(e.value) and "blk.0.attn_q.weight" in str(e.value)


def test_qwen2_params_and_biases(tmp_path: pathlib.Path) -> None:
  from tests.fixtures.gguf_fixtures import SOURCE, build_qwen2
  if not SOURCE.exists():
    pytest.skip(f"{SOURCE} missing (run `make model`)")
  m = GGUFModel(build_qwen2())
  p = m.params
  assert (p.arch, p.rope_neox, p.qkv_bias, p.n_layers, p.dim, p.n_heads, p.n_kv_heads) == ("qwen2", True, True, 30, 576, 9, 3)
  w = load_stage(m, 3, 4)
  assert w.layers[0]["attn_q_bias"].shape == (576,) and w.layers[0]["attn_k_bias"].shape == (192,)


def test_qwen3_params_and_qk_norms() -> None:
  from tests.fixtures.gguf_fixtures import SOURCE, build_qwen3, qk_norms
  if not SOURCE.exists():
    pytest.skip(f"{SOURCE} missing (run `make model`)")
  m = GGUFModel(build_qwen3())
  p = m.params
  assert (p.arch, p.rope_neox, p.qkv_bias, p.qk_norm, p.n_layers, p.dim, p.head_dim) == ("qwen3", True, False, True, 30, 576, 64)
  w = load_stage(m, 3, 4)
  assert "attn_q_bias" not in w.layers[0]
  for k in ("attn_q_norm", "attn_k_norm"):
    np.testing.assert_array_equal(w.layers[0][k], qk_norms(30, 64)[f"blk.3.{k}.weight"])


def test_phi3_fused_matrices_are_split_by_rows() -> None:
  """attn_qkv's rows are Q's, K's, V's and ffn_up's the gate's then up's: the split parts are the source's raw blocks."""
  from tests.fixtures.gguf_fixtures import SOURCE, _neox_rows, build_phi3
  if not SOURCE.exists():
    pytest.skip(f"{SOURCE} missing (run `make model`)")
  m, src = GGUFModel(build_phi3()), GGUFModel(SOURCE)
  p = m.params
  assert (p.arch, p.rope_neox, p.qkv_bias, p.qk_norm, p.n_layers, p.dim, p.head_dim, p.context_length) == (
    "phi3", True, False, False, 30, 576, 64, 4096)
  w = load_stage(m, 28, 30, keep=frozenset({QT.Q4_1, QT.Q8_0}))
  assert w.is_last and isinstance(w.output, RawTensor) and w.output.name == "output.weight"
  for i, L in zip((28, 29), w.layers, strict=True):
    assert set(L) == set(LAYER_TENSORS)
    for k in LAYER_TENSORS:
      want = src.tensors[f"blk.{i}.{k}.weight"]
      if k in ("attn_q", "attn_k"):
        want = RawTensor(want.name, want.qtype, want.shape, _neox_rows(want.data, p.n_heads if k == "attn_q" else p.n_kv_heads))
      got = L[k]
      if isinstance(got, RawTensor):
        assert (got.qtype, got.shape) == (want.qtype, want.shape) and np.array_equal(got.data, want.data), (i, k)
      else:
        np.testing.assert_array_equal(got, want.dequantize())
  assert w.layers[0]["ffn_gate"].name == "blk.28.ffn_up.weight:ffn_gate"
  with pytest.raises(ModelRefused) as e:
    fused_parts(m.tensor("blk.0.ffn_up.weight"), (1536, 1535), ("ffn_gate", "ffn_up"))
  assert e.value.reason == "MalformedGGUF" and "blk.0.ffn_up.weight" in str(e.value)


def _writer(path: pathlib.Path, arch: str, extra: dict[str, np.ndarray]) -> str:
  wr = GGUFWriter(str(path), arch)
  for k, v in {"block_count": 1, "embedding_length": 8, "feed_forward_length": 8, "attention.head_count": 2,
               "attention.layer_norm_rms_epsilon": 1e-5, "context_length": 64}.items():
    (wr.add_float32 if isinstance(v, float) else wr.add_uint32)(f"{arch}.{k}", v)
  wr.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  for name, a in extra.items():
    wr.add_tensor(name, a)
  wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()  # noqa: E702
  return str(path)


@pytest.mark.parametrize(("extra", "named"), [
  ({"blk.0.attn_output.bias": np.zeros(8, np.float32)}, "blk.0.attn_output.bias"),     # a variant we don't implement
  ({"rope_factors_long.weight": np.ones(2, np.float32)}, "rope_factors_long.weight"),  # phi3-style long rope
  ({"blk.0.attn_q.bias": np.zeros(8, np.float32)}, "attn_q"),                           # Q bias without K/V biases
])
def test_unimplemented_tensors_refused_by_name(tmp_path: pathlib.Path, extra: dict[str, np.ndarray], named: str) -> None:
  with pytest.raises(ModelRefused) as e:
    GGUFModel(_writer(tmp_path / "x.gguf", "llama", extra))
  assert e.value.reason == "UnsupportedArchitecture" and named in str(e.value)


def test_qwen2_keys_are_read_with_their_prefix(tmp_path: pathlib.Path) -> None:
  p = GGUFModel(_writer(tmp_path / "q.gguf", "qwen2", {})).params
  assert (p.arch, p.rope_neox, p.qkv_bias, p.dim, p.n_heads, p.head_dim, p.context_length) == ("qwen2", True, False, 8, 2, 4, 64)
  with pytest.raises(ModelRefused) as e:
    GGUFModel(_writer(tmp_path / "m.gguf", "mamba", {}))
  assert e.value.reason == "UnsupportedArchitecture" and "'mamba'" in str(e.value) and "qwen2" in str(e.value)
