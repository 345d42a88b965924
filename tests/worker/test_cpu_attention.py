"""The CPU attention kernels (worker/compute/cpu_attention.py) against float64 numpy, over the shapes models give them:
grouped, multi-head (one query head per KV head) and multi-query (one KV head), decode rows and prefill chunks
(causal), a sliding window, soft-capped scores, a ring's mask, a float16 cache, split and unsplit."""
from __future__ import annotations

import math

import numpy as np
import pytest
from tinygrad import Tensor

from swactor.modelfile.params import LlamaParams, RopeScaling
from swactor.worker.compute.cpu_attention import attention
from swactor.worker.compute.replay import read

LENGTH = 40  # cache places


def params(n_heads: int, n_kv: int, head_dim: int, **kw: object) -> LlamaParams:
  """The attention's parameters; the rest of a model's do not reach these kernels."""
  return LlamaParams(n_layers=1, dim=n_heads * head_dim, ffn_dim=1, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
                     rope_base=10000.0, rope_dim=head_dim, rope_scaling=RopeScaling(), norm_eps=1e-5, context_length=LENGTH,
                     vocab_size=1, bos_token_id=None, eos_token_id=None, **kw)  # type: ignore[arg-type]


def reference(p: LlamaParams, q: np.ndarray, k: np.ndarray, v: np.ndarray, sp: int, swa: bool, mask: np.ndarray | None,
              seen: int) -> np.ndarray:
  """float64: row t (position sp + t) of every head against places 0..seen-1 (sp + T without a ring)."""
  T, g = q.shape[0], p.n_heads // p.n_kv_heads
  out = np.zeros((T, p.n_heads * p.head_dim))
  for h in range(p.n_heads):
    kv = h // g
    qh = q[:, h * p.head_dim:(h + 1) * p.head_dim].astype(np.float64)
    s = qh @ k[kv, :seen].astype(np.float64).T * (p.attn_scale or 1 / math.sqrt(p.head_dim))
    if p.attn_softcap:
      s = np.tanh(s / p.attn_softcap) * p.attn_softcap
    if mask is not None:
      s = s + mask[:, :seen]
    else:
      pos, at = sp + np.arange(T)[:, None], np.arange(seen)[None, :]
      s = np.where(at <= pos, s, -np.inf)
      if swa:
        s = np.where(pos - at < p.swa_window, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    out[:, h * p.head_dim:(h + 1) * p.head_dim] = (w / w.sum(-1, keepdims=True)) @ v[kv, :seen].astype(np.float64)
  return out


@pytest.mark.parametrize(("heads", "kv", "head_dim"), [(9, 3, 64), (4, 4, 32), (6, 1, 48), (8, 2, 80)],
                         ids=["grouped", "multi_head", "multi_query", "head_dim_80"])
@pytest.mark.parametrize(("T", "sp"), [(1, 17), (4, 9), (8, 0)], ids=["decode", "chunk", "first_chunk"])
@pytest.mark.parametrize("threads", [1, 3])
def test_attention_equals_float64(heads: int, kv: int, head_dim: int, T: int, sp: int, threads: int) -> None:
  check(params(heads, kv, head_dim), T, sp, threads)


@pytest.mark.parametrize("case", ["window", "softcap", "ring", "float16_cache", "scale"])
def test_attention_variants_equal_float64(case: str) -> None:
  p = params(8, 2, 32, **({"swa_window": 5} if case == "window" else {}), **({"attn_softcap": 2.0} if case == "softcap" else {}),
             **({"attn_scale": 0.3} if case == "scale" else {}))
  check(p, 4, 12, 2, swa=case == "window", ring=case == "ring", kv_dtype=np.float16 if case == "float16_cache" else np.float32)


def check(p: LlamaParams, T: int, sp: int, threads: int, swa: bool = False, ring: bool = False, kv_dtype: type = np.float32) -> None:
  rng = np.random.default_rng(p.n_heads * 100 + T * 10 + sp)
  q = rng.normal(size=(T, p.n_heads * p.head_dim)).astype(np.float32)
  k, v = (rng.normal(size=(2, p.n_kv_heads, LENGTH, p.head_dim)).astype(kv_dtype) for _ in range(2))
  slot, seen, mask = 1, sp + T, None
  if ring:  # some places hidden from some rows, the rest seen: what a ring's mask rows look like
    seen = LENGTH - 3
    mask = np.where(rng.random((T, LENGTH)) < 0.3, -np.inf, 0).astype(np.float32)
    mask[:, 0] = 0  # every row sees at least one place
  t = {name: Tensor(a, device="CPU") for name, a in (("q", q), ("k", k), ("v", v))}
  got = attention(p, t["q"], t["k"], t["v"], slot, sp, threads, swa=swa, seen=seen if ring else None,
                  mask=None if mask is None else Tensor(np.concatenate([np.zeros((2, LENGTH), np.float32), mask]), device="CPU"),
                  mask_row=2)
  want = reference(p, q, k[slot], v[slot], sp, swa, mask, seen)
  np.testing.assert_allclose(read(got.realize()), want, rtol=1e-4, atol=1e-5)
