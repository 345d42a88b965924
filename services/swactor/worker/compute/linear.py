"""Device-side weight matrices: y = x @ W.T for a float weight or a GGML-block weight dequantized inside the kernel.

A weight is (kind, tensors) so that one jitted layer graph can be replayed over every layer's tensors.
  "f32":  [W float32 [out, in]]                                   (dequantized once at load)
  "q8_0": [q int8 [out, nb, 32], d float32 [out, nb]]             w = d * q
  "q4":   [q uint8 [out, nb, 16], d, m float32 [out, nb]]         w = d * nibble + m  (Q4_0: m = -8 d)
"""
from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor, UOp, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.dtype import _from_np_dtype
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.uop.ops import AxisType, KernelInfo, Ops

from .gguf_weights import RawTensor

Weight = tuple[str, list[Tensor]]
SLICES_PER_THREAD = 4  # compile with Context(NUM_CPU_THREADS=threads * SLICES_PER_THREAD): tinygrad caps slices by it
N_TENSORS = {"f32": 1, "q8_0": 2, "q4": 3}


def to_device(a: np.ndarray, device: str) -> Tensor:
  """A realized device tensor holding a copy of `a`: allocate + copyin, no tinygrad schedule (~100x faster per tensor)."""
  return copy_in(Tensor.empty(*a.shape, dtype=_from_np_dtype(a.dtype), device=device), a)


