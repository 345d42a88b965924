"""Llama-family forward (llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3) for one contiguous layer range, in tinygrad (spec §10, §16).

One copy of the stage's weights serves `slots` runs at once, each with its own KV cache slot
(docs/runs-in-flight.md). step(rows, start_pos, slot=s) runs one run's rows at positions start_pos.. through the
layers; step_batch(rows) runs one decode row of each of several runs as one batched pass:
  first stage in: int32 token ids [T]; other stages in: float32 activations [T, dim]
  last stage out: int32 [1], the token sampled from the last row; other stages out: float32 [T, dim]
A graph runs a *shape*: the rows of each segment it holds, one segment per run ((1,) a decode row, (chunk,) a prefill
chunk, zero padded, (1, 1, 1, 1) four runs' decode rows). Each segment's slot and start position are bound Variables,
so one TinyJit graph per shape serves every slot and position; the KV caches are preallocated to max_seq_len (+ one
chunk of padding room), weights never change.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from tinygrad import Context, Device, Tensor, TinyJit, UOp, dtypes
from tinygrad.device import Buffer
from tinygrad.engine.jit import CapturedJit
from tinygrad.helpers import NUM_CPU_THREADS

from swactor.common.events import get_logger
from swactor.common.objflags import NO_TOKEN  # the last stage's output for a prompt chunk it does not sample
from swactor.common.sampling import SamplingPolicy
from swactor.modelfile.memory import KV_DTYPE_BYTES, uses_ring

from . import cpu_attention
from .cpu_matvec import SLICES_PER_THREAD
from .gguf_weights import GGUFModel, LlamaParams, LoadProgress, RawTensor, load_stage
from .graphcache import GraphCache
from .linear import (
  N_TENSORS,
  PACKED,
  Weight,
  apply,
  apply_experts,
  copy_in,
  device_empty,
  to_device,
  upload,
  upload_experts,
)
from .quant import dequantize
from .replay import LoadedGraph, Plan, plan, plan_graph, read
from .rope import rope, rope_tables, stage_divisors
from .sampling import Sampler
from .swa_ring import SwaRing


@dataclass(frozen=True)
class StageTimings:
  load_s: float      # GGUF parse + read/dequantize of the range
  upload_s: float    # host -> device copies




@dataclass(frozen=True)
class CompileReport:
  graphs: int        # graphs a step runs (layer graphs per width and parity, the head per width)
  cached: int        # of those, loaded from the graph cache
  seconds: float


@dataclass(frozen=True)
class StageMemory:
  file_bytes: int    # the GGUF's bytes of the stage's device tensors (a first stage's embedding stays on the host)
  device_bytes: int  # the device's bytes of the stage's weights (norms, matrices, head; not the KV cache)
  cache_bytes: int   # the KV caches of every slot (and the padding rows' scratch slot)
  slot_bytes: int    # the KV cache of one slot: what one more run in flight costs


Shape = tuple[int, ...]  # rows per segment of a graph, one segment per run
LayerKey = tuple[Shape, tuple[tuple[str, ...], ...], int, bool]  # a layer graph's: shape, matrix kinds, parity, sliding window
# The KV cache's storage types: float16 halves what a run slot costs (docs/runs-in-flight.md "KV in float16")
KV_DTYPES: dict[str, type] = {name: np.dtype(name).type for name in KV_DTYPE_BYTES}  # the planner counts them


@dataclass(frozen=True)
class BatchRow:
  """One decode row of one run in a batched step: its slot, its position, its input (a token id [1] on the first stage,
  an activation row [1, dim] on the others) and, on the last stage, whether to sample a token from it."""
  slot: int
  start_pos: int
  inputs: np.ndarray
  sample: bool = True


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor: return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * w


def fuse_rows(ws: list[np.ndarray | RawTensor], name: str) -> list[np.ndarray | RawTensor]:
  """Stack matrices that read the same input into [sum(out), in] matrices (one kernel instead of several): each run
  of neighbours of one type becomes one (a Q4_K_M file has Q4_K q/k and a Q6_K v); rows of a block-quantized matrix
  are independent, so raw blocks stack as they are."""
  kind = lambda w: w.qtype if isinstance(w, RawTensor) else None  # noqa: E731
  runs: list[list[np.ndarray | RawTensor]] = []
  for w in ws:
    if runs and kind(runs[-1][-1]) == kind(w):
      runs[-1].append(w)
    else:
      runs.append([w])
  def fuse(run: list[np.ndarray | RawTensor]) -> np.ndarray | RawTensor:
    if len(run) == 1:
      return run[0]
    raws = [w for w in run if isinstance(w, RawTensor)]
    if len(raws) == len(run):
      return RawTensor(name, raws[0].qtype, (sum(w.shape[0] for w in raws), raws[0].shape[1]), np.concatenate([w.data for w in raws]))
    return np.concatenate(run)
  return [fuse(r) for r in runs]


def fuse_experts(gate: np.ndarray | RawTensor, up: np.ndarray | RawTensor) -> list[np.ndarray | RawTensor]:
  """Each expert's gate and up matrices as one [n, 2 * ffn, dim] stack (expert e: its gate rows, then its up rows), so
  a routed row runs one expert matvec for both and reads its input once (as fuse_rows does for a dense FFN). Of two
  types (a Q4_K gate beside a Q4_1 up) they stay apart."""
  if isinstance(gate, RawTensor) and isinstance(up, RawTensor) and gate.qtype == up.qtype:
    n, ffn, dim = gate.shape
    data = np.concatenate([gate.data.reshape(n, ffn, -1), up.data.reshape(n, ffn, -1)], axis=1)
    return [RawTensor("ffn_gate_up_exps", gate.qtype, (n, 2 * ffn, dim), data.reshape(n * 2 * ffn, -1))]
  if not isinstance(gate, RawTensor) and not isinstance(up, RawTensor):
    return [np.concatenate([gate, up], axis=1)]
  return [gate, up]


class Layer:
  """One block's device tensors as a flat list (the jitted layer graph takes them as inputs) plus the matrix kinds of
  its four products, each one or more fused matrices: [attn_norm, ffn_norm, cache_k, cache_v, (qkv_bias if
  p.qkv_bias), (q_norm, k_norm if p.qk_norm), (post_attention_norm, post_ffw_norm if p.post_norms), *qkv,
  *attn_output, *gate_up, *ffn_down]. A Mixture-of-Experts block (p.moe) has qkv, attn_output, the router, then
  every expert's matrices stacked (upload_experts): gate and up fused per expert where they share a type
  (fuse_experts), then down. `swa`: its attention sees the last
  p.swa_window positions only; `ring`: its KV cache is a ring of cache_len places (swa_ring.py)."""
  def __init__(self, w: dict[str, np.ndarray | RawTensor], p: LlamaParams, caches: int, cache_len: int, device: str,
               words: bool, kv_dtype: type = np.float32, swa: bool = False, ring: bool = False):
    self.swa, self.ring = swa, ring
    groups = [fuse_rows([w["attn_q"], w["attn_k"], w["attn_v"]], "attn_qkv"), [w["attn_output"]]]
    groups += [[w["ffn_gate_inp"]]] if p.moe else [fuse_rows([w["ffn_gate"], w["ffn_up"]], "ffn_gate_up"), [w["ffn_down"]]]
    mats = [[upload(m, device, words) for m in g] for g in groups]
    if p.moe:
      experts = [*fuse_experts(w["ffn_gate_exps"], w["ffn_up_exps"]), w["ffn_down_exps"]]
      mats += [[upload_experts(m, device, words)] for m in experts]
    self.kinds = tuple(tuple(k for k, _ in g) for g in mats)
    norms = [to_device(np.asarray(w[k], np.float32), device) for k in ("attn_norm", "ffn_norm")]
    # never read before a run wrote it (attention reads a slot's positions up to the step's own): left unwritten; a
    # ring's every place is read (masked), so it starts as zeros: a masked place's value must be finite (0 x NaN is NaN)
    shape = (caches, p.n_kv_heads, cache_len, p.head_dim)
    cache = [to_device(np.zeros(shape, kv_dtype), device) if ring else device_empty(shape, kv_dtype, device) for _ in range(2)]
    bias = [to_device(np.concatenate([np.asarray(w[f"{k}_bias"], np.float32) for k in ("attn_q", "attn_k", "attn_v")]), device)] \
      if p.qkv_bias else []
    qk_norm = [to_device(np.asarray(w[k], np.float32).reshape(p.head_dim), device) for k in ("attn_q_norm", "attn_k_norm")] \
      if p.qk_norm else []
    post = [to_device(np.asarray(w[k], np.float32), device) for k in ("post_attention_norm", "post_ffw_norm")] \
      if p.post_norms else []
    self.tensors: list[Tensor] = norms + cache + bias + qk_norm + post + [t for g in mats for _, ts in g for t in ts]
    self.weight_bytes = sum(t.nbytes() for t in self.tensors) - sum(t.nbytes() for t in cache)
    self.slot_bytes = sum(t.nbytes() for t in cache) // caches

  @property
  def bufs(self) -> list[UOp]: return [t.uop.base for t in self.tensors]


Segment = tuple[UOp | int, UOp | int, int]  # (slot, start position, rows) of one run in a step


@dataclass(frozen=True)
class RingStep:
  """A step's view of the sliding-window rings (swa_ring.py): each segment's write place, the places its rows read
  (SwaRing.seen), and the mask whose rows are the step's rows against their slot's every place."""
  at: list[UOp | int]
  seen: list[UOp | int]
  mask: Tensor  # [rows, ring length]: 0 / -inf


def layer_forward(p: LlamaParams, kinds: tuple[tuple[str, ...], ...], x: Tensor, segments: list[Segment], cos: Tensor,
                  sin: Tensor, ts: list[Tensor], threads: int = 0, swa: bool = False, ring: RingStep | None = None) -> Tensor:
  """One block over the rows of every segment: the matrix products see all rows at once (one read of the weights for
  the batch), attention each segment alone, against its own slot of the KV cache (with `swa`, its last p.swa_window
  positions only: the cache keeps every position, the older ones are masked; with `ring`, the cache is a ring of the
  window's places, its first ring.seen read, masked by the ring's rows). On the CPU (threads > 0) the attention is
  cpu_attention's kernels."""
  W, nq, nkv = x.shape[0], p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim
  attn_norm, ffn_norm, cache_k, cache_v, it = ts[0], ts[1], ts[2], ts[3], iter(ts[4:])
  bias = next(it) if p.qkv_bias else None
  q_norm, k_norm = (next(it), next(it)) if p.qk_norm else (None, None)
  post_attn, post_ffn = (next(it), next(it)) if p.post_norms else (None, None)
  def product(group: tuple[str, ...]) -> Callable[[Tensor], Tensor]:
    fs = [functools.partial(apply, kind, [next(it) for _ in range(N_TENSORS[kind])], threads=threads) for kind in group]
    return fs[0] if len(fs) == 1 else lambda h: Tensor.cat(*(f(h) for f in fs), dim=-1)
  qkv_, o_, ffn_ = product(kinds[0]), product(kinds[1]), product(kinds[2])
  down_ = None if p.moe else product(kinds[3])
  experts = [(kind, [next(it) for _ in range(N_TENSORS[kind])]) for (kind,) in kinds[3:]] if p.moe else []
  qkv = qkv_(rms_norm(x, attn_norm, p.norm_eps))
  if bias is not None:
    qkv = qkv + bias
  q, k = qkv[:, :nq].reshape(W, p.n_heads, p.head_dim), qkv[:, nq:nq + nkv].reshape(W, p.n_kv_heads, p.head_dim)
  if q_norm is not None and k_norm is not None:  # qwen3: each head's vector RMS-normed by the [head_dim] weights
    q, k = rms_norm(q, q_norm, p.norm_eps), rms_norm(k, k_norm, p.norm_eps)
  q, k = (rope(t, cos, sin, p.rope_dim, p.rope_neox) for t in (q, k))
  v = qkv[:, nq + nkv:].reshape(W, p.n_kv_heads, p.head_dim)
  g, outs, r0 = p.n_heads // p.n_kv_heads, [], 0
  for n, (slot, sp, T) in enumerate(segments):
    at = sp if ring is None else ring.at[n]
    cache_k[slot:slot + 1, :, at:at + T, :].assign(k[r0:r0 + T].transpose(0, 1).unsqueeze(0).cast(cache_k.dtype))
    cache_v[slot:slot + 1, :, at:at + T, :].assign(v[r0:r0 + T].transpose(0, 1).unsqueeze(0).cast(cache_v.dtype))
    # [KV, L, hd]; a float16 cache is read back as float32: only the storage is halved, the arithmetic is not
    if threads > 0:  # the CPU's hand-scheduled kernels (cpu_attention.py)
      outs.append(cpu_attention.attention(p, q[r0:r0 + T].reshape(T, nq), cache_k, cache_v, slot, sp, threads, swa=swa,
                                          seen=None if ring is None else ring.seen[n],
                                          mask=None if ring is None else ring.mask, mask_row=r0))
      r0 += T
      continue
    L = sp + T if ring is None else ring.seen[n]
    keys, vals = (c[slot, :, 0:L, :].cast(x.dtype) for c in (cache_k, cache_v))
    qg = q[r0:r0 + T].reshape(T, p.n_kv_heads, g, p.head_dim).permute(1, 2, 0, 3)  # [KV, g, T, hd]
    # [KV, g, T, L]; as a product + sum, not qg @ keys.T: on the symbolic-length slice the matmul compiles to divisions
    # and modulos in the inner loop (3x slower)
    s = (qg.unsqueeze(3) * keys.reshape(p.n_kv_heads, 1, 1, -1, p.head_dim)).sum(-1) * (p.attn_scale or 1.0 / math.sqrt(p.head_dim))
    if p.attn_softcap:
      s = (s * (1.0 / p.attn_softcap)).tanh() * p.attn_softcap
    if ring is not None:  # the window and causality as the ring's places hold them
      s = s + ring.mask[r0:r0 + T, 0:L]
    else:
      if T > 1:
        s = s + Tensor.full((T, sp + T), float("-inf"), device=x.device).triu(sp + 1)
      if swa:  # row i is position sp + i: key j is out of its window when sp + i - j >= swa_window
        s = s + Tensor.full((T, sp + T), float("-inf"), device=x.device).tril(sp - p.swa_window)
    # contiguous: else the concatenation below fuses every segment's attention into one kernel whose each output row
    # runs every segment's reduction (8 segments: 8x the attention work)
    outs.append((s.softmax(-1) @ vals.unsqueeze(1)).permute(2, 0, 1, 3).reshape(T, p.n_heads * p.head_dim).contiguous())
    r0 += T
  a = outs[0] if len(outs) == 1 else Tensor.cat(*outs, dim=0)
  x = x + (o_(a) if post_attn is None else rms_norm(o_(a), post_attn, p.norm_eps))
  h = rms_norm(x, ffn_norm, p.norm_eps)
  if down_ is None:
    f = moe_ffn(p, h, ffn_(h), experts, threads)
  else:
    gu = ffn_(h)
    gate = gu[:, :p.ffn_dim].gelu() if p.gelu else gu[:, :p.ffn_dim].silu()
    act = (gate * gu[:, p.ffn_dim:]).contiguous()  # else the activation is recomputed inside the down matvec
    f = down_(act)
  return (x + (f if post_ffn is None else rms_norm(f, post_ffn, p.norm_eps))).contiguous()


