"""GGUF -> one stage's weights (spec §15): memory-mapped, only the assigned layer range is touched."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from .quant import BLOCK, UnsupportedQuant, dequantize, row_bytes

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight")


class ModelRefused(ValueError):
  """The GGUF cannot serve this stage; `reason` is a stable enum-like string for events (spec §37)."""
  def __init__(self, reason: str, detail: str):
    self.reason, self.detail = reason, detail
    super().__init__(f"{reason}: {detail}")


# general.architecture -> whether Q/K rotate as NeoX (halves) rather than llama.cpp's adjacent pairs; hyper-parameters
# are read from keys prefixed by the architecture's name. Mistral files are `llama`.
ARCHITECTURES = {"llama": False, "qwen2": True}
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "llama3")
QKV_BIAS = ("attn_q", "attn_k", "attn_v")


@dataclass(frozen=True)
class RopeScaling:
  kind: str = "none"            # one of ROPE_SCALING_TYPES (rope.py applies them)
  factor: float = 1.0
  original_context: int = 0     # yarn, llama3: the context the model was trained on before scaling
  low_freq_factor: float = 1.0  # llama3
  high_freq_factor: float = 4.0  # llama3


@dataclass(frozen=True)
class LlamaParams:
  n_layers: int
  dim: int
  ffn_dim: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  rope_base: float
  rope_dim: int
  rope_scaling: RopeScaling
  norm_eps: float
  context_length: int
  vocab_size: int
  bos_token_id: int | None
  eos_token_id: int | None
  arch: str = "llama"
  rope_neox: bool = False  # qwen2: rotate (x[i], x[i + rope_dim/2]) instead of (x[2i], x[2i+1])
  qkv_bias: bool = False   # Q/K/V have biases (qwen2)


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


@dataclass(frozen=True)
class LoadProgress:
  bytes_loaded: int
  bytes_total: int
  layers_loaded: int
  layers_total: int


@dataclass
class StageWeights:
  """Weights of layers [layer_start, layer_end) (+ embedding on the first, norm/head on the last stage).

  Tensors are float32 numpy arrays, except those whose type is in `keep` at load time (raw blocks)."""
  params: LlamaParams
  layer_start: int
  layer_end: int
  layers: list[dict[str, np.ndarray | RawTensor]] = field(default_factory=list)
  token_embd: np.ndarray | RawTensor | None = None
  output_norm: np.ndarray | None = None
  output: np.ndarray | RawTensor | None = None
  rope_freqs: np.ndarray | None = None  # optional per-frequency divisors (llama3-style)

  @property
  def is_first(self) -> bool: return self.layer_start == 0

  @property
  def is_last(self) -> bool: return self.layer_end == self.params.n_layers


def _field(reader: GGUFReader, key: str, default: Any = ...) -> Any:
  f = reader.fields.get(key)
  if f is None:
    if default is ...:
      raise ModelRefused("MissingMetadata", f"GGUF key {key!r} is missing")
    return default
  return f.contents()


def read_rope_scaling(k: Callable[..., Any], context_length: int) -> RopeScaling:
  """`{arch}.rope.scaling.*` as llama.cpp reads them: no type but a factor means linear; `llama3` (the rule that
  computes rope_freqs, for files that carry its parameters instead of the tensor) takes HF's parameter names."""
  factor = float(k("rope.scaling.factor", k("rope.scale_linear", 0.0)) or 1.0)
  kind = str(k("rope.scaling.type", "linear" if factor != 1.0 else "none"))
  if kind not in ROPE_SCALING_TYPES:
    raise ModelRefused("UnsupportedRopeScaling", f"rope scaling type {kind!r} is not supported (supported: {', '.join(ROPE_SCALING_TYPES)})")
  if float(k("rope.scaling.attn_factor", 1.0)) != 1.0:
    raise ModelRefused("UnsupportedRopeScaling", f"rope.scaling.attn_factor {k('rope.scaling.attn_factor')} is not supported (only 1.0)")
  if kind == "none":
    return RopeScaling()
  if factor <= 0:
    raise ModelRefused("UnsupportedRopeScaling", f"rope scaling factor {factor} must be > 0")
  orig = int(k("rope.scaling.original_context_length", context_length))
  if kind == "llama3":
    return RopeScaling(kind, factor, orig, float(k("rope.scaling.low_freq_factor", 1.0)), float(k("rope.scaling.high_freq_factor", 4.0)))
  return RopeScaling(kind, factor, orig)


