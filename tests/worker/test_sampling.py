from __future__ import annotations

import zlib

import numpy as np
import pytest

from swactor.common.sampling import SamplingPolicy
from swactor.worker.compute.sampling import Sampler


def test_greedy_ties_pick_lowest_index() -> None:
  assert Sampler(SamplingPolicy())(np.array([0.0, 3.0, 1.0, 3.0, 3.0])) == 1


def test_same_seed_same_tokens_and_different_seed_differs() -> None:
  logits = np.random.default_rng(0).normal(size=(20, 1000))
  def run(seed: int) -> list[int]:
    s = Sampler(SamplingPolicy(temperature=1.0, top_k=50, top_p=0.9, seed=seed))
    return [s(row) for row in logits]
  assert run(7) == run(7)
  assert run(7) != run(8)


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
  logits = np.random.default_rng(1).normal(size=(10, 500))
  for row in logits:
    assert Sampler(SamplingPolicy(temperature=2.0, top_k=1, seed=3))(row) == int(np.argmax(row))
    assert Sampler(SamplingPolicy(temperature=2.0, top_p=1e-9, seed=3))(row) == int(np.argmax(row))


def test_top_k_restricts_support() -> None:
  row = np.arange(100, dtype=np.float32)
  s = Sampler(SamplingPolicy(temperature=100.0, top_k=5, seed=0))
  assert {s(row) for _ in range(200)} <= set(range(95, 100))


def test_bad_policy_and_logits_rejected() -> None:
  with pytest.raises(ValueError, match="temperature"):
    SamplingPolicy(temperature=-1)
  with pytest.raises(ValueError, match="top_p"):
    SamplingPolicy(top_p=0)
  with pytest.raises(ValueError, match="top_k"):
    SamplingPolicy(top_k=-2)
  with pytest.raises(ValueError, match="NaN"):
    Sampler(SamplingPolicy())(np.array([0.0, np.nan]))


def full_sort_draw(x: np.ndarray, p: SamplingPolicy, u: float) -> int:
  """The sampler's distribution over the whole descending order (ties by ascending id), sorted in full: what the
  head-only sort must give exactly. top_k: softmax of the k in float64; else every weight in x's dtype, summed in
  float64."""
  order = np.argsort(-x, kind="stable")
  if p.top_k:
    order = order[:p.top_k]
    z = x[order].astype(np.float64) / p.temperature
    probs = np.exp(z - z[0])
    probs /= probs.sum()
  else:
    e = np.exp((x - x.max()) / x.dtype.type(p.temperature))
    probs = e[order].astype(np.float64) / e.sum(dtype=np.float64)
  if p.top_p < 1.0:
    keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
    probs, order = probs[:keep] / probs[:keep].sum(), order[:keep]
  return int(order[min(int(np.searchsorted(np.cumsum(probs), u, side="right")), len(order) - 1)])


@pytest.mark.parametrize("shape", ["peaked", "flat", "ties"])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (0, 0.9), (40, 1.0), (40, 0.8), (5000, 0.95)])
def test_sorting_only_the_head_draws_what_a_full_sort_draws(shape: str, top_k: int, top_p: float) -> None:
  rng = np.random.default_rng(zlib.crc32(f"{shape} {top_k} {top_p}".encode()))
  policy = SamplingPolicy(temperature=0.7, top_k=top_k, top_p=top_p, seed=5)
  s, draws = Sampler(policy), np.random.default_rng(5)
  for _ in range(40):
    x = rng.normal(0, 0.05 if shape == "flat" else 2.0, 20000).astype(np.float32)
    if shape == "peaked":
      x[rng.choice(20000, 4, replace=False)] += np.float32(9.0)
    if shape == "ties":
      x = np.round(x)  # thousands of equal logits: the order among them is by token id
    assert s(x) == full_sort_draw(x, policy, draws.random())
