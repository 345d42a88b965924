"""Float64 numpy llama / qwen2 / qwen3 / phi3 / gemma2 / gemma3 forward: the correctness oracle for the tinygrad stage compute.

Deliberately independent of swactor.worker.compute: it parses the GGUF itself (read_gguf: the format's header,
key-values and tensor table, nothing of swactor.modelfile; test_reference.py holds it to gguf.GGUFReader) and
dequantizes with gguf.quants.dequantize, recomputes attention over the whole prefix (or, with a KV
cache, over the cached keys and values of it), and computes each rotation angle one pair at a time the
way ggml's rope does (rope_freqs divisors, linear scaling, YaRN's ramp and magnitude), rotating adjacent
pairs (x[2i], x[2i+1]) for llama and halves (x[i], x[i+d/2]) for qwen2, qwen3 and phi3 (NeoX). qwen3 RMS-norms
each head's Q and K vector (attn_q_norm / attn_k_norm, [head_dim]) before the rotation. phi3's fused matrices are split here by rows: attn_qkv into Q, K, V,
ffn_up into the gate (first half) and up (second half). Llama 3's frequency rule is written here after Hugging Face's
wavelength formulation. Gemma (gemma2, gemma3), as llama.cpp's graphs run it: the embedding rows times
sqrt(dim); the attention output and the FFN output each RMS-normed by their own weights (post_attention_norm,
post_ffw_norm) before they are added to the residual; gelu (tanh form) of the gate; scores scaled by
1/sqrt(head_dim) (1/sqrt(dim/heads) for the 27B block counts); layer i attends to the last `sliding_window`
positions only unless i % period == period - 1 (period 6, gemma2 2, or the file's sliding_window_pattern), those
local layers turning Q/K with base 10000 unscaled (gemma3; gemma2 the file's base and scaling); gemma2 soft-caps
the scores (50) and the logits (30), c * tanh(s / c), unless the file names other caps. Mixture of Experts (qwen3moe,
llama with `ffn_gate_inp` / `ffn_*_exps`: Mixtral), as llama.cpp's build_moe_ffn runs both: per row, the softmax of
the router's logits, the `expert_used_count` most probable experts (ties: the lower id), their probabilities
renormalised to sum 1 (unless `expert_weights_norm` is false), the sum of those experts' SwiGLU outputs by them.
LongRoPE (phi3 files with `rope_factors_long` / `rope_factors_short`), as llama.cpp runs it: the long set divides each
pair's frequency when the context the model is run with (`n_ctx`; the file's context_length if not given, llama.cpp's
default) exceeds `rope.scaling.original_context_length`, else the short set; cos and sin are multiplied by
`rope.scaling.attn_factor` (llama.cpp multiplies it into every rotation's magnitude, whatever the file).

`Reference(path, n_ctx=None)` is what tests use: the greedy tokens (KV-cached) and logits of a file, computed once
and kept under .cache/reference/, keyed by the file's sha256, n_ctx and this module's source, so a test suite
computes each (file, prompt) once whatever the stage count, and later runs not at all.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

CACHE = pathlib.Path(__file__).resolve().parents[2] / ".cache/reference"
CODE_VERSION = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]  # any change here recomputes

NEOX = {"llama": False, "qwen2": True, "qwen3": True, "qwen3moe": True, "phi3": True, "gemma2": True, "gemma3": True}
GEMMA_PERIOD = {"gemma2": 2, "gemma3": 6}  # every period-th layer attends to every position
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


# ---- reading the file (GGUF v2/v3: header, key-values, tensor table, aligned data) ----
# gguf.GGUFReader builds a numpy view per vocabulary string (~1.2 M for SmolLM2's tokenizer: ~2 s a file, twice that
# on a loaded box); the reference needs none of the tokenizer's, so its arrays of strings are stepped over.

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
  qtype: GGMLQuantizationType
  shape: tuple[int, ...]  # numpy order (the file lists dimensions innermost first)
  data: np.ndarray  # the tensor's bytes (uint8)


def read_gguf(path: str | os.PathLike[str]) -> tuple[dict[str, object], dict[str, Tensor]]:
  """The file's key-values (arrays as lists; `tokenizer.ggml.*` left out) and its tensors by name."""
  buf = np.memmap(path, np.uint8, mode="r")
  mem = memoryview(buf)
  pos = 0

  def take(fmt: str) -> Any:
    nonlocal pos
    (v,) = struct.unpack_from(fmt, mem, pos)
    pos += struct.calcsize(fmt)
    return v

  def string() -> str:
    nonlocal pos
    n = take("<Q")
    pos += n
    return bytes(mem[pos - n:pos]).decode("utf-8", "replace")

  def value(vtype: int, keep: bool) -> object:
    nonlocal pos
    if vtype == _STRING:
      return string()
    if vtype == _ARRAY:
      etype, n = take("<I"), take("<Q")
      if etype in _SCALARS:
        size = struct.calcsize(_SCALARS[etype])
        pos += n * size
        return np.frombuffer(mem[pos - n * size:pos], _SCALARS[etype]).tolist() if keep else None
      items = [value(etype, keep) for _ in range(n)]
      return items if keep else None
    if vtype not in _SCALARS:
      raise ValueError(f"{path}: GGUF value type {vtype} at byte {pos}")
    return take(_SCALARS[vtype])

  if bytes(mem[:4]) != b"GGUF":
    raise ValueError(f"{path} is not a GGUF file")
  pos = 4
  version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
  if version not in (2, 3):
    raise ValueError(f"{path}: GGUF version {version}")
  kv: dict[str, object] = {}
  for _ in range(n_kv):
    key = string()
    keep = not key.startswith("tokenizer.ggml.")
    v = value(take("<I"), keep)
    if keep:
      kv[key] = v
  table = []
  for _ in range(n_tensors):
    name, n_dims = string(), take("<I")
    dims = [take("<Q") for _ in range(n_dims)]
    table.append((name, GGMLQuantizationType(take("<I")), tuple(reversed(dims)), take("<Q")))
  align = int(kv.get("general.alignment", 32))  # type: ignore[call-overload]
  start = -(-pos // align) * align
  tensors = {}
  for name, qtype, shape, offset in table:
    block, size = GGML_QUANT_SIZES[qtype]
    nbytes = math.prod(shape) // block * size
    tensors[name] = Tensor(qtype, shape, buf[start + offset:start + offset + nbytes])
  return kv, tensors


def llama3_divisors(base: float, dim: int, factor: float, low: float, high: float, orig: int) -> np.ndarray:
  """Per-frequency divisors of Llama 3.1 (the values convert_hf_to_gguf stores as rope_freqs.weight)."""
  out = []
  for i in range(0, dim, 2):
    wavelen = 2 * math.pi * base ** (i / dim)
    if wavelen < orig / high:
      out.append(1.0)
    elif wavelen > orig / low:
      out.append(factor)
    else:
      smooth = (orig / wavelen - low) / (high - low)
      out.append(1.0 / ((1 - smooth) / factor + smooth))
  return np.array(out)


def rope_angles(pos: np.ndarray, dim: int, base: float, divisors: np.ndarray | None = None, scaling: str = "none",
                factor: float = 1.0, orig_ctx: int = 0) -> tuple[np.ndarray, float]:
  """Angles [T, dim/2] of each position and pair, and the cos/sin magnitude (YaRN's mscale; 1 otherwise)."""
  ang, mscale = np.zeros((len(pos), dim // 2)), 1.0
  if scaling == "yarn":
    def corr(rot: float) -> float: return dim * math.log(orig_ctx / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(0, math.floor(corr(32.0))), min(dim - 1, math.ceil(corr(1.0)))
    mscale = 1.0 + 0.1 * math.log(factor) if factor > 1 else 1.0
  for i in range(dim // 2):
    theta = base ** (-2.0 * i / dim) / (1.0 if divisors is None else float(divisors[i]))
    if scaling == "linear":
      theta /= factor
    elif scaling == "yarn":
      ramp = 1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
      theta = theta / factor * (1 - ramp) + theta * ramp
    ang[:, i] = pos * theta
  return ang, mscale


class RefLlama:
  def __init__(self, path: str, n_ctx: int | None = None):
    kv, w = read_gguf(path)
    a = self.arch = kv["general.architecture"]
    self.neox = NEOX[a]
    self.n_layers, self.dim = kv[f"{a}.block_count"], kv[f"{a}.embedding_length"]
    self.n_heads, self.n_kv = kv[f"{a}.attention.head_count"], kv[f"{a}.attention.head_count_kv"]
    self.hd = kv.get(f"{a}.attention.key_length", self.dim // self.n_heads)
    self.rope_dim, self.base = kv.get(f"{a}.rope.dimension_count", self.hd), kv[f"{a}.rope.freq_base"]
    self.eps = kv[f"{a}.attention.layer_norm_rms_epsilon"]
    self.factor = kv.get(f"{a}.rope.scaling.factor", 1.0)
    self.scaling = kv.get(f"{a}.rope.scaling.type", "linear" if self.factor != 1.0 else "none")
    self.orig_ctx = kv.get(f"{a}.rope.scaling.original_context_length", kv[f"{a}.context_length"])
    self.n_ctx = n_ctx if n_ctx is not None else kv[f"{a}.context_length"]
    self.attn_factor = float(kv.get(f"{a}.rope.scaling.attn_factor", 1.0))
    gemma = a in GEMMA_PERIOD
    self.embed_scale = math.sqrt(self.dim) if gemma else 1.0
    period = int(kv.get(f"{a}.attention.sliding_window_pattern", GEMMA_PERIOD.get(a, 0)))
    self.window = int(kv.get(f"{a}.attention.sliding_window", 4096 if a == "gemma2" else 0)) if gemma else 0
    self.local = [self.window > 0 and (i + 1) % period != 0 for i in range(self.n_layers)]
    self.local_base = kv.get(f"{a}.rope.freq_base_swa", 10000.0 if a == "gemma3" else self.base)
    self.local_scaled = a != "gemma3"  # gemma3's sliding-window layers take none of the file's rope scaling
    self.gelu = gemma
    scale_dim = self.dim // self.n_heads if GEMMA_27B_LAYERS.get(a) == self.n_layers else self.hd
    self.attn_scale = 1 / math.sqrt(scale_dim)
    self.attn_cap = float(kv.get(f"{a}.attn_logit_softcapping", 50.0)) if a == "gemma2" else 0.0
    self.final_cap = float(kv.get(f"{a}.final_logit_softcapping", 30.0 if a == "gemma2" else 0.0)) if gemma else 0.0
    get = lambda n: dequantize(w[n].data, w[n].qtype).astype(np.float64).reshape(w[n].shape)  # noqa: E731
    self.divisors = get("rope_freqs.weight") if "rope_freqs.weight" in w else None
    self.long_factors = get("rope_factors_long.weight") if "rope_factors_long.weight" in w else None
    self.short_factors = get("rope_factors_short.weight") if "rope_factors_short.weight" in w else None
    if self.long_factors is not None and self.short_factors is not None:
      self.divisors = self.long_factors if self.n_ctx > self.orig_ctx else self.short_factors
    if self.scaling == "llama3" and self.divisors is None:
      self.divisors = llama3_divisors(self.base, self.rope_dim, self.factor, kv.get(f"{a}.rope.scaling.low_freq_factor", 1.0),
                                      kv.get(f"{a}.rope.scaling.high_freq_factor", 4.0), self.orig_ctx)
    self.embd = get("token_embd.weight")
    self.out = get("output.weight") if "output.weight" in w else self.embd
    self.out_norm = get("output_norm.weight")
    fused = "blk.0.attn_qkv.weight" in w  # phi3: [Q; K; V] rows in attn_qkv, [gate; up] rows in ffn_up
    self.moe = "blk.0.ffn_gate_inp.weight" in w  # experts: [n, rows, cols] each, the router [n, dim]
    self.n_used = int(kv.get(f"{a}.expert_used_count", 0))
    self.experts_norm = bool(kv.get(f"{a}.expert_weights_norm", True))
    ffn = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if self.moe else ("ffn_gate", "ffn_up", "ffn_down")
    names = ("attn_norm", "attn_output", "ffn_norm") + (
      ("attn_qkv", "ffn_up", "ffn_down") if fused else ("attn_q", "attn_k", "attn_v", *ffn))
    self.layers = [{n: get(f"blk.{i}.{n}.weight") for n in names} for i in range(self.n_layers)]
    for L in self.layers if fused else []:
      nq, nkv = self.n_heads * self.hd, self.n_kv * self.hd
      qkv, gate_up = L.pop("attn_qkv"), L.pop("ffn_up")
      assert qkv.shape[0] == nq + 2 * nkv and gate_up.shape[0] % 2 == 0, (qkv.shape, gate_up.shape)
      L["attn_q"], L["attn_k"], L["attn_v"] = qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:]
      half = gate_up.shape[0] // 2  # ggml's swiglu: silu(the first half) * the second half
      L["ffn_gate"], L["ffn_up"] = gate_up[:half], gate_up[half:]
    for i, L in enumerate(self.layers):
      for n in ("attn_q", "attn_k", "attn_v"):
        L[f"{n}.bias"] = get(f"blk.{i}.{n}.bias") if f"blk.{i}.{n}.bias" in w else np.zeros(L[n].shape[0])
      for n in ("attn_q_norm", "attn_k_norm"):  # qwen3's and gemma3's per-head norms (None: the file has none)
        L[n] = get(f"blk.{i}.{n}.weight") if f"blk.{i}.{n}.weight" in w else None
      for n in ("post_attention_norm", "post_ffw_norm"):  # Gemma's
        L[n] = get(f"blk.{i}.{n}.weight") if f"blk.{i}.{n}.weight" in w else None

  def norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray: return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

  def rope(self, x: np.ndarray, pos: np.ndarray, local: bool = False) -> np.ndarray:  # x [T, heads, hd]
    base = self.local_base if local else self.base
    if local and not self.local_scaled:
      ang, mscale = rope_angles(pos, self.rope_dim, base)
    else:
      ang, mscale = rope_angles(pos, self.rope_dim, base, self.divisors, self.scaling, self.factor, self.orig_ctx)
    mscale *= self.attn_factor
    c, s = np.cos(ang)[:, None, :] * mscale, np.sin(ang)[:, None, :] * mscale
    y, d = x.copy(), self.rope_dim
    ia, ib = (np.arange(d // 2), np.arange(d // 2, d)) if self.neox else (np.arange(0, d, 2), np.arange(1, d, 2))
    a, b = x[..., ia], x[..., ib]
    y[..., ia], y[..., ib] = a * c - b * s, a * s + b * c
    return y

  def hidden(self, tokens: list[int], layers: range | None = None, x: np.ndarray | None = None,
             cache: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
    """Full-prefix forward over `layers` (all by default); returns hidden rows [T, dim]. With `cache` (layer -> keys,
    values of the positions before these rows, grown here) the rows continue that prefix instead."""
    T = len(tokens) if x is None else x.shape[0]
    x = self.embd[tokens] * self.embed_scale if x is None else x.astype(np.float64)
    start = next(iter(cache.values()))[0].shape[0] if cache else 0
    pos = np.arange(start, start + T, dtype=np.float64)
    mask = np.triu(np.full((T, start + T), -np.inf), start + 1)
    too_old = pos[:, None] - np.arange(start + T)[None, :] >= self.window  # [T, keys]: outside a sliding window
    local_mask = np.where(too_old, -np.inf, mask)
    g = self.n_heads // self.n_kv
    for i in layers if layers is not None else range(self.n_layers):
      L = self.layers[i]
      h = self.norm(x, L["attn_norm"])
      q = (h @ L["attn_q"].T + L["attn_q.bias"]).reshape(T, self.n_heads, self.hd)
      k = (h @ L["attn_k"].T + L["attn_k.bias"]).reshape(T, self.n_kv, self.hd)
      if L["attn_q_norm"] is not None:  # over each head's vector (the last axis)
        q, k = self.norm(q, L["attn_q_norm"]), self.norm(k, L["attn_k_norm"])
      local = self.local[i]
      q, k = self.rope(q, pos, local), self.rope(k, pos, local)
      v = (h @ L["attn_v"].T + L["attn_v.bias"]).reshape(T, self.n_kv, self.hd)
      if cache is not None:
        if i in cache:
          k, v = np.concatenate([cache[i][0], k]), np.concatenate([cache[i][1], v])
        cache[i] = (k, v)
      att = np.empty((T, self.n_heads, self.hd))
      for hh in range(self.n_heads):
        s = q[:, hh] @ k[:, hh // g].T * self.attn_scale
        if self.attn_cap:
          s = self.attn_cap * np.tanh(s / self.attn_cap)
        s = s + (local_mask if local else mask)
        p = np.exp(s - s.max(-1, keepdims=True))
        att[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, hh // g]
      o = att.reshape(T, -1) @ L["attn_output"].T
      x = x + (o if L["post_attention_norm"] is None else self.norm(o, L["post_attention_norm"]))
      h = self.norm(x, L["ffn_norm"])
      f = self.experts(h, L) if self.moe else self.ffn(h, L["ffn_gate"], L["ffn_up"], L["ffn_down"])
      x = x + (f if L["post_ffw_norm"] is None else self.norm(f, L["post_ffw_norm"]))
    return x

  def ffn(self, h: np.ndarray, gate_w: np.ndarray, up_w: np.ndarray, down_w: np.ndarray) -> np.ndarray:
    gate, up = h @ gate_w.T, h @ up_w.T
    if self.gelu:  # tanh approximation
      act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
    else:
      act = gate / (1 + np.exp(-gate))
    return (act * up) @ down_w.T

  def route(self, logits: np.ndarray) -> tuple[list[int], np.ndarray]:
    """One row's experts (most probable first, ties to the lower id) and their weights."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    chosen = list(np.argsort(-p, kind="stable")[:self.n_used])
    w = p[chosen]
    return chosen, (w / w.sum() if self.experts_norm else w)

  def experts(self, h: np.ndarray, L: dict[str, np.ndarray]) -> np.ndarray:
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
      ids, w = self.route(h[t] @ L["ffn_gate_inp"].T)
      for e, we in zip(ids, w, strict=True):
        out[t] += we * self.ffn(h[t:t + 1], L["ffn_gate_exps"][e], L["ffn_up_exps"][e], L["ffn_down_exps"][e])[0]
    return out

  def logits(self, h_last: np.ndarray) -> np.ndarray:
    out = self.norm(h_last, self.out_norm) @ self.out.T
    return self.final_cap * np.tanh(out / self.final_cap) if self.final_cap else out

  def greedy(self, prompt: list[int], n: int, kv_cache: bool = False) -> tuple[list[int], list[float]]:
    """n greedy tokens (no EOS stop) and the top-2 logit gap at each step. Each step recomputes the whole prefix, unless
    kv_cache (then a step is one row: ~prefix-length times faster, the same up to float64 rounding)."""
    toks, out, gaps, cache = list(prompt), [], [], ({} if kv_cache else None)
    for _ in range(n):
      lg = self.logits(self.hidden(toks if cache is None or not out else toks[-1:], cache=cache)[-1])
      top = np.sort(lg)[-2:]
      out.append(int(np.argmax(lg)))
      gaps.append(float(top[1] - top[0]))
      toks.append(out[-1])
    return out, gaps


@cache
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 22):
      h.update(chunk)
  return h.hexdigest()


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_bytes(data)
  os.replace(tmp, path)


# The float64 model last built, by its cache directory: tests make a Reference per call, and building one dequantizes
# the whole file again (seconds); one is kept (SmolLM2's is ~1 GB), so a run of misses on one file builds it once.
_last_model: tuple[pathlib.Path, RefLlama] | None = None


class Reference:
  """RefLlama's results for one file, cached on disk; the float64 model is built only on a cache miss."""

  def __init__(self, path: str | os.PathLike[str], n_ctx: int | None = None):
    self.path, self.n_ctx = str(path), n_ctx
    st = os.stat(self.path)
    ctx = "" if n_ctx is None else f"-ctx{n_ctx}"
    self.dir = CACHE / f"{_file_sha256(self.path, st.st_size, st.st_mtime_ns)}-{CODE_VERSION}{ctx}"

  @property
  def model(self) -> RefLlama:
    global _last_model
    if _last_model is None or _last_model[0] != self.dir:
      _last_model = None  # the old one's memory goes before the new one is built
      _last_model = (self.dir, RefLlama(self.path, n_ctx=self.n_ctx))
    return _last_model[1]

  @staticmethod
  def _key(prompt: list[int]) -> str: return hashlib.sha256(json.dumps(list(map(int, prompt))).encode()).hexdigest()[:16]

  def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """RefLlama.greedy(prompt, n, kv_cache=True); a longer run cached for the same prompt serves a shorter one
    (greedy steps do not depend on how many follow)."""
    path = self.dir / f"greedy-{self._key(prompt)}.json"
    if path.exists():
      got = json.loads(path.read_text())
      if len(got["tokens"]) >= n:
        return got["tokens"][:n], got["gaps"][:n]
    tokens, gaps = self.model.greedy(prompt, n, kv_cache=True)
    _write_atomic(path, json.dumps({"prompt": list(map(int, prompt)), "tokens": tokens, "gaps": gaps}).encode())
    return tokens, gaps

  def prefill_logits(self, prompt: list[int]) -> np.ndarray:
    """The logits row of the prompt's last position."""
    path = self.dir / f"logits-{self._key(prompt)}.npy"
    if path.exists():
      return np.load(path)
    logits = self.model.logits(self.model.hidden(prompt)[-1])
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.npy")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(tmp, logits)
    os.replace(tmp, path)
    return logits