def route(p: LlamaParams, logits: Tensor) -> tuple[Tensor, Tensor]:
  """The router's choice per row, as llama.cpp's build_moe_ffn makes it for qwen3moe and Mixtral: softmax over every
  expert's logit, the p.n_experts_used most probable (ties: the lower id), their probabilities renormalised to sum 1
  unless p.expert_weights_norm is false. Returns (ids int32 [rows, k], weights [rows, k]). The top k by k argmax
  passes over the logits (softmax keeps their order): k is small (2-8) and each pass one short reduce over the
  experts, no sort. Renormalised, the chosen probabilities are the softmax of the chosen logits alone, so the softmax
  over every expert is computed only when they are not (fewer small kernels a block: the step's launches)."""
  arange = Tensor.arange(p.n_experts).reshape(1, -1)
  ids, chosen, rest = [], [], logits
  for _ in range(p.n_experts_used):
    i = rest.argmax(-1, keepdim=True)
    ids.append(i)
    taken = arange == i
    chosen.append(taken.where(logits, 0.0).sum(-1, keepdim=True))
    rest = taken.where(-math.inf, rest)  # a taken expert is never the max again
  top = Tensor.cat(*chosen, dim=1) if len(chosen) > 1 else chosen[0]
  if p.expert_weights_norm:
    w = top.softmax(-1)
  else:
    peak = logits.max(-1, keepdim=True)
    w = (top - peak).exp() / (logits - peak).exp().sum(-1, keepdim=True)
  return (Tensor.cat(*ids, dim=1) if len(ids) > 1 else ids[0]).cast(dtypes.int32), w


