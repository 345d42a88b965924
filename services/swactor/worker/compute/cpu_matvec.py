"""Hand-scheduled CPU block matvecs: custom UOp kernels with fixed opts, one per packed weight kind (layouts: linear.py).

Why by hand: tinygrad's heuristic scalarizes a block matvec (~2 G weights/s on one core); 8 output rows per iteration
with a block's words and bytes fully unrolled and 4-word vector loads runs ~4x faster (BEAM finds similar shapes, but
only after minutes of search). The codes come as uint32 words (upload(words=True), the same bytes): tinygrad folds
loads into vectors only for 32-bit types; byte i of a block is byte i % 4 of word i // 4, taken out by shifts.

Every kernel computes out[t, o] = sum over the row's blocks of the block's dot product with x. A block with an offset
(w = d * code + m) adds m * (the sum of x over the block): `xs`, the block sums of x, come from a separate small kernel.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tinygrad import UOp, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.uop.ops import AxisType, KernelInfo, Ops

SLICES_PER_THREAD = 4  # compile with Context(NUM_CPU_THREADS=threads * SLICES_PER_THREAD): tinygrad caps slices by it
# elements of x per block sum a kind's kernel reads (apply() computes them); kinds without an offset read none
XSUM_BLOCK = {"q4": 32, "q5_0": 32, "q5_1": 32, "q4_k": 32, "q5_k": 32, "q6_k": 16}

Unrolls = tuple[Opt, ...]


def rows_per_iteration(n: int) -> int:
  """Rows (q4) or row groups (q8_0) one iteration of a kernel computes: 8 where they divide n (measured best)."""
  return next(u for u in (8, 4, 1) if n % u == 0)


def largest_divisor(n: int, most: int) -> int:
  """The largest divisor of n that is at most `most` (>= 1): how many slices or upcast lanes split n evenly."""
  return next(d for d in range(min(n, most), 0, -1) if n % d == 0)


def scale_group(n_out: int) -> int:
  """Rows per scale group of a q8_0 matrix on CPU (upload's layout, block_matvec's row ranges)."""
  return rows_per_iteration(n_out)


def _reduce(*sizes: int) -> list[UOp]:
  """Reduce ranges numbered from 3 (0-2 are the output's t, row group, row in group); UNROLL opts index them in order."""
  return [UOp.range(n, 3 + i, AxisType.REDUCE) for i, n in enumerate(sizes)]


def _unroll_words(nb: int, r: int, words: int) -> Unrolls:
  """Unroll a block's bytes (reduce loop r, 4) and words (loop r - 1) fully. A row of one 256-block (nb = 1: a small
  model's 256-wide matrices) has its block loop, the first, dropped before the opts apply: the others are one lower."""
  r -= nb == 1
  return (Opt(OptOps.UNROLL, r, 4), Opt(OptOps.UNROLL, r - 1, words))


def _byte(word: UOp, r: UOp, shift: int = 0) -> UOp: return word >> (r * 8 + shift).cast(dtypes.uint32)


def _lane(word: UOp, r: UOp) -> UOp:
  """Byte r of a word whose bytes each hold one code (built by whole-word masks and ors: the bit work for 4 codes at once)."""
  return (word >> (r * 8).cast(dtypes.uint32)) & 0xFF


def _q8_0(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, q: UOp, d: UOp) -> tuple[UOp, Unrolls]:
  """w = d * int8 code. q8_0's rows are (group g, row i in group) = 8g + i, with the scales stored group-major (upload);
  the kernel upcasts 8 groups, so an iteration computes 8 rows that lie 8 apart, and loops over i (measured: head
  7.7 -> 5.4 ms on one core; 8 adjacent rows with these scales: 7.2 ms)."""
  nb, nw = q.shape[1], q.shape[2]
  b, k, r = _reduce(nb, nw, 4)
  code = _byte(q[o, b, k].load(), r).cast(dtypes.int8).cast(dtypes.float)
  acc = ((x[t, b * 32 + k * 4 + r].load() * code).reduce(k, r, arg=Ops.ADD) * d[og, b, 0 if oi is None else oi].load()).reduce(b, arg=Ops.ADD)
  return acc, (Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.UNROLL, 1, nw))


