"""Block matvecs on CPU, both kernels: the tensor expression other devices (CUDA) run and the hand-scheduled CPU kernel
with its own layout, against float64 products of the dequantized weights."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from test_quant import synthetic
from tinygrad import Tensor

from swactor.worker.compute.gguf_weights import RawTensor
from swactor.worker.compute.linear import apply, upload
from swactor.worker.compute.replay import read


@pytest.mark.parametrize("qt", [QT.Q8_0, QT.Q4_0, QT.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize(("rows", "threads"), [(1, 0), (1, 2), (3, 0), (3, 3)])
def test_block_matvec_matches_dequantized(qt: QT, rows: int, threads: int) -> None:
  rng = np.random.default_rng(int(qt) * 10 + rows)
  out, cols = 264, 256  # 264 rows: 8-row iterations, and slices that do not divide evenly into 4 per thread
  w = RawTensor("w", qt, (out, cols), synthetic(qt, out, cols, rng))
  x = rng.normal(size=(rows, cols)).astype(np.float32)
  kind, ts = upload(w, "CPU", words=threads > 0)
  y = read(apply(kind, ts, Tensor(x, device="CPU"), threads=threads).realize())
  want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-3 * np.abs(want).max())
