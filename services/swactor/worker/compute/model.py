"""Llama-family forward (llama, qwen2) for one contiguous layer range, in tinygrad (spec §10, §16).

step(rows, start_pos) runs rows at positions start_pos.. through the stage's layers:
  first stage in: int32 token ids [T]; other stages in: float32 activations [T, dim]
  last stage out: int32 [1], the token sampled from the last row; other stages out: float32 [T, dim]
Decode (T=1) and prefill chunks (T=chunk, zero padded) each run as one TinyJit graph; start_pos is a bound
Variable, the KV cache is preallocated to max_seq_len (+ one chunk of padding room), weights never change.
"""
from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tinygrad import Context, Device, Tensor, TinyJit, UOp
from tinygrad.device import Buffer
from tinygrad.engine.jit import CapturedJit
from tinygrad.helpers import NUM_CPU_THREADS

from swactor.common.events import get_logger
from swactor.common.objflags import NO_TOKEN  # the last stage's output for a prompt chunk it does not sample
from swactor.common.sampling import SamplingPolicy

from .cpu_matvec import SLICES_PER_THREAD
from .gguf_weights import GGUFModel, LlamaParams, LoadProgress, RawTensor, load_stage
from .graphcache import GraphCache
from .linear import N_TENSORS, PACKED, Weight, apply, copy_in, to_device, upload
from .quant import dequantize
from .replay import LoadedGraph, Plan, plan, plan_graph, read
from .rope import rope, rope_tables
from .sampling import Sampler


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
  cache_bytes: int   # the KV cache


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


class Layer:
  """One block's device tensors as a flat list (the jitted layer graph takes them as inputs) plus the matrix kinds of
  its four products, each one or more fused matrices: [attn_norm, ffn_norm, cache_k, cache_v, (qkv_bias if
  p.qkv_bias), *qkv, *attn_output, *gate_up, *ffn_down]."""
  def __init__(self, w: dict[str, np.ndarray | RawTensor], p: LlamaParams, cache_len: int, device: str, words: bool):
    groups = [fuse_rows([w["attn_q"], w["attn_k"], w["attn_v"]], "attn_qkv"), [w["attn_output"]],
              fuse_rows([w["ffn_gate"], w["ffn_up"]], "ffn_gate_up"), [w["ffn_down"]]]
    mats = [[upload(m, device, words) for m in g] for g in groups]
    self.kinds = tuple(tuple(k for k, _ in g) for g in mats)
    norms = [to_device(np.asarray(w[k], np.float32), device) for k in ("attn_norm", "ffn_norm")]
    cache = [to_device(np.zeros((p.n_kv_heads, cache_len, p.head_dim), np.float32), device) for _ in range(2)]
    bias = [to_device(np.concatenate([np.asarray(w[f"{k}_bias"], np.float32) for k in ("attn_q", "attn_k", "attn_v")]), device)] \
      if p.qkv_bias else []
    self.tensors: list[Tensor] = norms + cache + bias + [t for g in mats for _, ts in g for t in ts]
    self.weight_bytes = sum(t.nbytes() for t in self.tensors) - sum(t.nbytes() for t in cache)

  @property
  def bufs(self) -> list[UOp]: return [t.uop.base for t in self.tensors]


