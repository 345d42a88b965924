"""RoPE: the tinygrad rotations (llama.cpp's adjacent pairs, NeoX halves) and the frequency rules (none, linear, YaRN,
Llama 3 from the tensor or from metadata, LongRoPE's two sets and attention factor) against the float64 reference's
independent implementation."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from reference import RefLlama, llama3_divisors, rope_angles
from tinygrad import Tensor

from swactor.modelfile.params import LlamaParams, ModelRefused, RopeScaling, read_rope_scaling
from swactor.worker.compute.gguf_weights import StageWeights
from swactor.worker.compute.rope import (
  freq_factors,
  llama3_factors,
  rope,
  rope_tables,
  stage_divisors,
  uses_long_factors,
)

BASE = LlamaParams(n_layers=1, dim=64, ffn_dim=1, n_heads=1, n_kv_heads=1, head_dim=64, rope_base=100000.0, rope_dim=64,
                   rope_scaling=RopeScaling(), norm_eps=1e-5, context_length=8192, vocab_size=1, bos_token_id=None, eos_token_id=None)


def ref_rotation(neox: bool, rope_dim: int = 64) -> RefLlama:
  ref = RefLlama.__new__(RefLlama)  # only the rotation: no weights needed
  ref.rope_dim, ref.base, ref.neox, ref.divisors, ref.scaling, ref.factor, ref.orig_ctx = rope_dim, 100000.0, neox, None, "none", 1.0, 0
  ref.attn_factor = 1.0
  return ref


@pytest.mark.parametrize("neox", [False, True])
def test_rotation_matches_reference(neox: bool) -> None:
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 3, 64))
  pos = np.arange(7, 12, dtype=np.float64)
  cos, sin = (Tensor(t.astype(np.float32)[:, None, :]) for t in rope_tables(BASE, None, 12))
  ours = rope(Tensor(x.astype(np.float32)), cos[7:12], sin[7:12], 64, neox).numpy()
  np.testing.assert_allclose(ours, ref_rotation(neox).rope(x, pos), atol=2e-5)
  assert not np.allclose(ours[..., 1:32], x[..., 1:32], atol=1e-2)  # it did rotate
  other = rope(Tensor(x.astype(np.float32)), cos[7:12], sin[7:12], 64, not neox).numpy()
  assert not np.allclose(ours, other, atol=1e-2)  # and the two layouts differ


@pytest.mark.parametrize("neox", [False, True])
def test_partial_rotary_leaves_tail_untouched(neox: bool) -> None:
  x = np.random.default_rng(1).normal(size=(2, 1, 8))
  p = dataclasses.replace(BASE, rope_dim=4, head_dim=8)
  cos, sin = (Tensor(t.astype(np.float32)[:, None, :]) for t in rope_tables(p, None, 2))
  y = rope(Tensor(x.astype(np.float32)), cos, sin, 4, neox).numpy()
  np.testing.assert_array_equal(y[..., 4:], x[..., 4:].astype(np.float32))
  np.testing.assert_allclose(y, ref_rotation(neox, 4).rope(x, np.arange(2.0)), atol=1e-6)


SCALINGS = {
  "none": RopeScaling(),
  "linear": RopeScaling("linear", 2.0, 8192),
  "yarn": RopeScaling("yarn", 4.0, 2048),
  "yarn_qwen25": RopeScaling("yarn", 4.0, 32768),
  "llama3": RopeScaling("llama3", 8.0, 512, 1.0, 4.0),
  "llama31": RopeScaling("llama3", 8.0, 8192, 1.0, 4.0),
}


@pytest.mark.parametrize("kind", list(SCALINGS))
@pytest.mark.parametrize("base", [10000.0, 1000000.0])
def test_frequency_rules_match_reference(kind: str, base: float) -> None:
  s = SCALINGS[kind]
  p = dataclasses.replace(BASE, rope_scaling=s, rope_base=base, rope_dim=128, head_dim=128)
  pos = np.arange(3000, dtype=np.float64)
  divisors = llama3_divisors(base, 128, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_context) if kind.startswith("llama3") else None
  ang, mscale = rope_angles(pos, 128, base, divisors, "none" if kind.startswith("llama3") else s.kind, s.factor, s.original_context)
  cos, sin = rope_tables(p, None, len(pos))
  np.testing.assert_allclose(cos, np.cos(ang) * mscale, atol=1e-9)
  np.testing.assert_allclose(sin, np.sin(ang) * mscale, atol=1e-9)
  if kind != "none":  # the rule changed something
    plain, _ = rope_angles(pos, 128, base)
    assert not np.allclose(ang, plain)


def test_llama3_rule_three_regions() -> None:
  f = llama3_factors(100000.0, 64, 8.0, 1.0, 4.0, 8192)
  np.testing.assert_allclose(f, llama3_divisors(100000.0, 64, 8.0, 1.0, 4.0, 8192), rtol=1e-12)
  assert f[0] == 1.0 and f[-1] == 8.0 and any(1.0 < v < 8.0 for v in f)  # high kept, low slowed, smooth between
  assert np.all(np.diff(f) >= 0)


def test_rope_freqs_tensor_wins_over_metadata_rule() -> None:
  p = dataclasses.replace(BASE, rope_scaling=SCALINGS["llama3"])
  tensor = np.linspace(1.0, 3.0, 32)
  np.testing.assert_array_equal(freq_factors(p, tensor), tensor)
  np.testing.assert_allclose(freq_factors(p, None), llama3_divisors(100000.0, 64, 8.0, 1.0, 4.0, 512))
  np.testing.assert_array_equal(freq_factors(BASE, None), np.ones(32))
  cos_t, _ = rope_tables(BASE, freq_factors(p, None), 100)
  cos_m, _ = rope_tables(p, None, 100)
  np.testing.assert_allclose(cos_t, cos_m)


def test_longrope_tables_and_choice_of_set() -> None:
  """A LongRoPE stage turns pair i by p * base^(-2i/d) / f_i with f the long set when its context exceeds the original
  context (the short set up to it, inclusive), its cos/sin times attn_factor: the reference's angles exactly."""
  rng = np.random.default_rng(5)
  long, short = rng.uniform(1.0, 30.0, 32), rng.uniform(1.0, 2.0, 32)
  p = dataclasses.replace(BASE, rope_scaling=RopeScaling("longrope", 1.0, 4096, attn_factor=1.19))
  w = StageWeights(p, 0, 1, rope_long=long, rope_short=short)
  assert not uses_long_factors(p, 4096) and uses_long_factors(p, 4097)
  assert stage_divisors(p, w, 4096) is short and stage_divisors(p, w, 4097) is long
  assert stage_divisors(BASE, StageWeights(BASE, 0, 1, rope_freqs=long), 10**6) is long  # not LongRoPE: rope_freqs
  pos = np.arange(300, dtype=np.float64)
  for f in (long, short):
    ang, mscale = rope_angles(pos, 64, 100000.0, f)
    cos, sin = rope_tables(p, f, len(pos))
    np.testing.assert_allclose(cos, np.cos(ang) * mscale * 1.19, atol=1e-12)
    np.testing.assert_allclose(sin, np.sin(ang) * mscale * 1.19, atol=1e-12)
  assert not np.allclose(rope_tables(p, long, 300)[0], rope_tables(p, short, 300)[0], atol=1e-3)
  with pytest.raises(ValueError, match="LongRoPE"):  # never turned unscaled for want of a set
    rope_tables(p, None, 4)
  with pytest.raises(ValueError, match="LongRoPE"):
    stage_divisors(p, StageWeights(p, 0, 1), 16)


