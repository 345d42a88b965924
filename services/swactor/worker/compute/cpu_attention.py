"""One segment's attention on the CPU as hand-scheduled kernels, split over the launcher's threads (replay.py).

Why: tinygrad's heuristic never threads a kernel whose size depends on a Variable (it cannot tell the work is large), and
on the symbolic key length it loads each key once per query head. So the attention ran on one core at ~2 GFLOP/s: at
1536 positions SmolLM2's decode step took 45 ms against 16 ms at 128, most of it in attention. Here the scores kernel
reads each key once for the query heads that share it (UPCAST over the group), the weighted sum reads each value row
once for them and 16 of its columns at a time, and each kernel is split over the launcher's threads (THREAD).

For query rows t (positions sp + t) against places l < L of the segment's slot:
  scores    S[kv, g, t, l] = scale * q . k_l (soft-capped; causality, a sliding window or the ring's mask applied)
  weights   m = the max of S's row (a tinygrad reduction), W = exp(S - m), z = the sum of W's row
  values    out[t, (kv, g) head] = sum over l of W v_l / z
S and W are fixed [KV, g, T, cache length] buffers of which a step writes its first L columns. Other devices run
model.layer_forward's tensor expression.
"""
from __future__ import annotations

import functools
import math

from tinygrad import Tensor, UOp, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.uop.ops import AxisType, KernelInfo, Ops

from .cpu_matvec import SLICES_PER_THREAD, largest_divisor
from .gguf_weights import LlamaParams

NEG_INF = -math.inf
GROUP_UPCAST = 4  # query heads of a group computed together, at most (their accumulators stay in registers)
VALUE_COLUMNS = 16  # columns of a value row one iteration reads (four 4-float vectors)


def _param(u: UOp | int) -> UOp | int:
  """A step Variable (bound in the layer graph) as the kernel-side parameter of the same name, which replays bind."""
  if isinstance(u, int):
    return u
  v = u.src[0] if u.op is Ops.AFTER else u
  return UOp.variable(v.arg.name, *v.arg.vmin_vmax, param=True)


def _opts(axes: list[tuple[int, int]], upcasts: dict[int, int], unrolls: tuple[Opt, ...], threads: int) -> tuple[Opt, ...]:
  """Opts for a kernel whose output ranges are `axes` (range id, size, 0 for the symbolic key length; ranges of size
  1 are dropped before opts apply, so an opt's axis is the position among the others): `upcasts` by range id, then a
  THREAD split of the first range (the KV heads) into as many slices as divide it, up to the launcher's slices."""
  kept = [rid for rid, n in axes if n != 1]
  # last axis first: a range upcast whole leaves the list, which would move the ones after it
  opts = [Opt(OptOps.UPCAST, kept.index(rid), amount) for rid, amount in sorted(upcasts.items(), reverse=True)
          if amount > 1 and rid in kept]
  opts += unrolls
  kv_id, kv = axes[0]
  if threads > 1 and kv > 1:
    th = largest_divisor(kv, min(threads * SLICES_PER_THREAD, NUM_CPU_THREADS.value))
    if th > 1:
      opts.append(Opt(OptOps.THREAD, kept.index(kv_id), th))
  return tuple(opts)


def _scores_kernel(p: LlamaParams, T: int, g: int, threads: int, slot: UOp | int, sp: UOp | int, L: UOp | int, swa: bool,
                   ring_row: int | None, out: UOp, q: UOp, cache_k: UOp, *mask: UOp) -> UOp:
  kv, gi, t, key_at = UOp.range(p.n_kv_heads, 0), UOp.range(g, 1), UOp.range(T, 2), UOp.range(L, 3)
  d = UOp.range(p.head_dim, 4, AxisType.REDUCE)
  key = cache_k[slot, kv, key_at, d].load().cast(dtypes.float)
  s = (q[t, (kv * g + gi) * p.head_dim + d].load() * key).reduce(d, arg=Ops.ADD) * (p.attn_scale or 1.0 / math.sqrt(p.head_dim))
  if p.attn_softcap:
    s = (s * (1.0 / p.attn_softcap)).tanh() * p.attn_softcap
  if ring_row is not None:  # the ring's places: its mask rows say which each query sees
    s = s + mask[0][ring_row + t, key_at].load()
  else:
    if T > 1:  # causality: row t is position sp + t
      s = (key_at <= sp + t).where(s, NEG_INF)
    if swa:
      s = (sp + t - key_at < p.swa_window).where(s, NEG_INF)
  opts = _opts([(0, p.n_kv_heads), (1, g), (2, T), (3, 0)], {1: largest_divisor(g, GROUP_UPCAST), 2: 4 if T % 4 == 0 else 1},
               (Opt(OptOps.UNROLL, 0, 4),), threads)
  return out[kv, gi, t, key_at].store(s).end(kv, gi, t, key_at).sink(arg=KernelInfo(name=f"attn_scores_{T}", opts_to_apply=opts))