def layer_forward(p: LlamaParams, kinds: tuple[tuple[str, ...], ...], x: Tensor, sp: UOp | int, cos: Tensor, sin: Tensor,
                  ts: list[Tensor], threads: int = 0) -> Tensor:
  T, nq, nkv = x.shape[0], p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim
  attn_norm, ffn_norm, cache_k, cache_v, it = ts[0], ts[1], ts[2], ts[3], iter(ts[4:])
  bias = next(it) if p.qkv_bias else None
  def product(group: tuple[str, ...]) -> Callable[[Tensor], Tensor]:
    fs = [functools.partial(apply, kind, [next(it) for _ in range(N_TENSORS[kind])], threads=threads) for kind in group]
    return fs[0] if len(fs) == 1 else lambda h: Tensor.cat(*(f(h) for f in fs), dim=-1)
  qkv_, o_, gate_up_, down_ = (product(g) for g in kinds)
  qkv = qkv_(rms_norm(x, attn_norm, p.norm_eps))
  if bias is not None:
    qkv = qkv + bias
  q = rope(qkv[:, :nq].reshape(T, p.n_heads, p.head_dim), cos, sin, p.rope_dim, p.rope_neox)
  k = rope(qkv[:, nq:nq + nkv].reshape(T, p.n_kv_heads, p.head_dim), cos, sin, p.rope_dim, p.rope_neox)
  v = qkv[:, nq + nkv:].reshape(T, p.n_kv_heads, p.head_dim)
  cache_k[:, sp:sp + T, :].assign(k.transpose(0, 1))
  cache_v[:, sp:sp + T, :].assign(v.transpose(0, 1))
  keys, vals = cache_k[:, 0:sp + T, :], cache_v[:, 0:sp + T, :]  # [KV, L, hd]
  g = p.n_heads // p.n_kv_heads
  qg = q.reshape(T, p.n_kv_heads, g, p.head_dim).permute(1, 2, 0, 3)  # [KV, g, T, hd]
  # [KV, g, T, L]; as a product + sum, not qg @ keys.T: on the symbolic-length slice the matmul compiles to divisions and
  # modulos in the inner loop (3x slower)
  s = (qg.unsqueeze(3) * keys.reshape(p.n_kv_heads, 1, 1, -1, p.head_dim)).sum(-1) * (1.0 / math.sqrt(p.head_dim))
  if T > 1:
    s = s + Tensor.full((T, sp + T), float("-inf"), device=x.device).triu(sp + 1)
  a = (s.softmax(-1) @ vals.unsqueeze(1)).permute(2, 0, 1, 3).reshape(T, p.n_heads * p.head_dim)
  x = x + o_(a)
  gu = gate_up_(rms_norm(x, ffn_norm, p.norm_eps))
  act = (gu[:, :p.ffn_dim].silu() * gu[:, p.ffn_dim:]).contiguous()  # else silu is recomputed inside the down matvec
  return (x + down_(act)).contiguous()


