"""Block matvecs on CPU, both kernels: the tensor expression other devices (CUDA) run and the hand-scheduled CPU kernel
with its own layout, against float64 products of the dequantized weights."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from test_quant import synthetic
from tinygrad import Tensor

from swactor.worker.compute.gguf_weights import RawTensor
from swactor.worker.compute.linear import PACKED, device_nbytes, upload
from swactor.worker.compute.linear import apply as apply_weight
from swactor.worker.compute.replay import read

# 264 rows: 8-row iterations, and slices that do not divide evenly into 4 per thread; 263: one row per iteration, no
# split; 512 columns: two K-quant super-blocks (an even count of 32-blocks), 768: three (odd)
SHAPES = {"rows264": (264, 512), "rows263": (263, 768)}


@pytest.mark.parametrize("qt", list(PACKED), ids=lambda q: q.name)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("rows", "threads"), [(1, 0), (1, 2), (3, 0), (3, 3)])
def test_block_matvec_matches_dequantized(qt: QT, shape: str, rows: int, threads: int) -> None:
  out, cols = SHAPES[shape]
  rng = np.random.default_rng(int(qt) * 10 + rows + out)
  w = RawTensor("w", qt, (out, cols), synthetic(qt, out, cols, rng))
  x = rng.normal(size=(rows, cols)).astype(np.float32)
  kind, ts = upload(w, "CPU", words=threads > 0)
  assert kind == PACKED[qt] and sum(t.nbytes() for t in ts) == device_nbytes(qt, out, cols)
  y = read(apply_weight(kind, ts, Tensor(x, device="CPU"), threads=threads).realize())
  want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_unpacked_types_are_float32_on_device() -> None:
  rng = np.random.default_rng(5)
  w = RawTensor("w", QT.F16, (8, 64), synthetic(QT.F16, 8, 64, rng))
  kind, ts = upload(w, "CPU")
  assert kind == "f32" and sum(t.nbytes() for t in ts) == device_nbytes(QT.F16, 8, 64) == 8 * 64 * 4
