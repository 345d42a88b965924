"""Rotary position embedding: the frequency rules a GGUF asks for (llama.cpp's semantics) and the rotation.

Pair i of rope_dim/2 at position p turns by theta = p * base^(-2i/rope_dim) / f_i, with f_i the per-frequency divisors
(`rope_freqs.weight`, Llama 3's rule from `rope.scaling.*` metadata, or one of LongRoPE's two sets; 1 otherwise), then
per `rope.scaling.type`:
  linear    theta / factor
  yarn      theta / factor for low frequencies, theta for high ones, a linear ramp over the pairs in between (the pairs
            that turn between beta_slow and beta_fast times over original_context); cos and sin scaled by 1 + 0.1 ln factor
  longrope  f_i is `rope_factors_long.weight` for a stage whose context exceeds original_context, else
            `rope_factors_short.weight` (stage_divisors); cos and sin scaled by the file's attn_factor
The tables are computed once in float64 on the host and uploaded as float32 [positions, 1, rope_dim/2].
"""
from __future__ import annotations

import math

import numpy as np
from tinygrad import Tensor

from .gguf_weights import LlamaParams, StageWeights

# llama.cpp's YaRN defaults; llama and qwen2 GGUFs carry no keys for them
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


def llama3_factors(base: float, rope_dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                   original_context: int) -> np.ndarray:
  """Llama 3.1's divisors: wavelengths shorter than original_context / high_freq_factor keep their frequency, longer
  than original_context / low_freq_factor are slowed by `factor`, those between are blended smoothly."""
  inv = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
  ratio = original_context * inv / (2 * math.pi)  # turns over the original context
  smooth = np.clip((ratio - low_freq_factor) / (high_freq_factor - low_freq_factor), 0.0, 1.0)
  return 1.0 / ((1.0 - smooth) / factor + smooth)


def uses_long_factors(p: LlamaParams, context: int) -> bool:
  """Whether a stage built for `context` positions (its max_seq_len) turns by LongRoPE's long set. llama.cpp's rule, with
  the context the model is loaded for (its n_ctx per sequence), not the position a run has reached: the choice is made
  once, so every key in the KV cache was turned by the same set as the query reading it, and every stage of a run (all
  built with the plan's max_seq_len) makes the same one."""
  return context > p.rope_scaling.original_context


def stage_divisors(p: LlamaParams, w: StageWeights, context: int) -> np.ndarray | None:
  """The per-pair divisors a stage of `context` positions turns by: LongRoPE's long or short set (uses_long_factors),
  else the file's rope_freqs (None if it has none: freq_factors then applies the metadata's rule or none)."""
  if p.rope_scaling.kind != "longrope":
    return w.rope_freqs
  chosen = w.rope_long if uses_long_factors(p, context) else w.rope_short
  if chosen is None:  # params.read_params refuses such a file; a StageWeights built by hand must not turn unscaled
    raise ValueError("LongRoPE parameters without the rope_factors_long / rope_factors_short sets")
  return chosen


def freq_factors(p: LlamaParams, rope_freqs: np.ndarray | None) -> np.ndarray:
  """Per-pair divisors f_i: the given tensor (rope_freqs or LongRoPE's chosen set), else Llama 3's rule if the metadata
  asks for it, else ones."""
  half, s = p.rope_dim // 2, p.rope_scaling
  if rope_freqs is not None:
    return np.asarray(rope_freqs, np.float64).reshape(-1)[:half]
  if s.kind == "longrope":
    raise ValueError("LongRoPE tables need the chosen factor set (stage_divisors)")
  if s.kind == "llama3":
    return llama3_factors(p.rope_base, p.rope_dim, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_context)
  return np.ones(half)


def rope_tables(p: LlamaParams, rope_freqs: np.ndarray | None, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
  """cos and sin, float64 [n_pos, rope_dim/2], of positions 0..n_pos-1."""
  s, d = p.rope_scaling, p.rope_dim
  inv = p.rope_base ** (-np.arange(0, d, 2, dtype=np.float64) / d) / freq_factors(p, rope_freqs)
  theta, mscale = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :], 1.0
  if s.kind == "linear":
    theta = theta / s.factor
  elif s.kind == "yarn":
    corr = lambda turns: d * math.log(s.original_context / (turns * 2 * math.pi)) / (2 * math.log(p.rope_base))  # noqa: E731
    lo, hi = max(0.0, math.floor(corr(YARN_BETA_FAST))), min(d - 1.0, math.ceil(corr(YARN_BETA_SLOW)))
    keep = 1.0 - np.clip((np.arange(d // 2) - lo) / max(0.001, hi - lo), 0.0, 1.0)  # 1: extrapolate (unscaled)
    theta = theta / s.factor * (1.0 - keep) + theta * keep
    mscale = 1.0 + 0.1 * math.log(s.factor) if s.factor > 1.0 else 1.0
  elif s.kind == "longrope":  # llama.cpp multiplies its attn_factor into ggml_rope's magnitude: q.k grows by its square
    mscale = s.attn_factor
  return np.cos(theta) * mscale, np.sin(theta) * mscale


def rope(x: Tensor, cos: Tensor, sin: Tensor, rope_dim: int, neox: bool = False) -> Tensor:
  """x [T, heads, hd] rotated over its first rope_dim dims; cos/sin [T, 1, rope_dim/2].
  llama.cpp's norm rotation turns adjacent pairs (x[2i], x[2i+1]); neox (qwen2, qwen3, phi3) turns (x[i], x[i + rope_dim/2])."""
  T, H, hd = x.shape
  if neox:
    a, b = x[..., :rope_dim // 2], x[..., rope_dim // 2:rope_dim]
    y = (a * cos - b * sin).cat(a * sin + b * cos, dim=-1)
  else:
    r = x[..., :rope_dim].reshape(T, H, rope_dim // 2, 2)
    a, b = r[..., 0], r[..., 1]
    y = Tensor.stack(a * cos - b * sin, a * sin + b * cos, dim=-1).reshape(T, H, rope_dim)
  return y if rope_dim == hd else y.cat(x[..., rope_dim:], dim=-1)
