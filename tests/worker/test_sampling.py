from __future__ import annotations

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