def _q4(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, xs: UOp, q: UOp, d: UOp, m: UOp) -> tuple[UOp, Unrolls]:
  """Q4_0/Q4_1: w = d * nibble + m; byte i of a block holds elements i (low nibble) and 16 + i (high)."""
  nb, nw = q.shape[1], q.shape[2]
  b, k, r = _reduce(nb, nw, 4)
  byte, i = _byte(q[o, b, k].load(), r), b * 32 + k * 4 + r
  lo, hi = (byte & 0xF).cast(dtypes.float), ((byte >> 4) & 0xF).cast(dtypes.float)
  dot = (x[t, i].load() * lo + x[t, i + 16].load() * hi).reduce(k, r, arg=Ops.ADD)
  acc = (dot * d[o, b].load() + xs[t, b].load() * m[o, b].load()).reduce(b, arg=Ops.ADD)
  return acc, (Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.UNROLL, 1, nw)) + ((Opt(OptOps.UNROLL, 0, 2),) if nb % 2 == 0 else ())


def _q5(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, xs: UOp, q: UOp, qh: UOp, d: UOp, m: UOp | None = None) -> tuple[UOp, Unrolls]:
  """Q5_0 (w = d * (code - 16)) and Q5_1 (w = d * code + m): Q4's nibbles plus a 5th bit from the block's word qh, its
  bits transposed at upload (linear.transpose_q5_bits) so that bits k and k + 4 of byte r belong to byte r of code
  word k (measured: ~1.2x faster than spreading 4 bits of ggml's order by a multiply, ~1.4x than a shift per code)."""
  nb, nw = q.shape[1], q.shape[2]
  b, k, r = _reduce(nb, nw, 4)
  word, i = q[o, b, k].load(), b * 32 + k * 4 + r
  h = qh[o, b].load() >> k.cast(dtypes.uint32)
  lo = _lane((word & 0x0F0F0F0F) | ((h & 0x01010101) << 4), r).cast(dtypes.float)
  hi = _lane(((word >> 4) & 0x0F0F0F0F) | (((h >> 4) & 0x01010101) << 4), r).cast(dtypes.float)
  dot = (x[t, i].load() * lo + x[t, i + 16].load() * hi).reduce(k, r, arg=Ops.ADD)
  blk = (dot - xs[t, b].load() * 16.0) * d[o, b].load() if m is None else dot * d[o, b].load() + xs[t, b].load() * m[o, b].load()
  return blk.reduce(b, arg=Ops.ADD), (Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.UNROLL, 1, nw)) + ((Opt(OptOps.UNROLL, 0, 2),) if nb % 2 == 0 else ())


def _q4_k(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, xs: UOp, q: UOp, s: UOp, dm: UOp, qh: UOp | None = None) -> tuple[UOp, Unrolls]:
  """Q4_K/Q5_K: a 256-block of 8 sub-blocks of 32, w = d * sc[j] * code - dmin * mn[j] for sub-block j. Code byte l of
  32-byte chunk c holds element l of sub-block 2c (low nibble) and of 2c+1 (high); Q5_K's 5th bit of element l of
  sub-block j is bit j of qh byte l. s = (sc[0..7], mn[0..7]) as bytes, dm = (d, dmin)."""
  nb = q.shape[1]
  b, c, k, r = _reduce(nb, 4, 8, 4)
  word = q[o, b, c * 8 + k].load()
  lo, hi = word & 0x0F0F0F0F, (word >> 4) & 0x0F0F0F0F
  if qh is not None:
    hb = qh[o, b, k].load() >> (c * 2).cast(dtypes.uint32)
    lo, hi = lo | ((hb & 0x01010101) << 4), hi | (((hb >> 1) & 0x01010101) << 4)
  i, j = b * 256 + c * 64 + k * 4 + r, c * 2
  dlo = (x[t, i].load() * _lane(lo, r).cast(dtypes.float)).reduce(k, r, arg=Ops.ADD)
  dhi = (x[t, i + 32].load() * _lane(hi, r).cast(dtypes.float)).reduce(k, r, arg=Ops.ADD)
  sc = lambda n: s[o, b, n].load().cast(dtypes.float)  # noqa: E731
  mins = sc(j + 8) * xs[t, b * 8 + j].load() + sc(j + 9) * xs[t, b * 8 + j + 1].load()
  blk = dm[o, b, 0].load() * (sc(j) * dlo + sc(j + 1) * dhi) - dm[o, b, 1].load() * mins
  return blk.reduce(b, c, arg=Ops.ADD), _unroll_words(nb, 3, 8)


def _q5_k(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, xs: UOp, q: UOp, qh: UOp, s: UOp, dm: UOp) -> tuple[UOp, Unrolls]:
  return _q4_k(t, o, og, oi, x, xs, q, s, dm, qh)


