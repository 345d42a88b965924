"""Token selection on the last stage's final logits row under the run's SamplingPolicy (spec §10)."""
from __future__ import annotations

import numpy as np

from swactor.common.sampling import SamplingPolicy


class Sampler:
  """Stateful only through its seeded generator: the same policy and logits sequence give the same tokens."""
  def __init__(self, policy: SamplingPolicy):
    self.policy, self.rng = policy, np.random.default_rng(policy.seed)
    if policy.skip_draws and not policy.greedy:
      self.rng.random(policy.skip_draws)  # one uniform per sampled token, as __call__ draws them

  def rewind(self, tokens: int) -> None:
    """Take back the draws of the last `tokens` sampled tokens (rejected drafts' rows): the next token draws what it
    would have drawn had they never been sampled."""
    if tokens and not self.policy.greedy:
      self.rng.bit_generator.advance(-tokens)  # PCG64 steps back; random() takes one 64-bit output per draw

  def __call__(self, logits: np.ndarray) -> int:
    """The token of the distribution: the logits in descending order (ties by ascending token id), cut to top_k,
    softmax at the temperature, cut to the smallest prefix whose mass reaches top_p, one uniform draw. Only the head of
    that order is sorted (a full sort of a 262,144-token vocabulary costs ~35 ms a token, of 49,152 ~5 ms): the top_k,
    or the tokens within HEAD_SPAN of the top (all the mass that matters, unless the distribution is flat: then the
    whole order)."""
    x = np.asarray(logits).reshape(-1)  # float32 as the head computed them: ordered as their float64 values are
    if x.dtype.kind != "f":
      x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
      raise ValueError("logits contain NaN or inf")
    p = self.policy
    if p.greedy:
      return int(np.argmax(x))  # numpy returns the first (lowest) index of the maximum
    top = x.max()
    if p.top_k:
      order = _head(x, top - HEAD_SPAN * p.temperature, p.top_k)[:p.top_k]
      z = x[order].astype(np.float64) / p.temperature
      probs = np.exp(z - z[0])
      return self._draw(order, probs / probs.sum())
    # the whole vocabulary: every token's weight (in x's precision: float32, 0.3 ms for 262,144), the head's in float64
    e = np.exp((x - top) / x.dtype.type(p.temperature))
    total = e.sum(dtype=np.float64)
    order = _head(x, top - HEAD_SPAN * p.temperature, 1)
    probs = e[order].astype(np.float64) / total
    u = None if p.top_p < 1.0 else self.rng.random()
    mass = np.cumsum(probs)
    if len(order) < len(x) and not (mass[-1] >= p.top_p if u is None else mass[-1] > u):
      # the head holds too little of the mass (a near-uniform distribution): the whole order
      order = np.argsort(-x, kind="stable")
      probs = e[order].astype(np.float64) / total
      mass = np.cumsum(probs)
    return self._draw(order, probs) if u is None else _pick(order, mass, u)

  def _draw(self, order: np.ndarray, probs: np.ndarray) -> int:
    """Cut `probs` (the head of the descending order, normalized over the whole cut) to top_p, then draw."""
    if self.policy.top_p < 1.0:
      keep = int(np.searchsorted(np.cumsum(probs), self.policy.top_p)) + 1  # smallest prefix whose mass reaches top_p
      probs = probs[:keep] / probs[:keep].sum()
      order = order[:keep]
    return _pick(order, np.cumsum(probs), self.rng.random())


def _pick(order: np.ndarray, mass: np.ndarray, u: float) -> int:
  """The token where the cumulative mass first exceeds the draw u (the last one if rounding leaves u above it all)."""
  return int(order[min(int(np.searchsorted(mass, u, side="right")), len(order) - 1)])


# The head of the order: the tokens whose logit is within HEAD_SPAN x temperature of the top (weights down to e^-16 of
# the top token's, 262,144 of them together under 3e-2 of it at worst) -- found by one comparison pass, not a sort --
# unless more than HEAD_CAP of them are: then the HEAD_CAP largest of them by a partition (1.7 ms over all 262,144).
HEAD_SPAN = 16.0
HEAD_CAP = 4096


def _head(x: np.ndarray, threshold: float, at_least: int) -> np.ndarray:
  """Indices of x in descending order of value, ties by ascending index, exactly the first len(result) of
  argsort(-x, stable): those >= threshold when at least `at_least` and at most HEAD_CAP are, else the largest
  max(at_least, HEAD_CAP) (every tie of the last one included), found among those >= threshold when there are enough."""
  candidates = np.flatnonzero(x >= threshold)  # ascending indices
  if not at_least <= len(candidates) <= HEAD_CAP:
    m = max(at_least, HEAD_CAP)
    if m >= len(x):
      return np.argsort(-x, kind="stable")
    pool = candidates if len(candidates) >= m else np.arange(len(x))
    values = x[pool]
    candidates = pool[values >= np.partition(values, len(values) - m)[len(values) - m]]
  return candidates[np.argsort(-x[candidates], kind="stable")]
