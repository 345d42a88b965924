"""Device-side weight matrices: y = x @ W.T for a float weight or a GGML-block weight dequantized inside the kernel.

A weight is (kind, tensors) so that one jitted layer graph can be replayed over every layer's tensors.
  "f32":  [W float32 [out, in]]                                   (dequantized once at load)
  "q8_0": [q int8 [out, nb, 32], d float32 [out, nb]]             w = d * q
  "q4":   [q uint8 [out, nb, 16], d, m float32 [out, nb]]         w = d * nibble + m  (Q4_0: m = -8 d)
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor
from tinygrad.dtype import _from_np_dtype

from .gguf_weights import RawTensor

Weight = tuple[str, list[Tensor]]
N_TENSORS = {"f32": 1, "q8_0": 2, "q4": 3}


def to_device(a: np.ndarray, device: str) -> Tensor:
  """A realized device tensor holding a copy of `a`: allocate + copyin, no tinygrad schedule (~100x faster per tensor)."""
  return copy_in(Tensor.empty(*a.shape, dtype=_from_np_dtype(a.dtype), device=device), a)


def copy_in(t: Tensor, a: np.ndarray) -> Tensor:
  """Overwrite the (realized or empty) device buffer of `t` with `a` (same size) in place."""
  buf = t.uop.buffer.ensure_allocated()
  buf.allocator._copyin(buf._buf, memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
  return t


def upload(w: np.ndarray | RawTensor, device: str) -> Weight:
  dev = lambda a: to_device(a, device)  # noqa: E731
  if not isinstance(w, RawTensor) or w.qtype not in (QT.Q8_0, QT.Q4_0, QT.Q4_1):
    return "f32", [dev(np.asarray(w.dequantize() if isinstance(w, RawTensor) else w, np.float32))]
  out, cols = w.shape
  b = np.asarray(w.data).reshape(out, cols // 32, -1)
  f16 = lambda a: np.ascontiguousarray(a).view(np.float16).astype(np.float32)[..., 0]  # noqa: E731
  d = f16(b[..., 0:2])
  if w.qtype == QT.Q8_0:
    return "q8_0", [dev(b[..., 2:].view(np.int8)), dev(d)]
  if w.qtype == QT.Q4_1:
    return "q4", [dev(b[..., 4:]), dev(d), dev(f16(b[..., 2:4]))]
  return "q4", [dev(b[..., 2:]), dev(d), dev(-8.0 * d)]


def apply(kind: str, ts: list[Tensor], x: Tensor) -> Tensor:
  T = x.shape[0]
  if kind == "f32":
    return x @ ts[0].T
  if kind == "q8_0":
    q, d = ts
    return ((x.reshape(T, 1, q.shape[1], 32) * q.float()).sum(-1) * d).sum(-1)
  q, d, m = ts
  xb = x.reshape(T, 1, q.shape[1], 2, 16)  # element j of a block pairs with low nibble j, element 16+j with high nibble j
  dot = (xb[:, :, :, 0] * (q & 0xF).float()).sum(-1) + (xb[:, :, :, 1] * (q >> 4).float()).sum(-1)
  return (dot * d + xb.sum((-1, -2)) * m).sum(-1)
