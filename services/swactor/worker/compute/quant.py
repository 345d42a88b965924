"""GGML block formats: numpy dequantisers (spec §15 weight load).

Each dequantiser maps raw bytes [rows, row_bytes] (uint8) to float32 [rows, cols]. The formats the device keeps packed
(linear.py) have our own dequantisers here, written from ggml's block structs (their layouts are what the matvec kernels
read, and the tests check them against `gguf.quants`); every other type swactor.modelfile.support declares (its
EXPANDED_TYPES: Q2_K, Q3_K, the other IQ*, TQ*, MXFP4, ...) goes through `gguf.quants.dequantize` and is expanded to float32 at
load.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES

from swactor.modelfile.params import ModelRefused
from swactor.modelfile.support import QUANT_TYPES

# qtype -> (elements per block, bytes per block) of every type the support declaration says the core loads; the rest
# (Q8_1, Q8_K, the integer types, F64, ...) is refused by name
BLOCK: dict[QT, tuple[int, int]] = {q: GGML_QUANT_SIZES[q] for q in QT if q.name in QUANT_TYPES}


class UnsupportedQuant(ModelRefused):
  def __init__(self, qtype: QT | int, tensor: str):
    self.qtype, self.tensor = qtype, tensor
    name = qtype.name if isinstance(qtype, QT) else f"id {qtype} (not a GGML type)"
    super().__init__("UnsupportedQuantType",
                     f"tensor {tensor!r} has unsupported quant type {name}; supported: {', '.join(q.name for q in BLOCK)}")


def _f16(b: np.ndarray) -> np.ndarray: return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
  """[..., 16] packed bytes -> [..., 32]: low nibbles are elements 0..15, high nibbles 16..31."""
  return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _q8_0(b: np.ndarray) -> np.ndarray: return _f16(b[:, :2]) * np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.float32)
def _q4_0(b: np.ndarray) -> np.ndarray: return _f16(b[:, :2]) * (_nibbles(b[:, 2:]).astype(np.float32) - 8)
def _q4_1(b: np.ndarray) -> np.ndarray: return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(np.float32) + _f16(b[:, 2:4])


def _q5_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
  """Q5_0/Q5_1: bit j of the little-endian word qh is the 5th bit of element j (j < 16: low nibble j, else high j-16)."""
  high = (np.ascontiguousarray(qh).view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1
  return (_nibbles(qs) | (high.astype(np.uint8) << 4)).astype(np.float32)


def _q5_0(b: np.ndarray) -> np.ndarray: return _f16(b[:, :2]) * (_q5_codes(b[:, 2:6], b[:, 6:]) - 16)
def _q5_1(b: np.ndarray) -> np.ndarray: return _f16(b[:, :2]) * _q5_codes(b[:, 4:8], b[:, 8:]) + _f16(b[:, 2:4])


def k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """12 packed bytes -> 8 six-bit (scale, min) pairs, as ggml's get_scale_min_k4."""
  s = s.astype(np.uint8)
  hi = s[:, 8:12]
  sc = np.concatenate([s[:, 0:4] & 63, (hi & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
  mn = np.concatenate([s[:, 4:8] & 63, (hi >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
  return sc.astype(np.float32), mn.astype(np.float32)


def _k_low4(qs: np.ndarray) -> np.ndarray:
  """[n, 128] -> [n, 8, 32]: sub-block 2c takes the low nibbles of 32-byte chunk c, 2c+1 the high ones."""
  q = qs.reshape(-1, 4, 1, 32)
  return np.concatenate([q & 0xF, q >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
  d, dmin, (sc, mn) = _f16(b[:, 0:2]), _f16(b[:, 2:4]), k_scales(b[:, 4:16])
  q = _k_low4(b[:, 16:144]).astype(np.float32)
  return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
  d, dmin, (sc, mn) = _f16(b[:, 0:2]), _f16(b[:, 2:4]), k_scales(b[:, 4:16])
  qh = b[:, 16:48]  # bit s of qh[l] is the 5th bit of element l of sub-block s
  high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
  q = (_k_low4(b[:, 48:176]) + 16 * high).astype(np.float32)
  return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
  ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
  sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32).reshape(-1, 2, 4, 2, 1)
  d = _f16(b[:, 208:210]).reshape(-1, 1, 1, 1, 1)
  low = np.stack([ql[..., :32] & 0xF, ql[..., 32:] & 0xF, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=2)  # [n, 2, 4, 32]
  high = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2)
  q = ((low | (high << 4)).astype(np.float32) - 32).reshape(-1, 2, 4, 2, 16)
  return (d * sc * q).reshape(-1, 256)


# IQ4_NL / IQ4_XS: a 4-bit code is an index into this non-linear table (ggml's kvalues_iq4nl), scaled per (sub-)block
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4_codes(qs: np.ndarray) -> np.ndarray:
  """[..., 16] packed bytes -> [..., 32] table values (elements 0..15 from the low nibbles, 16..31 the high)."""
  return np.asarray(IQ4_VALUES, np.float32)[_nibbles(qs)]


def _iq4_nl(b: np.ndarray) -> np.ndarray: return _f16(b[:, :2]) * _iq4_codes(b[:, 2:])


def iq4_xs_scales(b: np.ndarray) -> np.ndarray:
  """IQ4_XS blocks [..., 136] -> the 8 sub-block scales ls - 32 [..., 8] (int8): ls's low 4 bits are nibble ib % 2 of
  scales_l[ib // 2], its high 2 bits bits 2 ib, 2 ib + 1 of the little-endian word scales_h."""
  low = _nibbles(b[..., 4:8])[..., [0, 4, 1, 5, 2, 6, 3, 7]]  # sub-block 2i: low nibble of byte i, 2i + 1: its high
  high = (np.ascontiguousarray(b[..., 2:4]).view(np.uint16) >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
  return ((low | (high.astype(np.uint8) << 4)).astype(np.int16) - 32).astype(np.int8)


def _iq4_xs(b: np.ndarray) -> np.ndarray:
  dl = _f16(b[:, :2]) * iq4_xs_scales(b).astype(np.float32)  # [n, 8]: sub-block ib's scale
  return (dl[:, :, None] * _iq4_codes(b[:, 8:].reshape(-1, 8, 16))).reshape(-1, 256)


_BLOCKWISE: dict[QT, Callable[[np.ndarray], np.ndarray]] = {
  QT.Q8_0: _q8_0, QT.Q4_0: _q4_0, QT.Q4_1: _q4_1, QT.Q5_0: _q5_0, QT.Q5_1: _q5_1, QT.Q4_K: _q4_k, QT.Q5_K: _q5_k, QT.Q6_K: _q6_k,
  QT.IQ4_NL: _iq4_nl, QT.IQ4_XS: _iq4_xs}


def row_bytes(qtype: QT, cols: int, tensor: str = "?") -> int:
  if qtype not in BLOCK:
    raise UnsupportedQuant(qtype, tensor)
  n, nb = BLOCK[qtype]
  if cols % n:
    raise ValueError(f"tensor {tensor!r}: row of {cols} elements is not a multiple of the {qtype.name} block ({n})")
  return cols // n * nb


def dequantize(raw: np.ndarray, qtype: QT, cols: int, tensor: str = "?") -> np.ndarray:
  """raw: uint8 [rows, row_bytes] (any contiguous byte view) -> float32 [rows, cols]."""
  rb = row_bytes(qtype, cols, tensor)
  b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, rb)
  if qtype == QT.F32:
    return b.view(np.float32).copy()
  if qtype == QT.F16:
    return b.view(np.float16).astype(np.float32)
  if qtype == QT.BF16:
    return (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
  _, nb = BLOCK[qtype]
  if qtype not in _BLOCKWISE:
    return np.asarray(gguf_quants.dequantize(b, qtype), np.float32).reshape(b.shape[0], cols)
  return _BLOCKWISE[qtype](b.reshape(-1, nb)).reshape(b.shape[0], cols)