def copy_in(t: Tensor, a: np.ndarray) -> Tensor:
  """Overwrite the (realized or empty) device buffer of `t` with `a` (same size) in place."""
  buf = t.uop.buffer.ensure_allocated()
  buf.allocator._copyin(buf._buf, memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
  return t


def upload(w: np.ndarray | RawTensor, device: str, words: bool = False) -> Weight:
  """words: the layout of the CPU kernel (block_matvec): codes as uint32 [out, nb, 4 or 8] (the same bytes), so that it loads
  a block in 4-word vector loads (tinygrad folds loads into vectors for 32-bit types only, bytes are loaded one by one)."""
  dev = lambda a: to_device(a, device)  # noqa: E731
  if not isinstance(w, RawTensor) or w.qtype not in (QT.Q8_0, QT.Q4_0, QT.Q4_1):
    return "f32", [dev(np.asarray(w.dequantize() if isinstance(w, RawTensor) else w, np.float32))]
  out, cols = w.shape
  b = np.asarray(w.data).reshape(out, cols // 32, -1)
  f16 = lambda a: np.ascontiguousarray(a).view(np.float16).astype(np.float32)[..., 0]  # noqa: E731
  codes = lambda a: np.ascontiguousarray(a).view(np.uint32) if words else a  # noqa: E731
  d = f16(b[..., 0:2])
  if w.qtype == QT.Q8_0:
    if words:  # [out / g, nb, g]: group-major (block_matvec)
      g = scale_group(out)
      d = np.ascontiguousarray(d.reshape(out // g, g, -1).transpose(0, 2, 1))
    return "q8_0", [dev(codes(b[..., 2:].view(np.int8))), dev(d)]
  if w.qtype == QT.Q4_1:
    return "q4", [dev(codes(b[..., 4:])), dev(d), dev(f16(b[..., 2:4]))]
  return "q4", [dev(codes(b[..., 2:])), dev(d), dev(-8.0 * d)]


def apply(kind: str, ts: list[Tensor], x: Tensor, threads: int = 0) -> Tensor:
  """y = x @ W.T. threads > 0 (CPU only): a hand-scheduled block matvec kernel split into that many core_id slices."""
  T = x.shape[0]
  if kind == "f32":
    return x @ ts[0].T
  if threads > 0:
    srcs = [x.contiguous(), *([x.reshape(T, -1, 32).sum(-1)] if kind == "q4" else []), *ts]
    out = Tensor.empty(T, ts[0].shape[0], dtype=dtypes.float32, device=x.device)
    return out.custom_kernel(*srcs, fxn=functools.partial(block_matvec, kind, threads))[0]
  if kind == "q8_0":
    q, d = ts
    return ((x.reshape(T, 1, q.shape[1], 32) * q.float()).sum(-1) * d).sum(-1)
  q, d, m = ts
  xb = x.reshape(T, 1, q.shape[1], 2, 16)  # element j of a block pairs with low nibble j, element 16+j with high nibble j
  dot = (xb[:, :, :, 0] * (q & 0xF).float()).sum(-1) + (xb[:, :, :, 1] * (q >> 4).float()).sum(-1)
  return (dot * d + xb.sum((-1, -2)) * m).sum(-1)


def rows_per_iteration(n: int) -> int:
  """Rows (q4) or row groups (q8_0) one iteration of block_matvec computes: 8 where they divide n (measured best)."""
  return next(u for u in (8, 4, 1) if n % u == 0)


def scale_group(n_out: int) -> int:
  """Rows per scale group of a q8_0 matrix on CPU (upload's layout, block_matvec's row ranges)."""
  return rows_per_iteration(n_out)


def block_matvec(kind: str, threads: int, out: UOp, x: UOp, *w: UOp) -> UOp:
  """out[t, o] = sum over blocks b: q8_0: d[o,b] * sum_i x[t,32b+i] q[o,b,i]
                                    q4:   d[o,b] * sum_i (x[t,32b+i] lo(q[o,b,i]) + x[t,32b+16+i] hi(q[o,b,i])) + m[o,b] * xsum[t,b]
  with the codes as uint32 words (upload(words=True)): code i is byte i % 4 of word i // 4.
  Why by hand: tinygrad's heuristic scalarizes this (~2 G weights/s); 8 rows per iteration with two blocks unrolled and
  vector loads of the words runs ~4x faster on one core (BEAM finds a similar shape, but only after minutes of search)."""
  q, d = (w[0], w[1]) if kind == "q8_0" else (w[1], w[2])
  (T, n_out), (_, nb, nw) = out.shape, q.shape
  # q8_0's rows are (group g, row i in group) = 8g + i, with the scales stored group-major (upload); the kernel upcasts
  # 8 groups, so an iteration computes 8 rows that lie 8 apart, and loops over i (measured: head 7.7 -> 5.4 ms on one
  # core; 8 adjacent rows with these scales: 7.2 ms). q4's rows are one range, 8 adjacent rows per iteration.
  g = scale_group(n_out) if kind == "q8_0" else 1
  up = rows_per_iteration(n_out // g)
  t, og = UOp.range(T, 0), UOp.range(n_out // g, 1)
  oi = UOp.range(g, 2) if g > 1 else None
  o = og if oi is None else og * g + oi
  b, k, r = UOp.range(nb, 3, AxisType.REDUCE), UOp.range(nw, 4, AxisType.REDUCE), UOp.range(4, 5, AxisType.REDUCE)
  byte = q[o, b, k].load() >> (r * 8).cast(dtypes.uint32)
  i = b * 32 + k * 4 + r
  if kind == "q8_0":
    acc = ((x[t, i].load() * byte.cast(dtypes.int8).cast(dtypes.float)).reduce(k, r, arg=Ops.ADD) * d[og, b, oi].load()).reduce(b, arg=Ops.ADD)
  else:
    xs, m = w[0], w[3]
    lo, hi = (byte & 0xF).cast(dtypes.float), ((byte >> 4) & 0xF).cast(dtypes.float)
    dot = (x[t, i].load() * lo + x[t, i + 16].load() * hi).reduce(k, r, arg=Ops.ADD)
    acc = (dot * d[o, b].load() + xs[t, b].load() * m[o, b].load()).reduce(b, arg=Ops.ADD)
  ax = 0 if T == 1 else 1  # the row (group) axis: a size-1 range is dropped before opts are applied
  # core_id slices: up to SLICES_PER_THREAD per thread, so that a thread that starts late still finds some to take
  # (replay.py hands them out one by one), each of >= 32K weights (~4 us of one core: much more than taking one)
  most = min(threads * SLICES_PER_THREAD if threads > 1 else 1, NUM_CPU_THREADS.value, max(1, n_out * nb * 32 >> 15))
  th = next(n for n in range(most, 0, -1) if (n_out // g // up) % n == 0)
  opts = ((Opt(OptOps.UPCAST, ax, up),) if up > 1 else ()) + (Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.UNROLL, 1, nw)) + \
         ((Opt(OptOps.UNROLL, 0, 2),) if nb % 2 == 0 and nw == 4 else ()) + ((Opt(OptOps.THREAD, ax, th),) if th > 1 else ())
  return out[t, o].store(acc).end(*(u for u in (t, og, oi) if u is not None)).sink(arg=KernelInfo(name=f"{kind}_matvec_{n_out}", opts_to_apply=opts))