def _q6_k(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, xs: UOp, ql: UOp, qh: UOp, sc: UOp, d: UOp) -> tuple[UOp, Unrolls]:
  """Q6_K: a 256-block of 16 groups of 16, w = d * sc[g] * (code - 32). In half n (128 elements), byte l of ql[n*64 +
  32p ..] holds element n*128 + 32p + l (low nibble) and n*128 + 64 + 32p + l (high); bits 2q, 2q+1 of qh[n*32 + l] are
  the top two bits of element n*128 + 32q + l. Loops: half n, 16-element half h of l, word k, byte r."""
  nb = ql.shape[1]
  b, n, h, k, r = _reduce(nb, 2, 2, 4, 4)
  lw = [ql[o, b, n * 16 + p * 8 + h * 4 + k].load() for p in (0, 1)]
  hw = qh[o, b, n * 8 + h * 4 + k].load()
  blk: UOp | None = None
  for qq in range(4):  # element quarter of the half: 32 elements, 2 scale groups (h)
    code = _lane(((lw[qq % 2] >> (4 * (qq // 2))) & 0x0F0F0F0F) | (((hw >> (2 * qq)) & 0x03030303) << 4), r)
    dot = (x[t, b * 256 + n * 128 + qq * 32 + h * 16 + k * 4 + r].load() * code.cast(dtypes.float)).reduce(k, r, arg=Ops.ADD)
    g = n * 8 + qq * 2 + h
    term = sc[o, b, g].load().cast(dtypes.float) * (dot - xs[t, b * 16 + g].load() * 32.0)
    blk = term if blk is None else blk + term
  assert blk is not None
  return (blk * d[o, b].load()).reduce(b, n, h, arg=Ops.ADD), _unroll_words(nb, 4, 4)


# IQ4_VALUES[c] is P(c) rounded for the codes c = 0..15, P this polynomial (highest power first): a minimax fit of
# degree 5, within 0.371 of every table value (tests check the rounded values)
IQ4_POLY = (0.0001447913935898542, -0.004345319584826073, 0.1186996931830311, -1.9285345848747026, 25.55597710524019,
            -127.37097084267863)


def iq4_value(code: Any) -> Any:
  """IQ4_VALUES[code] as float32 for 4-bit codes (a UOp here, a Tensor in linear.py's expression; an unsigned integer
  type): P(code) by 5 multiply-adds, rounded by truncating P + 128.5 > 0. Plain arithmetic that vectorizes as Q4's
  nibbles do (measured, a 2048x2048 matvec on one core: Q4_0 0.7 ms, IQ4_XS 1.5 ms; a tree of 15 selects on the
  code's bits 14 ms, a gather from a table in memory 3.5 ms), and that every renderer has."""
  c = code.cast(dtypes.float)
  p = c * IQ4_POLY[0] + IQ4_POLY[1]
  for a in IQ4_POLY[2:]:
    p = p * c + a
  return (p + 128.5).cast(dtypes.int32).cast(dtypes.float) - 128.0


def _iq4_nl(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, q: UOp, d: UOp, sc: UOp | None = None) -> tuple[UOp, Unrolls]:
  """IQ4_NL (blocks of 32, w = d * IQ4_VALUES[code]) and IQ4_XS (256-blocks of 8 sub-blocks of 32, w = d * sc[j] *
  IQ4_VALUES[code] in sub-block j): byte i of a 32-element (sub-)block holds elements i (low nibble) and 16 + i (high),
  as Q4_0's."""
  nb = q.shape[1]
  if sc is None:
    b, k, r = _reduce(nb, 4, 4)
    word, i, scale = q[o, b, k].load(), b * 32 + k * 4 + r, d[o, b].load()
  else:
    b, j, k, r = _reduce(nb, 8, 4, 4)
    word, i = q[o, b, j * 4 + k].load(), b * 256 + j * 32 + k * 4 + r
    scale = d[o, b].load() * sc[o, b, j].load().cast(dtypes.float)
  byte = _byte(word, r)
  dot = (x[t, i].load() * iq4_value(byte & 0xF) + x[t, i + 16].load() * iq4_value((byte >> 4) & 0xF)).reduce(k, r, arg=Ops.ADD)
  unrolls = _unroll_words(nb, 2 if sc is None else 3, 4)
  if sc is None:
    return (dot * scale).reduce(b, arg=Ops.ADD), unrolls  # (unrolling two blocks, as Q4's kernel does, ran 2.5x slower)
  return (dot * scale).reduce(b, j, arg=Ops.ADD), unrolls


def _iq4_xs(t: UOp, o: UOp, og: UOp, oi: UOp | None, x: UOp, q: UOp, sc: UOp, d: UOp) -> tuple[UOp, Unrolls]:
  return _iq4_nl(t, o, og, oi, x, q, d, sc)


KERNELS: dict[str, Callable[..., tuple[UOp, Unrolls]]] = {
  "q8_0": _q8_0, "q4": _q4, "q5_0": _q5, "q5_1": _q5, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k,
  "iq4_nl": _iq4_nl, "iq4_xs": _iq4_xs}


def block_matvec(kind: str, threads: int, out: UOp, x: UOp, *w: UOp) -> UOp:
  """out[t, o] = x[t] . row o of the packed weight; w = [xs (kinds in XSUM_BLOCK)] + the weight's device tensors."""
  return _scheduled(kind, threads, out, x, w, f"{kind}_matvec_{out.shape[1]}", lambda t, og, groups: og, lambda t: t)


def expert_matvec(kind: str, threads: int, share: int, n_experts: int, out: UOp, x: UOp, ids: UOp, *w: UOp) -> UOp:
  """A Mixture-of-Experts product: out[r, o] = x[r // share] . row o of expert ids[r], the experts' packed matrices
  stacked ([n_experts * n_out, ...], as upload lays out one matrix of n_experts * n_out rows); w = [xs (kinds in
  XSUM_BLOCK)] + those device tensors. Only the routed experts' rows are read: the expert id, loaded from `ids`, offsets
  the row index, so the kernel reads ids[r]'s matrix and no other (a one-hot sum over every expert would read all).
  Scheduled as block_matvec; rows upcast together read their own experts' words."""
  def expert_row(r: UOp, og: UOp, groups: int) -> UOp:
    # an id outside the experts would read another tensor's memory: taken modulo n_experts (the router's ids are
    # < n_experts, so this changes none). As weakint, tinygrad's index arithmetic, the modulo's bounds carry into the
    # address: as int32 they do not, so tinygrad kept wrapping each word's address modulo the buffer and loaded the
    # code words one by one, not as block_matvec's vectors (~2x its time per weight)
    e = (ids[r].load().cast(dtypes.uint32) % n_experts).cast(dtypes.weakint)
    return e * groups + og
  return _scheduled(kind, threads, out, x, w, f"{kind}_experts_{out.shape[1]}", expert_row,
                    lambda r: r // share if share > 1 else r)


def _scheduled(kind: str, threads: int, out: UOp, x: UOp, w: tuple[UOp, ...], name: str,
               weight_row: Callable[[UOp, UOp, int], UOp], x_row: Callable[[UOp], UOp]) -> UOp:
  """The block kernel of `kind` over out's rows t and weight row groups og, reading weight row group
  weight_row(t, og, groups) and x row x_row(t), scheduled for the CPU."""
  (T, n_out), cols = out.shape, x.shape[1]
  g = scale_group(n_out) if kind == "q8_0" else 1
  # Rows of x per iteration: each weight block is read and dequantized once for all of them (a batched decode step's
  # rows, a prefill chunk's): with the row loop outside, every row would read the whole matrix again. Fewer weight rows
  # per iteration then, so the accumulators of both stay in registers.
  tb = next(u for u in (4, 2, 1) if T % u == 0)
  up = rows_per_iteration(n_out // g)
  while up > 1 and up * tb > 16:
    up //= 2
  t, og = UOp.range(T, 0), UOp.range(n_out // g, 1)
  oi = UOp.range(g, 2) if g > 1 else None
  row = weight_row(t, og, n_out // g)
  acc, unrolls = KERNELS[kind](x_row(t), row if oi is None else row * g + oi, row, oi, x, *w)
  # the row (group) axis: a size-1 range is dropped before opts are applied, and x's rows upcast whole leave the loops
  ax = 0 if tb == T else 1
  # core_id slices: up to SLICES_PER_THREAD per thread, so that a thread that starts late still finds some to take
  # (replay.py hands them out one by one), each of >= 32K weights (~4 us of one core: much more than taking one)
  most = min(threads * SLICES_PER_THREAD if threads > 1 else 1, NUM_CPU_THREADS.value, max(1, n_out * cols >> 15))
  th = largest_divisor(n_out // g // up, most)
  opts = ((Opt(OptOps.UPCAST, 0, tb),) if tb > 1 else ()) + ((Opt(OptOps.UPCAST, ax, up),) if up > 1 else ()) + unrolls \
      + ((Opt(OptOps.THREAD, ax, th),) if th > 1 else ())
  o = og if oi is None else og * g + oi
  return out[t, o].store(acc).end(*(u for u in (t, og, oi) if u is not None)).sink(arg=KernelInfo(name=name, opts_to_apply=opts))
