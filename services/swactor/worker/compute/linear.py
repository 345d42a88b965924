"""Device-side weight matrices: y = x @ W.T for a float weight or a GGML-block weight dequantized inside the kernel.

A weight is (kind, tensors) so that one jitted layer graph can be replayed over every layer's tensors. Per block of a
row (nb blocks per row), the device holds the file's codes as they are and the scales in float32 (or as bytes):
  kind    GGML types    tensors                                                               w               B/block (file)
  "f32"   the rest      [W float32 [out, in]]                 (dequantized once at load)
  "q8_0"  Q8_0          [q int8 [out, nb, 32], d float32 [out, nb]]                           d q             36 (34)
  "q4"    Q4_0, Q4_1    [q uint8 [out, nb, 16], d, m float32 [out, nb]]                       d q + m         24 (18, 20)
  "q5_0"  Q5_0          [q uint8 [out, nb, 16], qh uint32 [out, nb], d]                       d (q - 16)      24 (22)
  "q5_1"  Q5_1          [q, qh, d, m]                                                         d q + m         28 (24)
  "q4_k"  Q4_K          [q uint8 [out, nb, 128], s uint8 [out, nb, 16], dm float32 [out, nb, 2]]     152 (144)
  "q5_k"  Q5_K          [q uint8 [out, nb, 128], qh uint8 [out, nb, 32], s, dm]                      184 (176)
  "q6_k"  Q6_K          [ql uint8 [out, nb, 128], qh uint8 [out, nb, 64], sc int8 [out, nb, 16], d]  212 (210)
  "iq4_nl" IQ4_NL       [q uint8 [out, nb, 16], d float32 [out, nb]]                          d V[q]          20 (18)
  "iq4_xs" IQ4_XS       [q uint8 [out, nb, 128], sc int8 [out, nb, 8], d float32 [out, nb]]   d sc[j] V[q]    140 (136)
Q4_0's m is -8 d. The K-quants' 6-bit sub-block scales and mins are unpacked to bytes s = (sc[0..7], mn[0..7]) and
their d, dmin kept as dm: w = d sc[j] q - dmin mn[j] in sub-block j (the products stay exact in float32). Code layouts
within a block are ggml's (cpu_matvec.py says which byte holds which element). The IQ4 types' codes index the
non-linear table V = quant.IQ4_VALUES (looked up in the kernel, cpu_matvec.iq4_value); IQ4_XS's 6-bit sub-block scales
are unpacked to int8 sc = ls - 32.
"""
from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType as QT
from tinygrad import Tensor, UOp, dtypes
from tinygrad.dtype import _from_np_dtype

from swactor.modelfile import memory
from swactor.modelfile.support import PACKED_TYPES

from .cpu_matvec import XSUM_BLOCK, block_matvec, expert_matvec, iq4_value, scale_group
from .gguf_weights import RawTensor
from .quant import BLOCK, iq4_xs_scales, k_scales

Weight = tuple[str, list[Tensor]]
# The device layout (kernel kind) of each packed type; which types are packed is support.PACKED_TYPES' choice (a type
# declared there without a layout here fails at import).
_KIND = {"Q8_0": "q8_0", "Q4_0": "q4", "Q4_1": "q4", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
         "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs"}
PACKED: dict[QT, str] = {QT[name]: _KIND[name] for name in PACKED_TYPES}
N_TENSORS = {"f32": 1, "q8_0": 2, "q4": 3, "q5_0": 3, "q5_1": 4, "q4_k": 3, "q5_k": 4, "q6_k": 4, "iq4_nl": 2, "iq4_xs": 3}


def device_nbytes(qtype: QT, rows: int, cols: int) -> int:
  """Device bytes of a [rows, cols] matrix of this type as upload() lays it out (float32 for unpacked types): the
  model-file package's count, which the orchestrator's planner uses too (tests check it against upload())."""
  return memory.device_nbytes(qtype.name if qtype in PACKED else "F32", rows, cols)


def to_device(a: np.ndarray, device: str) -> Tensor:
  """A realized device tensor holding a copy of `a`: allocate + copyin, no tinygrad schedule (~100x faster per tensor)."""
  return copy_in(Tensor.empty(*a.shape, dtype=_from_np_dtype(a.dtype), device=device), a)


def device_empty(shape: tuple[int, ...], dtype: type, device: str) -> Tensor:
  """A realized device tensor whose contents are not written here: on the CPU its pages are committed only once a step
  writes them (anonymous mmap), so KV slots no run has used cost no memory yet."""
  t = Tensor.empty(*shape, dtype=_from_np_dtype(np.dtype(dtype)), device=device)
  t.uop.buffer.ensure_allocated()
  return t