def moe_ffn(p: LlamaParams, h: Tensor, logits: Tensor, experts: list[tuple[str, list[Tensor]]], threads: int) -> Tensor:
  """A Mixture-of-Experts FFN over rows h [W, dim]: each row through the k experts it routes to (SwiGLU, as llama's
  FFN), their outputs summed by the routing weights. Only those experts' rows are read (linear.apply_experts): a
  decode row reads k experts' matrices of the block's n_experts."""
  W, k = h.shape[0], p.n_experts_used
  ids, w = route(p, logits)
  flat = ids.reshape(W * k).contiguous()  # the experts' kernels load their ids from a buffer
  *gate_up, (dk, dts) = experts
  if len(gate_up) == 1:  # fused per expert (fuse_experts)
    ((guk, guts),) = gate_up
    gu = apply_experts(guk, guts, h, flat, 2 * p.ffn_dim, k, threads)
    gate, up = gu[:, :p.ffn_dim], gu[:, p.ffn_dim:]
  else:
    (gk, gts), (uk, uts) = gate_up
    gate = apply_experts(gk, gts, h, flat, p.ffn_dim, k, threads)
    up = apply_experts(uk, uts, h, flat, p.ffn_dim, k, threads)
  act = ((gate.gelu() if p.gelu else gate.silu()) * up).contiguous()
  down = apply_experts(dk, dts, act, flat, p.dim, 1, threads)  # [W * k, dim]
  return (down.reshape(W, k, p.dim) * w.unsqueeze(-1)).sum(1)


def batch_widths(slots: int) -> tuple[int, ...]:
  """Rows of the batched decode graphs a stage of `slots` runs in flight compiles: powers of two up to the first that
  holds every slot (a batch of 3 runs pads to 4 with scratch rows)."""
  widths, b = [1], 1
  while b < slots:
    b *= 2
    widths.append(b)
  return tuple(widths)


