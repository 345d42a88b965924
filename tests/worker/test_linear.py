"""Block matvecs on CPU, both kernels: the tensor expression other devices (CUDA) run and the hand-scheduled CPU kernel
with its own layout, against float64 products of the dequantized weights."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from test_quant import synthetic
from tinygrad import Tensor

from swactor.worker.compute.cpu_matvec import IQ4_POLY, iq4_value
from swactor.worker.compute.gguf_weights import RawTensor
from swactor.worker.compute.linear import PACKED, apply_experts, device_nbytes, upload, upload_experts
from swactor.worker.compute.linear import apply as apply_weight
from swactor.worker.compute.quant import BLOCK, IQ4_VALUES
from swactor.worker.compute.replay import read

# 264 rows: 8-row iterations, and slices that do not divide evenly into 4 per thread; 263: one row per iteration, no
# split; 512 columns: two K-quant super-blocks (an even count of 32-blocks), 768: three (odd)
SHAPES = {"rows264": (264, 512), "rows263": (263, 768)}


@pytest.mark.parametrize("qt", list(PACKED), ids=lambda q: q.name)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("rows", "threads"), [(1, 0), (1, 2), (3, 0), (3, 3)])
def test_block_matvec_matches_dequantized(qt: QT, shape: str, rows: int, threads: int) -> None:
  check_block_matvec(qt, *SHAPES[shape], rows, threads)


@pytest.mark.parametrize("qt", [q for q in PACKED if BLOCK[q][0] == 256], ids=lambda q: q.name)
@pytest.mark.parametrize("threads", [0, 2])
def test_rows_of_one_256_block(qt: QT, threads: int) -> None:
  """The K-quants' and IQ4_XS's rows of a single block (a small model's 256-wide matrices): the kernels' block loop
  has one iteration."""
  check_block_matvec(qt, 16, 256, 1, threads)


def check_block_matvec(qt: QT, out: int, cols: int, rows: int, threads: int) -> None:
  rng = np.random.default_rng(int(qt) * 10 + rows + out)
  w = RawTensor("w", qt, (out, cols), synthetic(qt, out, cols, rng))
  x = rng.normal(size=(rows, cols)).astype(np.float32)
  kind, ts = upload(w, "CPU", words=threads > 0)
  assert kind == PACKED[qt] and sum(t.nbytes() for t in ts) == device_nbytes(qt, out, cols)
  y = read(apply_weight(kind, ts, Tensor(x, device="CPU"), threads=threads).realize())
  want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("qt", list(PACKED), ids=lambda q: q.name)
@pytest.mark.parametrize(("ids", "share", "threads"), [([2, 0], 1, 2), ([1, 2, 2, 0], 2, 2), ([1, 2, 2, 0], 2, 0)],
                         ids=["one_each", "two_each", "two_each_expression"])
def test_expert_matvec_matches_dequantized(qt: QT, ids: list[int], share: int, threads: int) -> None:
  """A routed product reads expert ids[r]'s rows for routed row r (input row r // share), on both kernels: 3 experts
  (the id's modulo is not a mask) of 24 rows (three 8-row iterations, q8_0's scale groups)."""
  n, out, cols = 3, 24, 512
  rng = np.random.default_rng(int(qt) * 10 + share + threads)
  w = RawTensor("w", qt, (n, out, cols), synthetic(qt, n * out, cols, rng))
  x = rng.normal(size=(len(ids) // share, cols)).astype(np.float32)
  kind, ts = upload_experts(w, "CPU", words=threads > 0)
  assert kind == PACKED[qt]
  y = read(apply_experts(kind, ts, Tensor(x, device="CPU"), Tensor(np.asarray(ids, np.int32), device="CPU"), out, share,
                         threads=threads).realize())
  full = w.dequantize().astype(np.float64).reshape(n, out, cols)
  want = np.stack([full[e] @ x[r // share].astype(np.float64) for r, e in enumerate(ids)])
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_iq4_table_lookup_is_exact() -> None:
  """The IQ4 kernels' table values (a rounded polynomial): every code's exactly, with room to round (< 0.5 off)."""
  codes = np.arange(16)
  assert np.abs(np.polyval(IQ4_POLY, codes) - IQ4_VALUES).max() < 0.4
  np.testing.assert_array_equal(iq4_value(Tensor(codes.astype(np.uint8), device="CPU")).numpy(), np.asarray(IQ4_VALUES, np.float32))


def test_unpacked_types_are_float32_on_device() -> None:
  rng = np.random.default_rng(5)
  w = RawTensor("w", QT.F16, (8, 64), synthetic(QT.F16, 8, 64, rng))
  kind, ts = upload(w, "CPU")
  assert kind == "f32" and sum(t.nbytes() for t in ts) == device_nbytes(QT.F16, 8, 64) == 8 * 64 * 4