def copy_in(t: Tensor, a: np.ndarray) -> Tensor:
  """Overwrite the (realized or empty) device buffer of `t` with `a` (same size) in place."""
  buf = t.uop.buffer.ensure_allocated()
  buf.allocator._copyin(buf._buf, memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
  return t


def _f16(a: np.ndarray) -> np.ndarray: return np.ascontiguousarray(a).view(np.float16).astype(np.float32)[..., 0]


def transpose_q5_bits(h: np.ndarray) -> np.ndarray:
  """Q5_0/Q5_1's 5th bits (bit j: element j) for the CPU kernel: bit 8r + k <- bit 4k + r (element 4k + r, the low nibble
  of byte r of code word k) and bit 8r + 4 + k <- bit 16 + 4k + r (its high nibble), so that `(h >> k) & 0x01010101`
  puts word k's four 5th bits in its four bytes."""
  out = np.zeros_like(h)
  for k in range(4):
    for r in range(4):
      out |= ((h >> (4 * k + r)) & 1) << (8 * r + k)
      out |= ((h >> (16 + 4 * k + r)) & 1) << (8 * r + 4 + k)
  return out


def layout(w: RawTensor, words: bool = False, group_of: int | None = None) -> tuple[str, list[np.ndarray]]:
  """The host arrays of a packed matrix's device tensors (table above). words: the CPU kernels' layout (cpu_matvec.py):
  codes as uint32 [out, nb, bytes / 4] (the same bytes), q8_0's scales group-major [out / g, nb, g] with g =
  scale_group(group_of or out) (stacked experts: of one expert's rows), Q5's 5th bits transposed (transpose_q5_bits)."""
  out, cols = w.shape
  kind, b = PACKED[w.qtype], np.asarray(w.data).reshape(out, cols // BLOCK[w.qtype][0], -1)
  codes = lambda a: np.ascontiguousarray(a).view(np.uint32) if words else np.ascontiguousarray(a)  # noqa: E731
  word = lambda a: np.ascontiguousarray(a).view(np.uint32)[..., 0]  # noqa: E731
  d = _f16(b[..., 0:2])
  fifth = lambda h: transpose_q5_bits(h) if words else h  # noqa: E731
  if w.qtype == QT.Q8_0:
    if words:  # [out / g, nb, g]: group-major (block_matvec)
      g = scale_group(group_of or out)
      d = np.ascontiguousarray(d.reshape(out // g, g, -1).transpose(0, 2, 1))
    return kind, [codes(b[..., 2:].view(np.int8)), d]
  if w.qtype == QT.Q4_0:
    return kind, [codes(b[..., 2:]), d, -8.0 * d]
  if w.qtype == QT.Q4_1:
    return kind, [codes(b[..., 4:]), d, _f16(b[..., 2:4])]
  if w.qtype == QT.Q5_0:
    return kind, [codes(b[..., 6:]), fifth(word(b[..., 2:6])), d]
  if w.qtype == QT.Q5_1:
    return kind, [codes(b[..., 8:]), fifth(word(b[..., 4:8])), d, _f16(b[..., 2:4])]
  if w.qtype == QT.IQ4_NL:
    return kind, [codes(b[..., 2:]), d]
  if w.qtype == QT.IQ4_XS:
    return kind, [codes(b[..., 8:]), iq4_xs_scales(b), d]
  if w.qtype == QT.Q6_K:
    return kind, [codes(b[..., :128]), codes(b[..., 128:192]), np.ascontiguousarray(b[..., 192:208]).view(np.int8), _f16(b[..., 208:210])]
  sc, mn = k_scales(b[..., 4:16].reshape(-1, 12))
  s = np.concatenate([sc, mn], axis=1).astype(np.uint8).reshape(*b.shape[:2], 16)
  dm = np.stack([d, _f16(b[..., 2:4])], axis=-1)
  if w.qtype == QT.Q4_K:
    return kind, [codes(b[..., 16:]), s, dm]
  return kind, [codes(b[..., 48:]), codes(b[..., 16:48]), s, dm]  # Q5_K


def upload(w: np.ndarray | RawTensor, device: str, words: bool = False) -> Weight:
  """A matrix on the device: packed (layout()) if its type is in PACKED, else dequantized to float32."""
  if not isinstance(w, RawTensor) or w.qtype not in PACKED:
    return "f32", [to_device(np.asarray(w.dequantize() if isinstance(w, RawTensor) else w, np.float32), device)]
  kind, arrays = layout(w, words)
  return kind, [to_device(a, device) for a in arrays]


def upload_experts(w: np.ndarray | RawTensor, device: str, words: bool = False) -> Weight:
  """Experts' matrices stacked [n_experts, out, in] on the device as one matrix of n_experts * out rows (every expert:
  rows of a block type are independent, so the raw blocks are the file's as they are); apply_experts reads them."""
  n, out, cols = w.shape
  if not isinstance(w, RawTensor) or w.qtype not in PACKED:
    return upload(np.asarray(w.dequantize() if isinstance(w, RawTensor) else w, np.float32).reshape(n * out, cols), device)
  kind, arrays = layout(RawTensor(w.name, w.qtype, (n * out, cols), w.data), words, group_of=out)
  return kind, [to_device(a, device) for a in arrays]


def apply_experts(kind: str, ts: list[Tensor], x: Tensor, ids: Tensor, n_out: int, share: int, threads: int = 0) -> Tensor:
  """y[r] = x[r // share] @ W[ids[r]].T for each routed row r: ids int32 [R] (experts), x [R / share, in], ts one
  upload_experts() weight of n_out rows per expert; [R, n_out]. Only the experts in ids are read, on every path: the
  CPU kernel offsets its row index by the loaded id (cpu_matvec.expert_matvec); elsewhere tinygrad folds W[ids] (an
  index by a tensor) into a load at the id, not a one-hot sum over every expert (checked: its kernel reads
  W[ids[r] * n_out * in + ...])."""
  R = ids.shape[0]
  if threads > 0 and kind != "f32":
    srcs = [x.contiguous(), *([x.reshape(x.shape[0], -1, XSUM_BLOCK[kind]).sum(-1)] if kind in XSUM_BLOCK else []), *ts]
    out = Tensor.empty(R, n_out, dtype=dtypes.float32, device=x.device)
    fxn = functools.partial(_expert_kernel, kind, threads, share, ts[0].shape[0] // n_out)
    return out.custom_kernel(ids, *srcs, fxn=fxn)[0]
  xr = x if share == 1 else x.unsqueeze(1).expand(x.shape[0], share, x.shape[1]).reshape(R, x.shape[1])
  stacked = [t.reshape(t.shape[0] // n_out, n_out, *t.shape[1:]) for t in ts]
  if kind == "f32":
    return (stacked[0][ids] * xr.unsqueeze(1)).sum(-1)
  # the packed expressions take one matrix: one per routed row, each gathered at its id
  rows = [EXPRESSIONS[kind](xr[r:r + 1], *(t[ids[r:r + 1]].reshape(t.shape[1:]) for t in stacked)) for r in range(R)]
  return rows[0] if R == 1 else Tensor.cat(*rows, dim=0)


def _expert_kernel(kind: str, threads: int, share: int, n_experts: int, out: UOp, ids: UOp, x: UOp, *w: UOp) -> UOp:
  return expert_matvec(kind, threads, share, n_experts, out, x, ids, *w)


def apply(kind: str, ts: list[Tensor], x: Tensor, threads: int = 0) -> Tensor:
  """y = x @ W.T. threads > 0 (CPU only): the hand-scheduled kernel of cpu_matvec.py split into that many core_id
  slices; threads = 0: a tensor expression (what other devices run, with tinygrad's own opts)."""
  T = x.shape[0]
  if kind == "f32":
    return x @ ts[0].T
  if threads > 0:
    srcs = [x.contiguous(), *([x.reshape(T, -1, XSUM_BLOCK[kind]).sum(-1)] if kind in XSUM_BLOCK else []), *ts]
    out = Tensor.empty(T, ts[0].shape[0], dtype=dtypes.float32, device=x.device)
    return out.custom_kernel(*srcs, fxn=functools.partial(block_matvec, kind, threads))[0]
  return EXPRESSIONS[kind](x, *ts)


def _q8_0(x: Tensor, q: Tensor, d: Tensor) -> Tensor:
  return ((x.reshape(x.shape[0], 1, q.shape[1], 32) * q.float()).sum(-1) * d).sum(-1)


def _q4(x: Tensor, q: Tensor, d: Tensor, m: Tensor) -> Tensor:
  xb = x.reshape(x.shape[0], 1, q.shape[1], 2, 16)  # element j of a block pairs with low nibble j, element 16+j with high nibble j
  dot = (xb[:, :, :, 0] * (q & 0xF).float()).sum(-1) + (xb[:, :, :, 1] * (q >> 4).float()).sum(-1)
  return (dot * d + xb.sum((-1, -2)) * m).sum(-1)


def _q5(x: Tensor, q: Tensor, qh: Tensor, d: Tensor, m: Tensor | None = None) -> Tensor:
  xb = x.reshape(x.shape[0], 1, q.shape[1], 2, 16)
  h, j = qh.unsqueeze(-1), Tensor.arange(16, dtype=dtypes.uint32)  # bit j of qh: 5th bit of element j
  lo = (q.cast(dtypes.uint32) & 0xF) | (((h >> j) & 1) << 4)
  hi = (q.cast(dtypes.uint32) >> 4) | (((h >> (j + 16)) & 1) << 4)
  dot, xs = (xb[:, :, :, 0] * lo.float()).sum(-1) + (xb[:, :, :, 1] * hi.float()).sum(-1), xb.sum((-1, -2))
  return ((dot - 16 * xs) * d if m is None else dot * d + xs * m).sum(-1)


def _q4_k(x: Tensor, q: Tensor, s: Tensor, dm: Tensor, qh: Tensor | None = None) -> Tensor:
  out, nb = q.shape[:2]
  xb = x.reshape(x.shape[0], 1, nb, 4, 2, 32)  # [chunk c, sub-block 2c + half, element]
  q = q.reshape(out, nb, 4, 32).cast(dtypes.uint32)
  lo, hi = q & 0xF, q >> 4
  if qh is not None:  # bit j of qh byte l: 5th bit of element l of sub-block j
    h, sh = qh.reshape(out, nb, 1, 32).cast(dtypes.uint32), Tensor.arange(0, 8, 2, dtype=dtypes.uint32).reshape(4, 1)
    lo, hi = lo | (((h >> sh) & 1) << 4), hi | (((h >> (sh + 1)) & 1) << 4)
  sc, mn = s[..., :8].float().reshape(out, nb, 4, 2), s[..., 8:].float().reshape(out, nb, 4, 2)
  dots = (xb[..., 0, :] * lo.float()).sum(-1) * sc[..., 0] + (xb[..., 1, :] * hi.float()).sum(-1) * sc[..., 1]
  return (dm[..., 0] * dots.sum(-1) - dm[..., 1] * (xb.sum(-1) * mn).sum((-1, -2))).sum(-1)


def _q5_k(x: Tensor, q: Tensor, qh: Tensor, s: Tensor, dm: Tensor) -> Tensor: return _q4_k(x, q, s, dm, qh)


def _q6_k(x: Tensor, ql: Tensor, qh: Tensor, sc: Tensor, d: Tensor) -> Tensor:
  out, nb = ql.shape[:2]
  xb = x.reshape(x.shape[0], 1, nb, 2, 4, 2, 16)  # [half n, quarter, 16-group h, element]
  # quarter qq = 2 nib + p of a half: nibble nib of ql part p, bits 2qq, 2qq+1 of qh (shifts by a constant tensor, so
  # that the codes are one expression and the whole product one reduce)
  low = ql.reshape(out, nb, 2, 1, 2, 32).cast(dtypes.uint32) >> Tensor.arange(0, 8, 4, dtype=dtypes.uint32).reshape(2, 1, 1)
  high = qh.reshape(out, nb, 2, 1, 32).cast(dtypes.uint32) >> Tensor.arange(0, 8, 2, dtype=dtypes.uint32).reshape(4, 1)
  code = ((low.reshape(out, nb, 2, 4, 32) & 0xF) | ((high & 3) << 4)).reshape(out, nb, 2, 4, 2, 16)
  groups = (xb * code.float()).sum(-1) - 32 * xb.sum(-1)  # [T, out, nb, n, quarter, h]
  return ((groups * sc.float().reshape(out, nb, 2, 4, 2)).sum((-1, -2, -3)) * d).sum(-1)


def _iq4_nl(x: Tensor, q: Tensor, d: Tensor, sc: Tensor | None = None) -> Tensor:
  out, nb = q.shape[:2]
  sub = q.shape[2] // 16  # 32-element (sub-)blocks per block: 1, or IQ4_XS's 8
  xb = x.reshape(x.shape[0], 1, nb, sub, 2, 16)  # element j of a sub-block pairs with low nibble j, element 16+j with high nibble j
  q = q.reshape(out, nb, sub, 16)
  dots = (xb[..., 0, :] * iq4_value(q & 0xF)).sum(-1) + (xb[..., 1, :] * iq4_value(q >> 4)).sum(-1)  # [T, out, nb, sub]
  return ((dots if sc is None else dots * sc.float()).sum(-1) * d).sum(-1)


def _iq4_xs(x: Tensor, q: Tensor, sc: Tensor, d: Tensor) -> Tensor: return _iq4_nl(x, q, d, sc)


EXPRESSIONS = {"q8_0": _q8_0, "q4": _q4, "q5_0": _q5, "q5_1": _q5, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k,
               "iq4_nl": _iq4_nl, "iq4_xs": _iq4_xs}