def keys(meta: dict[str, object]) -> Callable[..., object]:
  """A stand-in for the GGUF key lookup read_rope_scaling takes (a missing key without default raises)."""
  def k(key: str, default: object = ...) -> object:
    if key in meta:
      return meta[key]
    if default is ...:
      raise KeyError(key)
    return default
  return k


@pytest.mark.parametrize(("meta", "want"), [
  ({}, RopeScaling()),
  ({"rope.scaling.factor": 2.0}, RopeScaling("linear", 2.0, 4096)),  # llama.cpp: no type but a factor is linear
  ({"rope.scale_linear": 4.0}, RopeScaling("linear", 4.0, 4096)),
  ({"rope.scaling.type": "none", "rope.scaling.factor": 2.0}, RopeScaling()),
  ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 1024}, RopeScaling("yarn", 4.0, 1024)),
  ({"rope.scaling.type": "llama3", "rope.scaling.factor": 8.0, "rope.scaling.high_freq_factor": 2.0}, RopeScaling("llama3", 8.0, 4096, 1.0, 2.0)),
])
def test_metadata_keys(meta: dict[str, object], want: RopeScaling) -> None:
  assert read_rope_scaling(keys(meta), 4096) == want


@pytest.mark.parametrize(("meta", "want"), [
  # as llama.cpp's converter writes Phi-3 128k: no type, the original context and the attention factor
  ({"rope.scaling.original_context_length": 4096, "rope.scaling.attn_factor": 1.19},
   RopeScaling("longrope", 1.0, 4096, attn_factor=1.19)),
  ({"rope.scaling.type": "longrope"}, RopeScaling("longrope", 1.0, 131072)),  # no original context: the file's
])
def test_longrope_metadata_keys(meta: dict[str, object], want: RopeScaling) -> None:
  assert read_rope_scaling(keys(meta), 131072, longrope=True) == want


@pytest.mark.parametrize(("meta", "named"), [
  ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}, "'yarn'"),  # llama.cpp would apply both: not run
  ({"rope.scaling.factor": 2.0}, "factor 2.0"),
  ({"rope.scaling.attn_factor": 0.0}, "attn_factor"),
])
def test_longrope_with_other_scaling_refused_by_name(meta: dict[str, object], named: str) -> None:
  with pytest.raises(ModelRefused) as e:
    read_rope_scaling(keys(meta), 131072, longrope=True)
  assert e.value.reason == "UnsupportedRopeScaling" and named in str(e.value)


@pytest.mark.parametrize(("meta", "named"), [
  ({"rope.scaling.type": "longrope", "rope.scaling.factor": 2.0}, "rope_factors_long.weight"),  # without its tensors
  ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.attn_factor": 0.8}, "attn_factor"),
  ({"rope.scaling.attn_factor": 1.2}, "attn_factor"),  # only LongRoPE applies it: elsewhere it would be dropped
  ({"rope.scaling.type": "linear", "rope.scaling.factor": -1.0}, "factor"),
])
def test_unsupported_scaling_refused_by_name(meta: dict[str, object], named: str) -> None:
  with pytest.raises(ModelRefused) as e:
    read_rope_scaling(keys(meta), 4096)
  assert e.value.reason == "UnsupportedRopeScaling" and named in str(e.value)
