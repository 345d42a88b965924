"""Reference dequantisers vs the gguf package's own, on synthetic blocks and on the real model's tensors."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize

from swactor.worker.compute.gguf_weights import GGUFModel
from swactor.worker.compute.quant import BLOCK, UnsupportedQuant, dequantize

F16_FIELDS = {QT.Q8_0: [0], QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
              QT.IQ4_NL: [0], QT.IQ4_XS: [0]}


def synthetic(qt: QT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
  if qt in (QT.F32, QT.F16):
    return rng.normal(size=(rows, cols)).astype(np.float32 if qt == QT.F32 else np.float16).view(np.uint8)
  if qt == QT.BF16:
    return (rng.normal(size=(rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
  n, nb = BLOCK[qt]
  b = rng.integers(0, 256, size=(rows, cols // n, nb), dtype=np.uint8)
  for p in F16_FIELDS[qt]:  # random bytes would make NaN/inf scales; use finite ones
    b[:, :, p:p + 2] = rng.normal(size=(rows, cols // n, 1)).astype(np.float16).view(np.uint8)
  return b.reshape(rows, -1)


OURS = [QT.F32, QT.F16, QT.BF16, *F16_FIELDS]  # our own dequantisers (the packed formats' layouts); gguf's for the rest


@pytest.mark.parametrize("qt", OURS, ids=lambda q: q.name)
def test_synthetic_blocks_match_gguf(qt: QT) -> None:
  raw = synthetic(qt, 5, 512, np.random.default_rng(int(qt)))
  ours = dequantize(raw, qt, 512)
  assert ours.dtype == np.float32 and ours.shape == (5, 512)
  np.testing.assert_array_equal(ours, gguf_dequantize(raw, qt).astype(np.float32))


def test_real_tensors_match_gguf(gguf_model: GGUFModel) -> None:
  m = gguf_model
  for name in ("token_embd.weight", "blk.3.attn_q.weight", "blk.3.ffn_down.weight", "blk.3.attn_norm.weight"):
    t = m.tensor(name)
    rows = t.data[:64]
    np.testing.assert_array_equal(dequantize(rows, t.qtype, t.shape[-1], name), gguf_dequantize(np.asarray(rows), t.qtype).reshape(len(rows), -1))
  assert {m.tensor("token_embd.weight").qtype, m.tensor("blk.0.attn_q.weight").qtype, m.tensor("output_norm.weight").qtype} == {QT.Q8_0, QT.Q4_1, QT.F32}


@pytest.mark.parametrize("qt", [QT.Q2_K, QT.Q3_K, QT.IQ3_S, QT.IQ2_XXS, QT.TQ1_0, QT.MXFP4], ids=lambda q: q.name)
def test_other_gguf_types_dequantize_through_gguf(qt: QT) -> None:
  n, nb = BLOCK[qt]
  raw = np.zeros((3, 2 * nb), np.uint8)  # zero blocks: finite whatever the layout
  out = dequantize(raw, qt, 2 * n)
  assert out.dtype == np.float32 and out.shape == (3, 2 * n) and np.array_equal(out, gguf_dequantize(raw, qt).reshape(3, -1))


def test_unsupported_type_names_type_and_tensor() -> None:
  assert QT.Q8_K not in BLOCK and QT.I32 not in BLOCK and QT.Q5_0 in BLOCK
  with pytest.raises(UnsupportedQuant) as e:
    dequantize(np.zeros((1, 292), np.uint8), QT.Q8_K, 256, "blk.7.ffn_up.weight")
  assert "Q8_K" in str(e.value) and "blk.7.ffn_up.weight" in str(e.value) and e.value.reason == "UnsupportedQuantType"


def test_row_not_multiple_of_block() -> None:
  with pytest.raises(ValueError, match="multiple"):
    dequantize(np.zeros((1, 34), np.uint8), QT.Q8_0, 33, "x")


@pytest.mark.parametrize(("qt", "levels"), [(QT.Q4_K, 15), (QT.Q5_K, 31), (QT.Q6_K, 63)], ids=lambda v: getattr(v, "name", str(v)))
def test_fixture_quantizers_round_trip_through_gguf(qt: QT, levels: int) -> None:
  """tests/fixtures/gguf_fixtures.py's K-quant quantizers, read back by gguf's dequantizers: within about half a step
  of a sub-block's range / levels (the scales are rounded up to 6 or 8 bits), zero blocks stay zero."""
  from tests.fixtures.gguf_fixtures import quantize
  x = (np.random.default_rng(3).normal(size=(6, 512)) * 0.05).astype(np.float32)
  x[1, :256], x[2, 256:] = 0, np.abs(x[2, 256:]) + 0.2  # a zero block, a block with no negative values
  y = gguf_dequantize(quantize(x, qt), qt).reshape(x.shape)
  group = 16 if qt == QT.Q6_K else 32
  span = np.ptp(np.concatenate([x.reshape(-1, group), np.zeros((x.size // group, 1), np.float32)], axis=1), axis=1)
  step = span / levels * (2 if qt == QT.Q6_K else 1)  # Q6_K is symmetric: 63 levels over [-max|x|, max|x|]
  assert np.all(np.abs(y - x).reshape(-1, group).max(1) <= 0.5 * step * 1.1 + 1e-6)
  assert np.all(y[1, :256] == 0)


@pytest.mark.parametrize("qt", [QT.IQ4_NL, QT.IQ4_XS], ids=lambda q: q.name)
def test_fixture_iq4_quantizers_round_trip_through_gguf(qt: QT) -> None:
  """The IQ4 quantizers of tests/fixtures/gguf_fixtures.py, read back by gguf's dequantizers. A 32-group's largest
  magnitude a lands on the table's extreme (scale ~ a / 127): a value is within half the widest table gap (24) of a
  table value, or past the other end (113 < 127) by at most 14 steps; IQ4_XS's 6-bit sub-block scales are within half a
  step of the block's d (the block's largest a / (127 * 32)) of that, 71 more such steps at most. Zero blocks stay zero."""
  from tests.fixtures.gguf_fixtures import quantize
  x = (np.random.default_rng(3).normal(size=(6, 512)) * 0.05).astype(np.float32)
  x[1, :256], x[2, 256:] = 0, np.abs(x[2, 256:]) + 0.2  # a zero block, a block with no negative values
  x[3, :32] *= 1e-3  # a sub-block far smaller than the others of its 256-block
  y = gguf_dequantize(quantize(x, qt), qt).reshape(x.shape)
  a = np.abs(x).reshape(-1, 32).max(1)
  bound = 14 / 127 * a + (71 / (127 * 32) * np.abs(x).reshape(-1, 256).max(1).repeat(8) if qt == QT.IQ4_XS else 0)
  assert np.all(np.abs(y - x).reshape(-1, 32).max(1) <= bound * 1.01 + 1e-7)
  assert np.all(y[1, :256] == 0)