def read_params(reader: GGUFReader, tensor_names: set[str] | frozenset[str] = frozenset()) -> LlamaParams:
  arch = _field(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise ModelRefused("UnsupportedArchitecture", f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
  k = lambda s, d=...: _field(reader, f"{arch}.{s}", d)  # noqa: E731
  dim, n_heads = int(k("embedding_length")), int(k("attention.head_count"))
  head_dim = int(k("attention.key_length", dim // n_heads))
  if k("attention.value_length", head_dim) != head_dim:
    raise ModelRefused("UnsupportedArchitecture", "key_length != value_length")
  tokens = reader.fields.get("tokenizer.ggml.tokens")
  vocab = int(k("vocab_size", len(tokens.data) if tokens is not None else 0))
  ctx = int(k("context_length"))
  biases = [t for t in QKV_BIAS if f"blk.0.{t}.bias" in tensor_names]
  if biases and len(biases) != len(QKV_BIAS):
    raise ModelRefused("UnsupportedArchitecture", f"layer 0 has biases for {biases} only (supported: none, or all of {list(QKV_BIAS)})")
  return LlamaParams(
    n_layers=int(k("block_count")), dim=dim, ffn_dim=int(k("feed_forward_length")), n_heads=n_heads,
    n_kv_heads=int(k("attention.head_count_kv", n_heads)), head_dim=head_dim, rope_base=float(k("rope.freq_base", 10000.0)),
    rope_dim=int(k("rope.dimension_count", head_dim)), rope_scaling=read_rope_scaling(k, ctx),
    norm_eps=float(k("attention.layer_norm_rms_epsilon")), context_length=ctx, vocab_size=vocab,
    bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", None), eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id", None),
    arch=arch, rope_neox=ARCHITECTURES[arch], qkv_bias=bool(biases))


class GGUFModel:
  """An opened GGUF: metadata parsed, tensor data memory-mapped, nothing read yet."""
  def __init__(self, path: str | os.PathLike[str]):
    try:
      self.reader = GGUFReader(path, "r")
    except FileNotFoundError:
      raise
    except Exception as e:
      raise ModelRefused("MalformedGGUF", f"{path}: {e}") from e
    self.path, self.params = str(path), read_params(self.reader, {t.name for t in self.reader.tensors})
    self.tensors: dict[str, RawTensor] = {}
    for t in self.reader.tensors:
      qt, shape = QT(t.tensor_type), tuple(int(s) for s in reversed(t.shape.tolist()))
      rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
      data = t.data.reshape(-1).view(np.uint8).reshape(rows, -1) if qt in BLOCK else t.data
      self.tensors[t.name] = RawTensor(t.name, qt, shape if len(shape) > 1 else (shape[0],), data)
    known = {f"{t}.weight" for t in LAYER_TENSORS} | {f"{t}.bias" for t in QKV_BIAS}
    for name in self.tensors:  # a tensor nothing reads means a variant of the architecture this compute lacks
      if (name.split(".", 2)[-1] not in known) if name.startswith("blk.") else (name not in GLOBAL_TENSORS):
        raise ModelRefused("UnsupportedArchitecture", f"{self.params.arch} file has tensor {name!r}, which this compute does not implement")

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
    bias = {f"{t}_bias": f"{t}.bias" for t in QKV_BIAS} if self.params.qkv_bias else {}
    names = {**{t: f"{t}.weight" for t in LAYER_TENSORS}, **bias}
    layers = [{k: self.tensor(f"blk.{i}.{v}") for k, v in names.items()} for i in range(layer_start, layer_end)]
    extra: dict[str, RawTensor] = {}
    if layer_start == 0:
      extra["token_embd"] = self.tensor("token_embd.weight")
    if layer_end == n:
      extra["output_norm"] = self.tensor("output_norm.weight")
      extra["output"] = self.tensor("output.weight") if "output.weight" in self.tensors else self.tensor("token_embd.weight")
    if "rope_freqs.weight" in self.tensors:
      extra["rope_freqs"] = self.tensor("rope_freqs.weight")
    return layers, extra


def load_stage(model: GGUFModel | str | os.PathLike[str], layer_start: int, layer_end: int, *,
               keep: frozenset[QT] = frozenset(), on_progress: Callable[[LoadProgress], None] | None = None) -> StageWeights:
  """Read and dequantize (to float32) the stage's tensors; matrices of a type in `keep` stay raw blocks (memmap views)."""
  m = model if isinstance(model, GGUFModel) else GGUFModel(model)
  layers, extra = m.stage_tensors(layer_start, layer_end)
  needed = {t.name: t for t in [*extra.values(), *(t for L in layers for t in L.values())]}
  total, done, cache = sum(t.nbytes for t in needed.values()), 0, {}
  def get(t: RawTensor) -> np.ndarray | RawTensor:
    nonlocal done
    if t.name not in cache:  # a tied head is the embedding: read once
      done += t.nbytes
      cache[t.name] = t if (t.qtype in keep and len(t.shape) == 2) else t.dequantize()
    return cache[t.name]
  def report(n_layers: int) -> None:
    if on_progress:
      on_progress(LoadProgress(done, total, n_layers, layer_end - layer_start))
  w = StageWeights(m.params, layer_start, layer_end)
  if "token_embd" in extra:
    w.token_embd = get(extra["token_embd"])
  if "rope_freqs" in extra:
    w.rope_freqs = np.asarray(get(extra["rope_freqs"])).reshape(-1)
  for i, L in enumerate(layers):
    w.layers.append({k: get(t) for k, t in L.items()})
    report(i + 1)
  if "output" in extra:
    w.output_norm, w.output = np.asarray(get(extra["output_norm"])), get(extra["output"])
  report(len(layers))
  return w