class StageModel:
  """Compute for layers [layer_start, layer_end) of a llama-family GGUF; weights stay loaded across runs (reset()), and
  `slots` runs may be in flight at once, each in its own KV cache slot."""

  def __init__(self, gguf: str | os.PathLike[str] | GGUFModel, layer_start: int, layer_end: int, *, max_seq_len: int = 2048,
               device: str | None = None, sampling: SamplingPolicy | None = None, prefill_chunk: int = 1,
               quantized: bool = True, beam: int = 0, threads: int | None = None, on_progress: Callable[[LoadProgress], None] | None = None,
               graph_cache: GraphCache | None = None, slots: int = 1, kv_dtype: str = "float32", swa_ring: bool = True):
    t0 = time.perf_counter()
    m = gguf if isinstance(gguf, GGUFModel) else GGUFModel(gguf)
    p = self.params = m.params
    if max_seq_len > p.context_length:
      raise ValueError(f"max_seq_len {max_seq_len} exceeds the model's context_length {p.context_length}")
    if max_seq_len < 1 or prefill_chunk < 1:
      raise ValueError(f"max_seq_len and prefill_chunk must be >= 1, got {max_seq_len}, {prefill_chunk}")
    if slots < 1:
      raise ValueError(f"slots must be >= 1, got {slots}")
    if kv_dtype not in KV_DTYPES:
      raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPES)}, got {kv_dtype!r}")
    self.kv_dtype = kv_dtype
    keep = frozenset(PACKED) if quantized else frozenset()
    w = load_stage(m, layer_start, layer_end, keep=keep, on_progress=on_progress)
    t1 = time.perf_counter()
    self.device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    self.layer_start, self.layer_end, self.max_seq_len, self.chunk = layer_start, layer_end, max_seq_len, prefill_chunk
    self.is_first, self.is_last, self.beam = w.is_first, w.is_last, beam  # beam: tinygrad kernel search width at capture
    # the padding rows of a batch narrower than its graph write one scratch slot no run owns
    self.slots, self.batch_widths = slots, batch_widths(slots)
    pads = any(next(b for b in self.batch_widths if b >= n) > n for n in range(1, slots + 1))
    self.scratch = slots if pads else None
    caches = slots + (self.scratch is not None)
    # CPU cores a matvec's slices run on (None: the cores this process may use, at most 8); tinygrad's own runtime runs
    # them one after another, replay.Plan splits them over native threads
    self.threads = min(len(os.sched_getaffinity(0)), 8) if threads is None else threads
    if self.threads < 1:
      raise ValueError(f"threads must be >= 1, got {threads}")
    self.mv_threads = self.threads if self.device.split(":")[0] == "CPU" else 0  # > 0: hand-scheduled CPU matvec (linear.py)
    swa = [bool(p.swa_layers) and p.swa_layers[layer_start + j] for j in range(len(w.layers))]
    # the sliding-window blocks' KV as a ring of their window (swa_ring.py), where that is shorter than the context
    # (swa_ring=False: every position kept and the older ones masked, what bench/sliding_window.py compares with)
    self.ring = SwaRing(p.swa_window, prefill_chunk, caches, max_seq_len) \
      if swa_ring and any(swa) and uses_ring(p.swa_window, prefill_chunk, max_seq_len) else None
    self.layers = [Layer(L, p, caches, self.ring.length if s and self.ring else max_seq_len + prefill_chunk, self.device,
                         self.mv_threads > 0, KV_DTYPES[kv_dtype], swa=s, ring=s and self.ring is not None)
                   for L, s in zip(w.layers, swa, strict=True)]
    self._masks: dict[Shape, Tensor] = {}  # per shape: the ring's mask rows of a step (RingStep.mask)
    self.embd = w.token_embd  # host side: only the rows of the step's tokens are ever dequantized
    self.head: tuple[Tensor, Weight] | None = None
    if w.output is not None and w.output_norm is not None:
      self.head = (to_device(np.asarray(w.output_norm, np.float32), self.device), upload(w.output, self.device, self.mv_threads > 0))
    head_bytes = sum(t.nbytes() for t in [self.head[0], *self.head[1][1]]) if self.head else 0
    slot_bytes = sum(L.slot_bytes for L in self.layers)
    self.memory = StageMemory(w.device_file_bytes, sum(L.weight_bytes for L in self.layers) + head_bytes,
                              caches * slot_bytes, slot_bytes)
    if w.expanded:  # types kept as float32 on the device: say what that costs
      get_logger().info("compute_weights_expanded", tensors=len(w.expanded), types=sorted({e.qtype.name for e in w.expanded}),
                        file_bytes=sum(e.file_bytes for e in w.expanded), float32_bytes=sum(e.float32_bytes for e in w.expanded),
                        layer_start=layer_start, layer_end=layer_end)
    divisors = stage_divisors(p, w, max_seq_len)  # LongRoPE: the set for this stage's context, decided once
    cos, sin = rope_tables(p, divisors, max_seq_len + prefill_chunk)
    self.cos, self.sin = (to_device(t.astype(np.float32)[:, None, :], self.device) for t in (cos, sin))
    # the sliding-window layers' rotation: their own base and scaling (gemma3's 10000, unscaled), else the same tables
    self.cos_swa, self.sin_swa = self.cos, self.sin
    swa_rope = replace(p, rope_base=p.rope_base_swa, rope_scaling=p.rope_scaling_swa)
    if any(L.swa for L in self.layers) and (swa_rope.rope_base, swa_rope.rope_scaling) != (p.rope_base, p.rope_scaling):
      cos, sin = rope_tables(swa_rope, divisors, max_seq_len + prefill_chunk)
      self.cos_swa, self.sin_swa = (to_device(t.astype(np.float32)[:, None, :], self.device) for t in (cos, sin))
    # one jitted graph per (shape, matrix kinds, parity, sliding window): it is replayed over every layer's tensors;
    # alternating two graphs keeps a layer's input buffer distinct from the output buffer it writes
    self._layer_jits: dict[LayerKey, TinyJit] = {}
    self._head_jits: dict[Shape, TinyJit] = {}
    self._inputs: dict[Shape, Tensor] = {}
    self._plans: dict[Shape, Plan | None] = {}       # per shape: the layers' kernels as a direct-replay plan (None: can't)
    self._head_plans: dict[Shape, Plan | None] = {}
    self.graph_cache = graph_cache
    self.timings = StageTimings(t1 - t0, time.perf_counter() - t1)
    policy = sampling or SamplingPolicy()
    self.next_pos = [0] * slots
    self.samplers = [Sampler(policy) for _ in range(slots)]
    # The last step's time in the stage's blocks when it was one run's one row (a decode step), else None: the host's
    # speed without what every step costs whatever its blocks (the embedding lookup, the head, copies, the control
    # path), so stages of 1 and 10 blocks on one kind of host measure the same time per block (worker/step_speed.py).
    self.last_layers_s: float | None = None

  @property
  def hidden_dim(self) -> int: return self.params.dim

  def reset(self, sampling: SamplingPolicy | None = None, slot: int = 0) -> None:
    """Start a new run in `slot` with the loaded weights: its positions restart at 0, its sampler is re-seeded."""
    self._slot(slot)
    self.next_pos[slot] = 0
    if self.ring is not None:
      self.ring.clear(slot)
    self.samplers[slot] = Sampler(sampling if sampling is not None else self.samplers[slot].policy)

  def _slot(self, slot: int) -> int:
    if not 0 <= slot < self.slots:
      raise ValueError(f"slot {slot} is not one of this stage's {self.slots} slot(s)")
    return slot

  def _capture_context(self) -> Context:
    """Compile settings of a first (capturing) call: BEAM, and room for the matvecs' core_id slices (linear.py)."""
    return Context(BEAM=self.beam, NUM_CPU_THREADS=max(NUM_CPU_THREADS.value, self.threads * SLICES_PER_THREAD))

  # ---- graphs ----

  def _variables(self, shape: Shape) -> dict[str, UOp]:
    """Each segment's slot and start position (and with a ring, its place there) as Variables, by the names replays
    bind."""
    top = self.slots if self.scratch is not None else self.slots - 1
    out = {}
    for i in range(len(shape)):
      out |= {f"slot{i}": UOp.variable(f"slot{i}", 0, top), f"sp{i}": UOp.variable(f"sp{i}", 0, self.max_seq_len)}
      if self.ring is not None:
        out[f"at{i}"] = UOp.variable(f"at{i}", 0, self.ring.dump)
        out[f"seen{i}"] = UOp.variable(f"seen{i}", 1, self.ring.length)
    return out

  def _var_vals(self, shape: Shape, segments: list[tuple[int, int]], real: list[int] | None) -> dict[str, int]:
    """The step's values of _variables; with a ring, each segment's rows placed there and the mask rows written."""
    out = {k: v for i, (slot, sp) in enumerate(segments) for k, v in ((f"slot{i}", slot), (f"sp{i}", sp))}
    if self.ring is not None:
      masks = []
      for i, ((slot, sp), width) in enumerate(zip(segments, shape, strict=True)):
        out[f"at{i}"] = self.ring.place(slot, sp, width if real is None else real[i], width)
        out[f"seen{i}"] = self.ring.seen(sp, width)
        masks.append(self.ring.mask(slot, sp, width))
      copy_in(self._mask(shape), np.concatenate(masks))
    return out

  def _mask(self, shape: Shape) -> Tensor:
    """The ring's mask rows of a step of `shape`: one fixed buffer per shape, read by its sliding layers' graphs."""
    assert self.ring is not None
    if shape not in self._masks:
      self._masks[shape] = to_device(np.zeros((sum(shape), self.ring.length), np.float32), self.device)
    return self._masks[shape]

  def _layer_key(self, shape: Shape, i: int) -> LayerKey:
    L = self.layers[i]
    return (shape, L.kinds, i % 2, L.swa)

  def _layer_keys(self, shape: Shape) -> list[LayerKey]:
    return [self._layer_key(shape, i) for i in range(len(self.layers))]

  def _rope(self, swa: bool) -> tuple[Tensor, Tensor]:
    return (self.cos_swa, self.sin_swa) if swa else (self.cos, self.sin)

  def _layer_jit(self, key: LayerKey) -> TinyJit:
    shape, kinds, _, swa = key
    if key not in self._layer_jits:
      def f(x: Tensor, ts: list[Tensor], **bound: UOp) -> Tensor:
        segs = [(bound[f"slot{i}"], bound[f"sp{i}"], T) for i, T in enumerate(shape)]
        table_cos, table_sin = self._rope(swa)
        cos = [table_cos[sp:sp + T] for _, sp, T in segs]
        sin = [table_sin[sp:sp + T] for _, sp, T in segs]
        cat = lambda parts: parts[0] if len(parts) == 1 else Tensor.cat(*parts, dim=0)  # noqa: E731
        ring = RingStep([bound[f"at{i}"] for i in range(len(shape))], [bound[f"seen{i}"] for i in range(len(shape))],
                        self._mask(shape)) \
          if swa and self.ring is not None else None
        return layer_forward(self.params, kinds, x, segs, cat(cos), cat(sin), ts, self.mv_threads, swa, ring)
      self._layer_jits[key] = TinyJit(f)
    return self._layer_jits[key]

  def _head_jit(self, shape: Shape) -> TinyJit:
    """One segment: the logits of its row `row` (a prefill chunk's last); a batch: the logits of every row."""
    if shape not in self._head_jits:
      assert self.head is not None
      norm, (kind, ts) = self.head
      cap = self.params.final_softcap
      capped = (lambda y: (y * (1.0 / cap)).tanh() * cap) if cap else (lambda y: y)
      if len(shape) == 1:
        fn = lambda x, row: capped(apply(kind, ts, rms_norm(x[row:row + 1], norm, self.params.norm_eps), self.mv_threads)).reshape(-1)  # noqa: E731
      else:
        fn = lambda x: capped(apply(kind, ts, rms_norm(x, norm, self.params.norm_eps), self.mv_threads))  # noqa: E731
      self._head_jits[shape] = TinyJit(fn)
    return self._head_jits[shape]

  def _embed(self, ids: np.ndarray) -> np.ndarray:
    assert self.embd is not None
    rows = dequantize(self.embd.data[ids], self.embd.qtype, self.params.dim, self.embd.name)
    return rows if self.params.embed_scale == 1.0 else rows * np.float32(self.params.embed_scale)

  def _check(self, inputs: np.ndarray, start_pos: int, slot: int, rows: int | None = None) -> np.ndarray:
    x = np.asarray(inputs)
    if self.is_first:
      if x.ndim != 1 or x.dtype.kind not in "iu":
        raise ValueError(f"first stage takes int token ids [T], got {x.dtype} {x.shape}")
      if x.size and (x.min() < 0 or x.max() >= self.params.vocab_size):
        raise ValueError(f"token id out of range [0, {self.params.vocab_size})")
    elif x.ndim != 2 or x.shape[1] != self.params.dim or x.dtype != np.float32:
      raise ValueError(f"stage takes float32 activations [T, {self.params.dim}], got {x.dtype} {x.shape}")
    if x.shape[0] < 1:
      raise ValueError("step needs at least one row")
    if rows is not None and x.shape[0] != rows:
      raise ValueError(f"a batched step takes {rows} row per run, slot {slot} has {x.shape[0]}")
    if start_pos != self.next_pos[self._slot(slot)]:
      raise ValueError(f"start_pos {start_pos} != expected {self.next_pos[slot]} in slot {slot} (call reset() for a new run)")
    if start_pos + x.shape[0] > self.max_seq_len:
      raise ValueError(f"positions up to {start_pos + x.shape[0]} exceed max_seq_len {self.max_seq_len}")
    return x

  def _rows(self, rows: np.ndarray, shape: Shape, segments: list[tuple[int, int]],
            tick: Callable[[], None] | None = None, marks: list[float] | None = None, real: list[int] | None = None) -> Tensor:
    """Run rows (already padded to the shape's width) through the layers, segment i in slot/position segments[i]
    (`real`: how many of its rows are a run's, the rest padding; None: all); returns the last layer's output on
    device. `tick` is called after each call of a graph still being captured (prepare's progress). `marks` (a
    one-row step being timed): TinyJit runs the graphs asynchronously, so the device is waited for after the layers,
    and `marks` gets the clock once the first of several has run (_blocks_seconds' start of the others); the
    launcher's plan has run them when it returns."""
    if shape not in self._inputs:  # one fixed input buffer per shape, so a replay plan can bake in its address
      self._inputs[shape] = to_device(np.zeros((sum(shape), self.params.dim), np.float32), self.device)
    xin = copy_in(self._inputs[shape], rows.astype(np.float32, copy=False))
    var_vals = self._var_vals(shape, segments, real)
    if shape not in self._plans:
      self._plan_layers(shape)
    if (p := self._plans.get(shape)) is not None:
      p(var_vals)
      return p.out
    x = xin
    bound = {name: v.bind(var_vals[name]) for name, v in self._variables(shape).items()}
    for i, L in enumerate(self.layers):
      jit = self._layer_jit(self._layer_key(shape, i))
      if jit.captured is None:
        with self._capture_context():
          x = jit(x, L.tensors, **bound)
        if tick is not None:
          tick()
      else:  # replay directly: the layer's weight/cache buffers are fixed, only x and the segments' variables change
        x = jit.captured([x.uop.base, *L.bufs], var_vals)
        if marks is not None and i == 0 and len(self.layers) > 1:
          Device[self.device].synchronize()
          marks.append(time.perf_counter())
    if marks is not None:
      Device[self.device].synchronize()
    return x

  def _blocks_seconds(self, t0: float, marks: list[float], t1: float) -> float:
    """A one-row step's time in its blocks (last_layers_s), from t0 before the input's copy to t1 after the device ran
    the last block. With a mark after the first block: the other blocks' time per block, times every block, so what
    the step pays once (the input's copy, the first launch onto an idle device: tens of µs beside a GPU's ~0.2 ms a
    block) does not count as the blocks' speed, which would make a stage of few blocks look slower than one of many."""
    if marks:
      return (t1 - marks[0]) / (len(self.layers) - 1) * len(self.layers)
    return t1 - t0

  def _plan_layers(self, shape: Shape) -> None:
    """Once every layer graph of `shape` is captured, run them without TinyJit from now on (replay.py): layer 0 reads
    the shape's input buffer, layer i layer i-1's output. Not planned (None): TinyJit's own replay keeps running them."""
    caps = [self._layer_jit(key).captured for key in self._layer_keys(shape)]
    if any(c is None for c in caps):
      return
    p = Plan(out=caps[-1].ret, threads=self.threads)
    ins = [self._inputs[shape], *(c.ret for c in caps[:-1])]
    self._plans[shape] = p if all(plan(c, [t.uop.base, *L.bufs], p) for c, t, L in zip(caps, ins, self.layers, strict=True)) else None

  def _head_logits(self, y: Tensor, shape: Shape, row: int, tick: Callable[[], None] | None = None) -> np.ndarray:
    """The logits of row `row` of a one-segment shape ([vocab]), or of every row of a batch ([rows, vocab])."""
    jit = self._head_jit(shape)
    if shape not in self._head_plans and jit.captured is not None and self._plans.get(shape) is not None:
      p = Plan(out=jit.captured.ret, threads=self.threads)  # reads the layer plan's output buffer
      self._head_plans[shape] = p if plan(jit.captured, [self._plans[shape].out.uop.base], p) else None
    batch = len(shape) > 1
    if (p := self._head_plans.get(shape)) is not None:
      p({} if batch else {"row": row})
      out = read(p.out)
    else:
      capturing = jit.captured is None
      with self._capture_context():
        out = (jit(y) if batch else jit(y, UOp.variable("row", 0, sum(shape) - 1).bind(row))).numpy()
      if capturing and tick is not None:
        tick()
    return out.reshape(len(shape), -1) if batch else out

  # ---- compiling ahead ----

  @property
  def shapes(self) -> tuple[Shape, ...]:
    """The graphs' shapes a step runs: one run's decode row, with prefill_chunk > 1 its prefill chunks, and with several
    slots the batched decode rows of several runs."""
    one = ((1,),) if self.chunk == 1 else ((1,), (self.chunk,))
    return one + tuple((1,) * b for b in self.batch_widths[1:])

  @property
  def widths(self) -> tuple[int, ...]:
    """Rows per graph a step runs (what the shapes hold)."""
    return tuple(dict.fromkeys(sum(s) for s in self.shapes))

  def _graphs(self, shape: Shape) -> list[tuple[str, TinyJit, dict[str, Buffer], dict[str, object]]]:
    """(name, jit, model buffers it reads, cache-key facts) of every graph a step of `shape` runs."""
    common = {"params": repr(self.params), "threads": self.threads, "mv_threads": self.mv_threads, "beam": self.beam,
              "cpu_threads": max(NUM_CPU_THREADS.value, self.threads * SLICES_PER_THREAD),
              "cache_len": self.max_seq_len + self.chunk, "caches": self.slots + (self.scratch is not None), "kv_dtype": self.kv_dtype,
              "swa_ring": self.ring.length if self.ring is not None else 0}
    shapes = lambda ts: [(t.shape, str(t.dtype)) for t in ts]  # noqa: E731
    out: list[tuple[str, TinyJit, dict[str, Buffer], dict[str, object]]] = []
    for key in dict.fromkeys(self._layer_keys(shape)):
      L = next(L for L in self.layers if L.kinds == key[1])
      ext = {name: t.uop.base.buffer for name, t in zip(("cos", "sin"), self._rope(key[3]), strict=True)}
      if key[3] and self.ring is not None:
        ext["swa_mask"] = self._mask(shape).uop.base.buffer
      out.append((f"layer {key}", self._layer_jit(key), ext, {**common, "inputs": shapes(L.tensors)}))
    if self.head is not None:
      norm, (kind, ts) = self.head
      ext = {"head_norm": norm.uop.base.buffer, **{f"head_{j}": t.uop.base.buffer for j, t in enumerate(ts)}}
      out.append((f"head {shape} {kind}", self._head_jit(shape), ext, {**common, "inputs": shapes([norm, *ts])}))
    return out

  def prepare(self, on_progress: Callable[[int, int], None] | None = None) -> CompileReport:
    """Make every graph a step runs (decode rows, prefill chunks, batched decode rows, the head) ready before the first
    step: load it from the graph cache, or capture it (and store it there), and build the replay plans. The KV rows a
    run reads are left as they were. on_progress(done, total) counts graph calls: two per graph captured here (tinygrad
    runs a graph once, then captures it on its second call), none for a graph the cache holds.

    Several workers of one host (stages of one pipeline, or a restarted process beside running ones) share the cache:
    a shape another worker is capturing is left for last and then loaded from what it stored, so each graph is captured
    once per host however many stages load at once (GraphCache.claim). A stage's layer graphs are every stage's of the
    file: a last stage whose layers some other stage stored captures only its head."""
    t0 = time.perf_counter()
    cache = self.graph_cache
    graphs = {shape: self._graphs(shape) for shape in self.shapes}
    keys = {shape: [cache.key(self.device, name, **facts) for name, _, _, facts in gs] if cache else [None] * len(gs)
            for shape, gs in graphs.items()}
    done, total = 0, 2 * sum(cache is None or not cache.has(k) for ks in keys.values() for k in ks)  # type: ignore[arg-type]

    def say_progress() -> None:  # also while waiting on another worker's claim: the load is alive (may be cancelled)
      if on_progress is not None:
        on_progress(done, total)

    def tick() -> None:
      nonlocal done
      done = min(done + 1, total)
      say_progress()

    say_progress()
    cached, later = 0, []
    for shape in self.shapes:
      if cache is None or all(cache.has(k) for k in keys[shape]):  # type: ignore[arg-type]
        cached += self._prepare_shape(shape, graphs[shape], keys[shape], tick)
        continue
      claim = cache.try_claim(self._claim_name(shape, keys[shape]))
      if claim is None:  # another worker is capturing it: take the others first
        later.append(shape)
        continue
      with claim:
        cached += self._prepare_shape(shape, graphs[shape], keys[shape], tick)
    for shape in later:
      assert cache is not None
      with cache.claim(self._claim_name(shape, keys[shape]), waiting=say_progress):  # it stored them (or gave up: capture)
        cached += self._prepare_shape(shape, graphs[shape], keys[shape], tick)
    if on_progress is not None and done < total:
      on_progress(total, total)  # every graph is ready (a graph of one layer parity may need fewer calls)
    report = CompileReport(sum(len(gs) for gs in graphs.values()), cached, time.perf_counter() - t0)
    get_logger().info("compute_graphs_prepared", graphs=report.graphs, cached=report.cached, seconds=round(report.seconds, 3),
                      widths=list(self.widths), slots=self.slots, layer_start=self.layer_start, layer_end=self.layer_end)
    return report

  def _claim_name(self, shape: Shape, keys: list[str | None]) -> str:
    """What workers capturing `shape` claim: its layer graphs' keys (a last stage's head is its own)."""
    return hashlib.sha256("\n".join(str(k) for k in keys[:self._n_layer_graphs(shape)]).encode()).hexdigest()[:40]

  def _n_layer_graphs(self, shape: Shape) -> int:
    return len(dict.fromkeys(self._layer_keys(shape)))

  def _prepare_shape(self, shape: Shape, graphs: list[tuple[str, TinyJit, dict[str, Buffer], dict[str, object]]],
                     keys: list[str | None], tick: Callable[[], None]) -> int:
    """Load `shape`'s graphs from the cache, capture (and store) what it lacks; returns how many were loaded."""
    loaded = self._load_cached(shape, graphs, keys)
    todo = list(zip(keys, graphs, strict=True))[loaded:]
    if not todo:
      return loaded
    zeros = np.zeros((sum(shape), self.params.dim), np.float32)
    # slot 0 past the context (the cache keeps one chunk more): no run reads there
    segments = [(0, self.max_seq_len)] * len(shape)
    for _ in range(4):  # a layer graph only one layer uses is captured on the second pass; a head plan needs the layer plan
      if shape in self._plans and (self.head is None or shape in self._head_plans or self._plans[shape] is None) \
          and all(g[1].captured is not None for _, g in todo):
        break
      y = self._rows(zeros, shape, segments, tick)
      if self.head is not None:
        self._head_logits(y, shape, sum(shape) - 1, tick)
    if self.graph_cache is not None:
      for key, (_, jit, ext, _) in todo:
        if jit.captured is not None and key is not None:
          self.graph_cache.store(key, jit.captured, ext)
    return loaded

  def _load_cached(self, shape: Shape, graphs: list[tuple[str, TinyJit, dict[str, Buffer], dict[str, object]]],
                   keys: list[str | None]) -> int:
    """Take what the cache holds of `shape`: every graph, the layer graphs without the head's, or nothing (a layer
    graph missing: they are captured together). Returns how many graphs were taken (they lead `graphs`)."""
    cache, n_layers = self.graph_cache, self._n_layer_graphs(shape)
    if cache is None:
      return 0
    loaded: list[LoadedGraph | CapturedJit] = []
    for k, (_, _, ext, _) in zip(keys, graphs, strict=True):  # the layer graphs, then the head's
      g = cache.load(k, ext)  # type: ignore[arg-type]
      if g is None:
        break
      loaded.append(g)
    if len(loaded) < n_layers:  # without the head's only, the head is captured alone
      return 0
    if loaded and all(isinstance(g, LoadedGraph) for g in loaded) and self._plan_loaded(shape, loaded):  # type: ignore[arg-type]
      return len(loaded)
    if loaded and all(isinstance(g, CapturedJit) for g in loaded):  # other devices: TinyJit replays them
      for (_, jit, _, _), c in zip(graphs, loaded, strict=False):
        jit.captured, jit.cnt = c, 2
      return len(loaded)
    return 0

  def _plan_loaded(self, shape: Shape, graphs: list[LoadedGraph]) -> bool:
    """Plans of `shape` from graphs the cache held (in _graphs' order: the layer graphs, then the head's if held)."""
    by_key = dict(zip(dict.fromkeys(self._layer_keys(shape)), graphs, strict=False))
    layers = [by_key[key] for key in self._layer_keys(shape)]
    if shape not in self._inputs:
      self._inputs[shape] = to_device(np.zeros((sum(shape), self.params.dim), np.float32), self.device)
    p = Plan(out=layers[-1].ret, threads=self.threads)
    ins = [self._inputs[shape].uop.base.buffer, *(g.views[g.spec.ret] for g in layers[:-1])]
    if not all(plan_graph(g, [x, *(u.buffer for u in L.bufs)], p) for g, x, L in zip(layers, ins, self.layers, strict=True)):
      return False
    hp = None
    if self.head is not None and len(graphs) > len(by_key):  # without it, the head is captured over this plan
      hp = Plan(out=graphs[-1].ret, threads=self.threads)
      if not plan_graph(graphs[-1], [p.out.uop.base.buffer], hp):
        return False
    self._plans[shape] = p
    if hp is not None:
      self._head_plans[shape] = hp
    return True

  # ---- steps ----

  def step_logits(self, inputs: np.ndarray, start_pos: int, *, slot: int = 0) -> np.ndarray:
    """Like step() but returns the final logits row (float32 [vocab]) instead of a sampled token (last stage only)."""
    if self.head is None:
      raise ValueError(f"stage [{self.layer_start}, {self.layer_end}) has no output head (not the last stage)")
    return self._run(inputs, start_pos, slot)

  def step(self, inputs: np.ndarray, start_pos: int, *, sample: bool = True, slot: int = 0,
           every_row: bool = False) -> np.ndarray:
    """One run's rows, in its slot. sample=False on the last stage: a prompt chunk that is not the prompt's last runs
    through the layers (filling the KV cache) without the head or the sampler, and the step returns int32 [NO_TOKEN].
    every_row (a VERIFY object's drafts, objflags): the rows run one by one through the decode graph, each exactly the
    decode step it stands for (the same kernels, so the same logits as without drafts, bit for bit; on the CPU a row
    also costs less alone than padded into a prefill chunk), and the last stage samples a token after each, in order."""
    if every_row:
      out = [self.step(inputs[i:i + 1], start_pos + i, slot=slot) for i in range(len(inputs))]
      return np.concatenate(out)
    if self.head is not None and not sample:
      self._run(inputs, start_pos, slot, head=False)
      return np.array([NO_TOKEN], dtype=np.int32)
    y = self._run(inputs, start_pos, slot)
    return y if self.head is None else np.array([self.samplers[slot](y)], dtype=np.int32)

  def rewind(self, slot: int, rows: int) -> None:
    """Drop the run's last `rows` positions in `slot` (rejected drafts): the next step starts there and overwrites
    their KV entries (no step reads past its own rows; a sliding layer's ring forgets them, as a later row of the same
    position may land in another place), and the last stage's sampler takes back their draws."""
    s = self._slot(slot)
    if not 0 <= rows <= self.next_pos[s]:
      raise ValueError(f"cannot rewind {rows} rows in slot {slot}: it holds {self.next_pos[s]} positions")
    if self.ring is not None:
      self.ring.rewind(s, self.next_pos[s] - rows)
    self.next_pos[s] -= rows
    if self.head is not None:
      self.samplers[s].rewind(rows)

  def _run(self, inputs: np.ndarray, start_pos: int, slot: int, head: bool = True) -> np.ndarray:
    x = self._check(inputs, start_pos, slot)
    self.last_layers_s = None
    rows = self._embed(x.astype(np.int64)) if self.is_first else x
    outs, n = [], rows.shape[0]
    for c0 in range(0, n, self.chunk):
      part = rows[c0:c0 + self.chunk]
      t = len(part)
      width = 1 if t == 1 else self.chunk
      if t < width:
        part = np.concatenate([part, np.zeros((width - t, part.shape[1]), np.float32)])
      marks: list[float] = []
      t0 = time.perf_counter()
      y = self._rows(part, (width,), [(slot, start_pos + c0)], marks=marks if n == 1 else None, real=[t])
      if n == 1:
        self.last_layers_s = self._blocks_seconds(t0, marks, time.perf_counter())
      if self.head is None:
        outs.append(read(y)[:t])
      elif head and c0 + self.chunk >= n:
        outs.append(self._head_logits(y, (width,), t - 1))
    self.next_pos[slot] = start_pos + n
    if self.head is None:
      return np.concatenate(outs).astype(np.float32, copy=False)
    return outs[-1] if head else np.empty(0, np.float32)

  def step_batch(self, batch: list[BatchRow]) -> list[np.ndarray]:
    """One decode row of each of several runs (distinct slots) as one pass: the weights are read once for all rows.
    Returns each row's output in order: its activation row [1, dim], or on the last stage its sampled token int32 [1]
    (NO_TOKEN where it asked for none)."""
    y, shape = self._batch(batch)
    if self.head is None:
      out = read(y)[:len(batch)].astype(np.float32, copy=False)
      return [out[i:i + 1] for i in range(len(batch))]
    if not any(r.sample for r in batch):
      return [np.array([NO_TOKEN], dtype=np.int32) for _ in batch]
    logits = np.atleast_2d(self._head_logits(y, shape, 0))  # [rows, vocab], a one-row graph's too
    return [np.array([self.samplers[r.slot](logits[i]) if r.sample else NO_TOKEN], dtype=np.int32)
            for i, r in enumerate(batch)]

  def step_batch_logits(self, batch: list[BatchRow]) -> np.ndarray:
    """Like step_batch() but returns the rows' final logits, float32 [len(batch), vocab], instead of sampled tokens
    (last stage only; a caller that samples by its own rules, such as the orchestrator's draft model)."""
    if self.head is None:
      raise ValueError(f"stage [{self.layer_start}, {self.layer_end}) has no output head (not the last stage)")
    y, shape = self._batch(batch)
    return np.atleast_2d(self._head_logits(y, shape, 0))[:len(batch)]

  def _batch(self, batch: list[BatchRow]) -> tuple[Tensor, Shape]:
    """Run the rows of a batched step through the layers: the last layer's output and the step's shape."""
    if not batch:
      raise ValueError("a batched step needs at least one row")
    slots = [r.slot for r in batch]
    if len(set(slots)) != len(slots):
      raise ValueError(f"a batched step takes one row per slot, got slots {slots}")
    if len(batch) > self.slots:
      raise ValueError(f"{len(batch)} rows exceed this stage's {self.slots} slot(s)")
    self.last_layers_s = None
    xs = [self._check(r.inputs, r.start_pos, r.slot, rows=1) for r in batch]
    rows = self._embed(np.concatenate(xs).astype(np.int64)) if self.is_first else np.concatenate(xs)
    width = next(b for b in self.batch_widths if b >= len(batch))
    segments = [(r.slot, r.start_pos) for r in batch]
    if width > len(batch):  # padding rows: zeros, in the scratch slot at position 0, their outputs dropped
      assert self.scratch is not None
      rows = np.concatenate([rows, np.zeros((width - len(batch), rows.shape[1]), np.float32)])
      segments += [(self.scratch, 0)] * (width - len(batch))
    shape = (1,) * width
    y = self._rows(rows, shape, segments)
    for r in batch:
      self.next_pos[r.slot] = r.start_pos + 1
    return y, shape
