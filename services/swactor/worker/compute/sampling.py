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
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(x)):
      raise ValueError("logits contain NaN or inf")
    p = self.policy
    if p.greedy:
      return int(np.argmax(x))  # numpy returns the first (lowest) index of the maximum
    order = np.argsort(-x, kind="stable")  # descending; ties keep ascending token id
    if p.top_k:
      order = order[:p.top_k]
    z = x[order] / p.temperature
    probs = np.exp(z - z[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
      keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1  # smallest prefix whose mass reaches top_p
      probs = probs[:keep] / probs[:keep].sum()
      order = order[:keep]
    i = min(int(np.searchsorted(np.cumsum(probs), self.rng.random(), side="right")), len(order) - 1)
    return int(order[i])