class StageModel:
  """Compute for layers [layer_start, layer_end) of a llama-family GGUF; weights stay loaded across runs (reset())."""

  def __init__(self, gguf: str | os.PathLike[str] | GGUFModel, layer_start: int, layer_end: int, *, max_seq_len: int = 2048,
               device: str | None = None, sampling: SamplingPolicy | None = None, prefill_chunk: int = 1,
               quantized: bool = True, beam: int = 0, threads: int | None = None, on_progress: Callable[[LoadProgress], None] | None = None,
               graph_cache: GraphCache | None = None):
    t0 = time.perf_counter()
    m = gguf if isinstance(gguf, GGUFModel) else GGUFModel(gguf)
    p = self.params = m.params
    if max_seq_len > p.context_length:
      raise ValueError(f"max_seq_len {max_seq_len} exceeds the model's context_length {p.context_length}")
    if max_seq_len < 1 or prefill_chunk < 1:
      raise ValueError(f"max_seq_len and prefill_chunk must be >= 1, got {max_seq_len}, {prefill_chunk}")
    keep = frozenset(PACKED) if quantized else frozenset()
    w = load_stage(m, layer_start, layer_end, keep=keep, on_progress=on_progress)
    t1 = time.perf_counter()
    self.device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    self.layer_start, self.layer_end, self.max_seq_len, self.chunk = layer_start, layer_end, max_seq_len, prefill_chunk
    self.is_first, self.is_last, self.beam = w.is_first, w.is_last, beam  # beam: tinygrad kernel search width at capture
    # CPU cores a matvec's slices run on (None: the cores this process may use, at most 8); tinygrad's own runtime runs
    # them one after another, replay.Plan splits them over native threads
    self.threads = min(len(os.sched_getaffinity(0)), 8) if threads is None else threads
    if self.threads < 1:
      raise ValueError(f"threads must be >= 1, got {threads}")
    self.mv_threads = self.threads if self.device.split(":")[0] == "CPU" else 0  # > 0: hand-scheduled CPU matvec (linear.py)
    self.layers = [Layer(L, p, max_seq_len + prefill_chunk, self.device, self.mv_threads > 0) for L in w.layers]
    self.embd = w.token_embd  # host side: only the rows of the step's tokens are ever dequantized
    self.head: tuple[Tensor, Weight] | None = None
    if w.output is not None and w.output_norm is not None:
      self.head = (to_device(np.asarray(w.output_norm, np.float32), self.device), upload(w.output, self.device, self.mv_threads > 0))
    head_bytes = sum(t.nbytes() for t in [self.head[0], *self.head[1][1]]) if self.head else 0
    cache_bytes = len(self.layers) * 2 * p.n_kv_heads * (max_seq_len + prefill_chunk) * p.head_dim * 4
    self.memory = StageMemory(w.device_file_bytes, sum(L.weight_bytes for L in self.layers) + head_bytes, cache_bytes)
    if w.expanded:  # types kept as float32 on the device: say what that costs
      get_logger().info("compute_weights_expanded", tensors=len(w.expanded), types=sorted({e.qtype.name for e in w.expanded}),
                        file_bytes=sum(e.file_bytes for e in w.expanded), float32_bytes=sum(e.float32_bytes for e in w.expanded),
                        layer_start=layer_start, layer_end=layer_end)
    cos, sin = rope_tables(p, w.rope_freqs, max_seq_len + prefill_chunk)
    self.cos, self.sin = (to_device(t.astype(np.float32)[:, None, :], self.device) for t in (cos, sin))
    self.v_sp = UOp.variable("start_pos", 0, max_seq_len)
    # one jitted graph per (rows, matrix kinds, parity): it is replayed over every layer's tensors; alternating two
    # graphs keeps a layer's input buffer distinct from the output buffer it writes
    self._layer_jits: dict[tuple[int, tuple[str, ...], int], TinyJit] = {}
    self._head_jits: dict[int, TinyJit] = {}
    self._inputs: dict[int, Tensor] = {}
    self._plans: dict[int, Plan | None] = {}       # per width: the layers' kernels as a direct-replay plan (None: can't)
    self._head_plans: dict[int, Plan | None] = {}
    self.graph_cache = graph_cache
    self.timings = StageTimings(t1 - t0, time.perf_counter() - t1)
    self.sampler = Sampler(sampling or SamplingPolicy())
    self.reset()

  @property
  def hidden_dim(self) -> int: return self.params.dim

  def reset(self, sampling: SamplingPolicy | None = None) -> None:
    """Start a new run with the loaded weights: positions restart at 0, the sampler is re-seeded."""
    self.next_pos, self.sampler = 0, Sampler(sampling if sampling is not None else self.sampler.policy)

  def _capture_context(self) -> Context:
    """Compile settings of a first (capturing) call: BEAM, and room for the matvecs' core_id slices (linear.py)."""
    return Context(BEAM=self.beam, NUM_CPU_THREADS=max(NUM_CPU_THREADS.value, self.threads * SLICES_PER_THREAD))

  def _layer_jit(self, width: int, kinds: tuple[str, ...], parity: int) -> TinyJit:
    key = (width, kinds, parity)
    if key not in self._layer_jits:
      def f(x: Tensor, sp: UOp, ts: list[Tensor]) -> Tensor:
        return layer_forward(self.params, kinds, x, sp, self.cos[sp:sp + width], self.sin[sp:sp + width], ts, self.mv_threads)
      self._layer_jits[key] = TinyJit(f)
    return self._layer_jits[key]

  def _head_jit(self, width: int) -> TinyJit:
    if width not in self._head_jits:
      assert self.head is not None
      norm, (kind, ts) = self.head
      self._head_jits[width] = TinyJit(lambda x, row: apply(kind, ts, rms_norm(x[row:row + 1], norm, self.params.norm_eps), self.mv_threads).reshape(-1))
    return self._head_jits[width]

  def _embed(self, ids: np.ndarray) -> np.ndarray:
    assert self.embd is not None
    return dequantize(self.embd.data[ids], self.embd.qtype, self.params.dim, self.embd.name)

  def _check(self, inputs: np.ndarray, start_pos: int) -> np.ndarray:
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
    if start_pos != self.next_pos:
      raise ValueError(f"start_pos {start_pos} != expected {self.next_pos} (call reset() for a new run)")
    if start_pos + x.shape[0] > self.max_seq_len:
      raise ValueError(f"positions up to {start_pos + x.shape[0]} exceed max_seq_len {self.max_seq_len}")
    return x

  def _rows(self, rows: np.ndarray, start_pos: int, tick: Callable[[], None] | None = None) -> Tensor:
    """Run rows (already padded to a jit width) through the layers; returns the last layer's output on device.
    `tick` is called after each call of a graph still being captured (prepare's progress)."""
    width = len(rows)
    if width not in self._inputs:  # one fixed input buffer per width, so a replay plan can bake in its address
      self._inputs[width] = to_device(np.zeros((width, self.params.dim), np.float32), self.device)
    xin = copy_in(self._inputs[width], rows.astype(np.float32, copy=False))
    if width not in self._plans:
      self._plan_layers(width)
    if (p := self._plans.get(width)) is not None:
      p({"start_pos": start_pos})
      return p.out
    x, sp = xin, self.v_sp.bind(start_pos)
    for i, L in enumerate(self.layers):
      jit = self._layer_jit(width, L.kinds, i % 2)
      if jit.captured is None:
        with self._capture_context():
          x = jit(x, sp, L.tensors)
        if tick is not None:
          tick()
      else:  # replay directly: the layer's weight/cache buffers are fixed, only x and start_pos change
        x = jit.captured([x.uop.base, *L.bufs], {"start_pos": start_pos})
    return x

  def _plan_layers(self, width: int) -> None:
    """Once every layer graph of `width` is captured, run them without TinyJit from now on (replay.py): layer 0 reads
    the width's input buffer, layer i layer i-1's output. Not planned (None): TinyJit's own replay keeps running them."""
    caps = [self._layer_jit(width, L.kinds, i % 2).captured for i, L in enumerate(self.layers)]
    if any(c is None for c in caps):
      return
    p = Plan(out=caps[-1].ret, threads=self.threads)
    ins = [self._inputs[width], *(c.ret for c in caps[:-1])]
    self._plans[width] = p if all(plan(c, [t.uop.base, *L.bufs], p) for c, t, L in zip(caps, ins, self.layers, strict=True)) else None

  def _head_logits(self, y: Tensor, width: int, row: int, tick: Callable[[], None] | None = None) -> np.ndarray:
    jit = self._head_jit(width)
    if width not in self._head_plans and jit.captured is not None and self._plans.get(width) is not None:
      p = Plan(out=jit.captured.ret, threads=self.threads)  # reads the layer plan's output buffer
      self._head_plans[width] = p if plan(jit.captured, [self._plans[width].out.uop.base], p) else None
    if (p := self._head_plans.get(width)) is not None:
      p({"row": row})
      return read(p.out)
    capturing = jit.captured is None
    with self._capture_context():
      out = jit(y, UOp.variable("row", 0, width - 1).bind(row)).numpy()
    if capturing and tick is not None:
      tick()
    return out

  # ---- compiling ahead ----

  @property
  def widths(self) -> tuple[int, ...]:
    """Rows per graph a step runs: decode rows (1) and, with prefill_chunk > 1, prefill chunks."""
    return (1,) if self.chunk == 1 else (1, self.chunk)

  def _graphs(self, width: int) -> list[tuple[str, TinyJit, dict[str, Buffer], dict[str, object]]]:
    """(name, jit, model buffers it reads, cache-key facts) of every graph a step of `width` rows runs."""
    common = {"params": repr(self.params), "threads": self.threads, "mv_threads": self.mv_threads, "beam": self.beam,
              "cpu_threads": max(NUM_CPU_THREADS.value, self.threads * SLICES_PER_THREAD),
              "cache_len": self.max_seq_len + self.chunk}
    shapes = lambda ts: [(t.shape, str(t.dtype)) for t in ts]  # noqa: E731
    out: list[tuple[str, TinyJit, dict[str, Buffer], dict[str, object]]] = []
    rope = {"cos": self.cos.uop.base.buffer, "sin": self.sin.uop.base.buffer}
    for key in dict.fromkeys((width, L.kinds, i % 2) for i, L in enumerate(self.layers)):
      L = next(L for L in self.layers if L.kinds == key[1])
      out.append((f"layer {key}", self._layer_jit(*key), rope, {**common, "inputs": shapes(L.tensors)}))
    if self.head is not None:
      norm, (kind, ts) = self.head
      ext = {"head_norm": norm.uop.base.buffer, **{f"head_{j}": t.uop.base.buffer for j, t in enumerate(ts)}}
      out.append((f"head {width} {kind}", self._head_jit(width), ext, {**common, "inputs": shapes([norm, *ts])}))
    return out

  def prepare(self, on_progress: Callable[[int, int], None] | None = None) -> CompileReport:
    """Make every graph a step runs (decode rows, prefill chunks, the head) ready before the first step: load it from
    the graph cache, or capture it (and store it there), and build the replay plans. The KV cache is left with rows a
    run overwrites before it reads them. on_progress(done, total) counts graph calls: two per graph captured here
    (tinygrad runs a graph once, then captures it on its second call), none for a width the cache holds whole."""
    t0 = time.perf_counter()
    cache, cached, todo = self.graph_cache, 0, []
    for w in self.widths:
      graphs = self._graphs(w)
      keys = [cache.key(self.device, name, **facts) for name, _, _, facts in graphs] if cache else []
      loaded = [cache.load(k, ext) for k, (_, jit, ext, _) in zip(keys, graphs, strict=True)] if cache else []
      if loaded and all(isinstance(g, LoadedGraph) for g in loaded) and self._plan_loaded(w, loaded):  # type: ignore[arg-type]
        cached += len(graphs)
        continue
      if loaded and all(isinstance(g, CapturedJit) for g in loaded):  # other devices: TinyJit replays them
        for (_, jit, _, _), c in zip(graphs, loaded, strict=True):
          jit.captured, jit.cnt = c, 2
        cached += len(graphs)
        continue
      todo += [(w, key, *g) for key, g in zip(keys or [None] * len(graphs), graphs, strict=True)]
    done, total = 0, 2 * len(todo)

    def tick() -> None:
      nonlocal done
      done = min(done + 1, total)
      if on_progress is not None:
        on_progress(done, total)

    if on_progress is not None:
      on_progress(0, total)
    for w in dict.fromkeys(g[0] for g in todo):
      zeros = np.zeros((w, self.params.dim), np.float32)
      for _ in range(4):  # a layer graph only one layer uses is captured on the second pass; a head plan needs the layer plan
        if w in self._plans and (self.head is None or w in self._head_plans or self._plans[w] is None) \
            and all(g[3].captured is not None for g in todo if g[0] == w):
          break
        y = self._rows(zeros, 0, tick)
        if self.head is not None:
          self._head_logits(y, w, w - 1, tick)
    if on_progress is not None and done < total:
      on_progress(total, total)  # every graph is ready (a graph of one layer parity may need fewer calls)
    if cache is not None:
      for _, key, _, jit, ext, _ in todo:
        if jit.captured is not None:
          cache.store(key, jit.captured, ext)
    report = CompileReport(sum(len(self._graphs(w)) for w in self.widths), cached, time.perf_counter() - t0)
    get_logger().info("compute_graphs_prepared", graphs=report.graphs, cached=report.cached, seconds=round(report.seconds, 3),
                      widths=list(self.widths), layer_start=self.layer_start, layer_end=self.layer_end)
    return report

  def _plan_loaded(self, width: int, graphs: list[LoadedGraph]) -> bool:
    """Plans of `width` from graphs the cache held (in _graphs' order: the layer graphs, then the head's)."""
    by_key = dict(zip(dict.fromkeys((width, L.kinds, i % 2) for i, L in enumerate(self.layers)), graphs, strict=False))
    layers = [by_key[(width, L.kinds, i % 2)] for i, L in enumerate(self.layers)]
    if width not in self._inputs:
      self._inputs[width] = to_device(np.zeros((width, self.params.dim), np.float32), self.device)
    p = Plan(out=layers[-1].ret, threads=self.threads)
    ins = [self._inputs[width].uop.base.buffer, *(g.views[g.spec.ret] for g in layers[:-1])]
    if not all(plan_graph(g, [x, *(u.buffer for u in L.bufs)], p) for g, x, L in zip(layers, ins, self.layers, strict=True)):
      return False
    hp = None
    if self.head is not None:
      hp = Plan(out=graphs[-1].ret, threads=self.threads)
      if not plan_graph(graphs[-1], [p.out.uop.base.buffer], hp):
        return False
    self._plans[width] = p
    if hp is not None:
      self._head_plans[width] = hp
    return True

  def step_logits(self, inputs: np.ndarray, start_pos: int) -> np.ndarray:
    """Like step() but returns the final logits row (float32 [vocab]) instead of a sampled token (last stage only)."""
    if self.head is None:
      raise ValueError(f"stage [{self.layer_start}, {self.layer_end}) has no output head (not the last stage)")
    return self._run(inputs, start_pos)

  def step(self, inputs: np.ndarray, start_pos: int, *, sample: bool = True) -> np.ndarray:
    """sample=False on the last stage: a prompt chunk that is not the prompt's last runs through the layers (filling the
    KV cache) without the head or the sampler, and the step returns int32 [NO_TOKEN]."""
    if self.head is not None and not sample:
      self._run(inputs, start_pos, head=False)
      return np.array([NO_TOKEN], dtype=np.int32)
    y = self._run(inputs, start_pos)
    return y if self.head is None else np.array([self.sampler(y)], dtype=np.int32)

  def _run(self, inputs: np.ndarray, start_pos: int, head: bool = True) -> np.ndarray:
    x = self._check(inputs, start_pos)
    rows = self._embed(x.astype(np.int64)) if self.is_first else x
    outs, n = [], rows.shape[0]
    for c0 in range(0, n, self.chunk):
      part = rows[c0:c0 + self.chunk]
      t = len(part)
      width = 1 if t == 1 else self.chunk
      if t < width:
        part = np.concatenate([part, np.zeros((width - t, part.shape[1]), np.float32)])
      y = self._rows(part, start_pos + c0)
      if self.head is None:
        outs.append(read(y)[:t])
      elif head and c0 + self.chunk >= n:
        outs.append(self._head_logits(y, width, t - 1))
    self.next_pos = start_pos + n
    if self.head is None:
      return np.concatenate(outs).astype(np.float32, copy=False)
    return outs[-1] if head else np.empty(0, np.float32)
