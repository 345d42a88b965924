"""GGUF -> one stage's weights (spec §15): memory-mapped, only the assigned layer range is touched."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType as QT

from swactor.modelfile.judge import unknown_tensors_refusal
from swactor.modelfile.params import LlamaParams, ModelRefused, open_header, read_params
from swactor.modelfile.support import ARCHITECTURES, ATTN_QKV, FFN_GATE_UP, QKV_BIAS

from .quant import BLOCK, UnsupportedQuant, dequantize, row_bytes

# The per-layer matrices and norms the forward (model.py) reads, by their names after `blk.<i>.`
# without `.weight`; tests/modelfile/test_support.py checks them against support.ARCHITECTURES.
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
# The per-head Q/K norms it reads too when the architecture has them (support.Architecture.qk_norm, support.QK_NORM).
QK_NORM_TENSORS = ("attn_q_norm", "attn_k_norm")
# Gemma's norms of the attention and FFN outputs (support.Architecture.post_norms, support.POST_NORMS).
POST_NORM_TENSORS = ("post_attention_norm", "post_ffw_norm")
# What a Mixture-of-Experts block (LlamaParams.moe; support.EXPERT_FFN) has instead of ffn_gate/up/down: the router
# [n_experts, dim] and every expert's matrices stacked [n_experts, rows, cols] (loaded as they are, all experts).
EXPERT_TENSORS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# What a fused architecture (support.Architecture.fused_qkv_gate_up, phi3) has instead of attn_q/k/v and
# ffn_gate/up: each is split by rows at load into the matrices above (fused_parts).
FUSED_TENSORS = {ATTN_QKV.removesuffix(".weight"): ("attn_q", "attn_k", "attn_v"),
                 FFN_GATE_UP.removesuffix(".weight"): ("ffn_gate", "ffn_up")}


@dataclass(frozen=True)
class RawTensor:
  """A memory-mapped GGUF tensor: `data` is a uint8 view [rows, row_bytes] into the file (no copy)."""
  name: str
  qtype: QT
  shape: tuple[int, ...]  # numpy order: (rows, cols); cols is GGUF's ne0
  data: np.ndarray

  @property
  def nbytes(self) -> int: return int(self.data.nbytes)

  def dequantize(self) -> np.ndarray: return dequantize(self.data, self.qtype, self.shape[-1], self.name).reshape(self.shape)

  def rows(self, name: str, start: int, end: int) -> RawTensor:
    """Rows [start, end) of a matrix, as a view: rows of a block-quantized matrix are independent."""
    return RawTensor(name, self.qtype, (end - start, self.shape[1]), self.data[start:end])


def fused_parts(t: RawTensor, sizes: tuple[int, ...], names: tuple[str, ...]) -> list[RawTensor]:
  """A fused matrix (phi3's attn_qkv, ffn_up) split by rows into its parts, in order, each named `<fused>:<part>`."""
  if len(t.shape) != 2 or t.shape[0] != sum(sizes):
    raise ModelRefused("MalformedGGUF", f"tensor {t.name!r} has shape {t.shape}, not [{' + '.join(map(str, sizes))}, cols]")
  bounds = np.cumsum((0, *sizes))
  return [t.rows(f"{t.name}:{n}", int(a), int(b)) for n, a, b in zip(names, bounds[:-1], bounds[1:], strict=True)]


@dataclass(frozen=True)
class LoadProgress:
  bytes_loaded: int
  bytes_total: int
  layers_loaded: int
  layers_total: int


@dataclass(frozen=True)
class Expanded:
  """A tensor dequantized to float32 at load because its type is not kept packed: its memory grows by float32_bytes / file_bytes."""
  name: str
  qtype: QT
  file_bytes: int
  float32_bytes: int


@dataclass
class StageWeights:
  """Weights of layers [layer_start, layer_end) (+ embedding on the first, norm/head on the last stage).

  Tensors are float32 numpy arrays, except those whose type is in `keep` at load time (raw blocks) and the embedding
  (raw, memory-mapped: only the rows of a step's tokens are ever dequantized)."""
  params: LlamaParams
  layer_start: int
  layer_end: int
  layers: list[dict[str, np.ndarray | RawTensor]] = field(default_factory=list)
  token_embd: RawTensor | None = None
  output_norm: np.ndarray | None = None
  output: np.ndarray | RawTensor | None = None
  rope_freqs: np.ndarray | None = None  # optional per-frequency divisors (llama3-style)
  # LongRoPE's two sets of per-frequency divisors (phi3 long-context files); the stage turns by one (rope.py)
  rope_long: np.ndarray | None = None
  rope_short: np.ndarray | None = None
  device_file_bytes: int = 0            # the file's bytes of the tensors above that go to the device (all but the embedding)
  expanded: list[Expanded] = field(default_factory=list)  # the non-float32 tensors dequantized to float32

  @property
  def is_first(self) -> bool: return self.layer_start == 0

  @property
  def is_last(self) -> bool: return self.layer_end == self.params.n_layers


class GGUFModel:
  """An opened GGUF: header parsed (modelfile.params), tensor data memory-mapped, nothing read yet.

  Architectures, their tensors and the quant types come from the support declaration: a tensor nothing reads is
  refused naming it, a type id that is no GGML type at open, a type the core cannot load when its tensor is used."""
  def __init__(self, path: str | os.PathLike[str]):
    header = open_header(path)
    self.path, self.params = str(path), read_params(header)
    self.arch = ARCHITECTURES[self.params.arch]
    unknown = unknown_tensors_refusal(self.arch, (t.name for t in header.tensors), self.params.n_layers, self.params.moe)
    if unknown is not None:
      raise ModelRefused(unknown.reason, unknown.detail)
    for t in header.tensors:
      if t.nbytes < 0:
        raise UnsupportedQuant(t.qtype, t.name)
    file = np.memmap(path, dtype=np.uint8, mode="r") if header.tensors else np.zeros(0, np.uint8)
    self.tensors: dict[str, RawTensor] = {}
    for t in header.tensors:
      start = header.data_offset + t.offset
      if start + t.nbytes > file.size:
        raise ModelRefused("MalformedGGUF", f"tensor {t.name!r} ends at byte {start + t.nbytes}, beyond the file's {file.size}")
      shape = tuple(reversed(t.dims))  # numpy order
      rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
      data = file[start:start + t.nbytes].reshape(rows, -1)
      self.tensors[t.name] = RawTensor(t.name, QT(t.qtype), shape if len(shape) > 1 else (shape[0],), data)

  def tensor(self, name: str) -> RawTensor:
    if name not in self.tensors:
      raise ModelRefused("MissingTensor", f"tensor {name!r} is not in {self.path}")
    t = self.tensors[name]
    if t.qtype not in BLOCK:
      raise UnsupportedQuant(t.qtype, name)
    if t.data.shape[-1] != row_bytes(t.qtype, t.shape[-1], name):
      raise ModelRefused("MalformedGGUF", f"tensor {name!r} size mismatch")
    return t

  def stage_tensors(self, layer_start: int, layer_end: int) -> tuple[list[dict[str, RawTensor]], dict[str, RawTensor]]:
    n = self.params.n_layers
    if not (0 <= layer_start < layer_end <= n):
      raise ModelRefused("InvalidLayerRange", f"layer range [{layer_start}, {layer_end}) is not within 0 <= start < end <= {n}")
    bias = {t.replace(".", "_"): t for t in QKV_BIAS} if self.params.qkv_bias else {}  # attn_q_bias: "attn_q.bias"
    qk_norm = {t: f"{t}.weight" for t in QK_NORM_TENSORS} if self.params.qk_norm else {}
    post_norms = {t: f"{t}.weight" for t in POST_NORM_TENSORS} if self.params.post_norms else {}
    names = {**{t: f"{t}.weight" for t in LAYER_TENSORS}, **bias, **qk_norm, **post_norms}
    if self.params.moe:
      names = {k: v for k, v in names.items() if k not in ("ffn_gate", "ffn_up", "ffn_down")} | \
          {t: f"{t}.weight" for t in EXPERT_TENSORS}
    if self.arch.fused_qkv_gate_up:
      names = {k: v for k, v in names.items() if k not in {p for parts in FUSED_TENSORS.values() for p in parts}}
    layers = [{k: self.tensor(f"blk.{i}.{v}") for k, v in names.items()} for i in range(layer_start, layer_end)]
    p = self.params
    for L in layers if p.moe else []:
      want = {"ffn_gate_inp": (p.n_experts, p.dim), "ffn_gate_exps": (p.n_experts, p.ffn_dim, p.dim),
              "ffn_up_exps": (p.n_experts, p.ffn_dim, p.dim), "ffn_down_exps": (p.n_experts, p.dim, p.ffn_dim)}
      for k, shape in want.items():
        if L[k].shape != shape:
          raise ModelRefused("MalformedGGUF", f"tensor {L[k].name!r} has shape {L[k].shape}, not {shape} "
                                              f"(expert_count {p.n_experts}, expert width {p.ffn_dim})")
    if self.arch.fused_qkv_gate_up:
      sizes = {"attn_qkv": (p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim, p.n_kv_heads * p.head_dim),
               "ffn_up": (p.ffn_dim, p.ffn_dim)}  # llama.cpp's swiglu: silu(the first half) * the second
      for i, L in zip(range(layer_start, layer_end), layers, strict=True):
        for fused, parts in FUSED_TENSORS.items():
          L.update(zip(parts, fused_parts(self.tensor(f"blk.{i}.{fused}.weight"), sizes[fused], parts), strict=True))
    extra: dict[str, RawTensor] = {}
    if layer_start == 0:
      extra["token_embd"] = self.tensor("token_embd.weight")
    if layer_end == n:
      extra["output_norm"] = self.tensor("output_norm.weight")
      extra["output"] = self.tensor(self.arch.head if self.arch.head in self.tensors else self.arch.tied_head)
    for name in ("rope_freqs", "rope_factors_long", "rope_factors_short"):  # params.read_params checked their shapes
      if f"{name}.weight" in self.tensors:
        extra[name] = self.tensor(f"{name}.weight")
    return layers, extra


def load_stage(model: GGUFModel | str | os.PathLike[str], layer_start: int, layer_end: int, *,
               keep: frozenset[QT] = frozenset(), on_progress: Callable[[LoadProgress], None] | None = None) -> StageWeights:
  """Read and dequantize (to float32) the stage's tensors; matrices of a type in `keep` stay raw blocks (memmap views)."""
  m = model if isinstance(model, GGUFModel) else GGUFModel(model)
  layers, extra = m.stage_tensors(layer_start, layer_end)
  needed = {t.name: t for t in [*extra.values(), *(t for L in layers for t in L.values())]}
  total, done, cache, counted = sum(t.nbytes for t in needed.values()), 0, {}, set()
  host = extra["token_embd"].nbytes if "token_embd" in extra and extra.get("output") is not extra["token_embd"] else 0
  w = StageWeights(m.params, layer_start, layer_end, device_file_bytes=total - host)
  def count(t: RawTensor) -> None:
    nonlocal done
    if t.name not in counted:  # a tied head is the embedding: read once
      counted.add(t.name)
      done += t.nbytes
  def get(t: RawTensor) -> np.ndarray | RawTensor:
    count(t)
    if t.name not in cache:
      if t.qtype in keep and len(t.shape) >= 2:  # a matrix, or experts' matrices stacked
        cache[t.name] = t
      else:
        cache[t.name] = t.dequantize()
        if t.qtype != QT.F32:
          w.expanded.append(Expanded(t.name, t.qtype, t.nbytes, int(cache[t.name].nbytes)))
    return cache[t.name]
  def report(n_layers: int) -> None:
    if on_progress:
      on_progress(LoadProgress(done, total, n_layers, layer_end - layer_start))
  if "token_embd" in extra:
    w.token_embd = extra["token_embd"]
    count(w.token_embd)
  if "rope_freqs" in extra:
    w.rope_freqs = np.asarray(get(extra["rope_freqs"])).reshape(-1)
  if "rope_factors_long" in extra:
    w.rope_long = np.asarray(get(extra["rope_factors_long"])).reshape(-1)
    w.rope_short = np.asarray(get(extra["rope_factors_short"])).reshape(-1)
  for i, L in enumerate(layers):
    w.layers.append({k: get(t) for k, t in L.items()})
    report(i + 1)
  if "output" in extra:
    w.output_norm, w.output = np.asarray(get(extra["output_norm"])), get(extra["output"])
  report(len(layers))
  return w
