"""tinygrad RoPE (adjacent pairs, llama.cpp non-NeoX) against the float64 numpy reference's rotation."""
from __future__ import annotations

import numpy as np
from reference import RefLlama
from tinygrad import Tensor

from swactor.worker.compute.model import rope


def test_rope_matches_reference_rotation() -> None:
  ref = RefLlama.__new__(RefLlama)  # only the rotation: no weights needed
  ref.rope_dim, ref.base = 64, 100000.0
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 3, 64))
  pos = np.arange(7, 12, dtype=np.float64)
  ang = pos[:, None] * ref.base ** (-np.arange(32) * 2.0 / 64)
  cos, sin = (Tensor(f(ang).astype(np.float32)[:, None, :]) for f in (np.cos, np.sin))
  ours = rope(Tensor(x.astype(np.float32)), cos, sin, 64).numpy()
  np.testing.assert_allclose(ours, ref.rope(x, pos), atol=2e-5)
  assert not np.allclose(ours[..., 0::2], x[..., 0::2], atol=1e-2)  # it did rotate


def test_partial_rotary_leaves_tail_untouched() -> None:
  x = np.random.default_rng(1).normal(size=(2, 1, 8)).astype(np.float32)
  ang = np.array([[0.3, 0.7], [1.1, 2.0]])
  cos, sin = (Tensor(f(ang).astype(np.float32)[:, None, :]) for f in (np.cos, np.sin))
  y = rope(Tensor(x), cos, sin, 4).numpy()
  np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
  a, b = x[..., 0:4:2], x[..., 1:4:2]
  np.testing.assert_allclose(y[..., 0:4:2], a * np.cos(ang)[:, None] - b * np.sin(ang)[:, None], atol=1e-6)