def _weights_kernel(rows: int, threads: int, L: UOp | int, out: UOp, s: UOp, m: UOp) -> UOp:
  """exp(S - m) over the scores' rows (every query row of every head, as one axis: the kernel's only split)."""
  r, key_at = UOp.range(rows, 0), UOp.range(L, 1)
  w = (s[r, key_at].load() - m[r].load()).exp()
  opts = _opts([(0, rows), (1, 0)], {}, (), threads)
  return out[r, key_at].store(w).end(r, key_at).sink(arg=KernelInfo(name="attn_weights", opts_to_apply=opts))


def _values_kernel(p: LlamaParams, T: int, g: int, threads: int, slot: UOp | int, L: UOp | int, out: UOp, w: UOp, z: UOp,
                   cache_v: UOp) -> UOp:
  kv, gi, t, d = UOp.range(p.n_kv_heads, 0), UOp.range(g, 1), UOp.range(T, 2), UOp.range(p.head_dim, 3)
  key_at = UOp.range(L, 4, AxisType.REDUCE)
  acc = (w[kv, gi, t, key_at].load() * cache_v[slot, kv, key_at, d].load().cast(dtypes.float)).reduce(key_at, arg=Ops.ADD)
  cols = largest_divisor(p.head_dim, VALUE_COLUMNS)
  opts = _opts([(0, p.n_kv_heads), (1, g), (2, T), (3, p.head_dim)], {3: cols, 1: largest_divisor(g, max(1, 48 // cols))}, (), threads)
  return out[t, (kv * g + gi) * p.head_dim + d].store(acc / z[kv, gi, t].load()).end(kv, gi, t, d) \
    .sink(arg=KernelInfo(name=f"attn_values_{T}", opts_to_apply=opts))


def attention(p: LlamaParams, q: Tensor, cache_k: Tensor, cache_v: Tensor, slot: UOp | int, sp: UOp | int, threads: int,
              swa: bool = False, seen: UOp | int | None = None, mask: Tensor | None = None, mask_row: int = 0) -> Tensor:
  """Rows q [T, n_heads * head_dim] (positions sp..sp+T-1) against `slot`'s KV cache ([caches, KV, length,
  head_dim]): [T, n_heads * head_dim]. Its places up to sp + T are read, keys further back than p.swa_window not seen
  with `swa`; a sliding-window ring's (`seen`, `mask`): its first `seen` places, with rows mask_row.. of `mask` added
  to the scores instead of causality and the window."""
  T, g, length = q.shape[0], p.n_heads // p.n_kv_heads, cache_k.shape[2]
  L, kL = (sp + T, _param(sp) + T) if seen is None else (seen, _param(seen))
  srcs = [q.contiguous(), cache_k] + ([mask] if mask is not None else [])
  scores = Tensor.empty(p.n_kv_heads, g, T, length, dtype=dtypes.float32, device=q.device).custom_kernel(
    *srcs, fxn=functools.partial(_scores_kernel, p, T, g, threads, _param(slot), _param(sp), kL, swa,
                                 mask_row if mask is not None else None))[0]
  rows = p.n_heads * T
  m = scores[:, :, :, 0:L].max(-1)
  w = Tensor.empty(rows, length, dtype=dtypes.float32, device=q.device).custom_kernel(
    scores.reshape(rows, length), m.reshape(rows), fxn=functools.partial(_weights_kernel, rows, threads, kL))[0]
  w = w.reshape(*scores.shape)
  z = w[:, :, :, 0:L].sum(-1)
  return Tensor.empty(T, p.n_heads * p.head_dim, dtype=dtypes.float32, device=q.device).custom_kernel(
    w, z, cache_v, fxn=functools.partial(_values_kernel, p, T, g, threads, _param(slot), kL))[0]
