"""Float64 numpy llama forward: the correctness oracle for the tinygrad stage compute.

Deliberately independent of swactor.worker.compute: it parses the GGUF with gguf.GGUFReader and
dequantizes with gguf.quants.dequantize, recomputes attention over the whole prefix, and rotates
adjacent pairs (x[2i], x[2i+1]) as llama.cpp's non-NeoX RoPE does.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class RefLlama:
  def __init__(self, path: str):
    r = GGUFReader(path, "r")
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    self.n_layers, self.dim = kv["llama.block_count"], kv["llama.embedding_length"]
    self.n_heads, self.n_kv = kv["llama.attention.head_count"], kv["llama.attention.head_count_kv"]
    self.hd = self.dim // self.n_heads
    self.rope_dim, self.base = kv.get("llama.rope.dimension_count", self.hd), kv["llama.rope.freq_base"]
    self.eps = kv["llama.attention.layer_norm_rms_epsilon"]
    w = {t.name: t for t in r.tensors}
    get = lambda n: dequantize(w[n].data, w[n].tensor_type).astype(np.float64).reshape([int(s) for s in reversed(w[n].shape)])  # noqa: E731
    self.embd = get("token_embd.weight")
    self.out = get("output.weight") if "output.weight" in w else self.embd
    self.out_norm = get("output_norm.weight")
    names = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
    self.layers = [{n: get(f"blk.{i}.{n}.weight") for n in names} for i in range(self.n_layers)]

  def norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray: return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

  def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:  # x [T, heads, hd]
    half = self.rope_dim // 2
    ang = pos[:, None] * self.base ** (-np.arange(half) * 2.0 / self.rope_dim)  # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    y = x.copy()
    a, b = x[..., 0:self.rope_dim:2], x[..., 1:self.rope_dim:2]
    y[..., 0:self.rope_dim:2], y[..., 1:self.rope_dim:2] = a * c - b * s, a * s + b * c
    return y

  def hidden(self, tokens: list[int], layers: range | None = None, x: np.ndarray | None = None,
             cache: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
    """Full-prefix forward over `layers` (all by default); returns hidden rows [T, dim]. With `cache` (layer -> keys,
    values of the positions before these rows, grown here) the rows continue that prefix instead."""
    T = len(tokens) if x is None else x.shape[0]
    x = self.embd[tokens] if x is None else x.astype(np.float64)
    start = next(iter(cache.values()))[0].shape[0] if cache else 0
    pos = np.arange(start, start + T, dtype=np.float64)
    mask = np.triu(np.full((T, start + T), -np.inf), start + 1)
    g = self.n_heads // self.n_kv
    for i in layers if layers is not None else range(self.n_layers):
      L = self.layers[i]
      h = self.norm(x, L["attn_norm"])
      q = self.rope((h @ L["attn_q"].T).reshape(T, self.n_heads, self.hd), pos)
      k = self.rope((h @ L["attn_k"].T).reshape(T, self.n_kv, self.hd), pos)
      v = (h @ L["attn_v"].T).reshape(T, self.n_kv, self.hd)
      if cache is not None:
        if i in cache:
          k, v = np.concatenate([cache[i][0], k]), np.concatenate([cache[i][1], v])
        cache[i] = (k, v)
      att = np.empty((T, self.n_heads, self.hd))
      for hh in range(self.n_heads):
        s = q[:, hh] @ k[:, hh // g].T / np.sqrt(self.hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        att[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, hh // g]
      x = x + att.reshape(T, -1) @ L["attn_output"].T
      h = self.norm(x, L["ffn_norm"])
      gate, up = h @ L["ffn_gate"].T, h @ L["ffn_up"].T
      x = x + (gate / (1 + np.exp(-gate)) * up) @ L["ffn_down"].T
    return x

  def logits(self, h_last: np.ndarray) -> np.ndarray: return self.norm(h_last, self.out_norm) @ self.out.T

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
