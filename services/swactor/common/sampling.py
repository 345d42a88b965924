"""The sampling policy of a run (spec §10 RuntimePlan.sampling): chosen by the orchestrator, carried in
the plan, applied by the last stage's compute core (`swactor.worker.compute.sampling.Sampler`)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingPolicy:
    temperature: float = 0.0  # 0 -> greedy argmax (ties -> lowest token id)
    top_k: int = 0  # 0 -> no top-k cut
    top_p: float = 1.0  # 1 -> no nucleus cut
    seed: int = 0
    # Draws the seeded generator already made for this answer: a run resuming a faulted one (one draw per token
    # it delivered) skips them, so its sampled tokens are the ones the first run would have gone on with.
    skip_draws: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.skip_draws < 0:
            raise ValueError(f"skip_draws must be >= 0, got {self.skip_draws}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
