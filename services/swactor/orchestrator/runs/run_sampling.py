"""A run's sampling as applied: the SamplingPolicy the last stage samples with and the `Sampling` the run's
record shows, one derived from the other so that the record replays the run exactly.

Two values are filled in here. A top_p of 0 means no nucleus cut, which the sampler spells 1.0; the record
shows 1.0 too. A sampled run (temperature > 0) without a seed gets a random one, recorded: without it, its
tokens could not be produced again.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from swactor.common.sampling import SamplingPolicy
from swactor.v1 import orchestrator_pb2 as opb

# Below 2^63: the seed then fits a signed 64-bit integer in every language and store that may carry it
# (the plan's JSON, a client's int64); numpy's generator takes any non-negative integer.
SEED_LIMIT = 1 << 63


def new_seed() -> int:
    """A random seed in [1, 2^63): never 0, which a client may also have asked for explicitly."""
    return secrets.randbelow(SEED_LIMIT - 1) + 1


def applied(requested: opb.Sampling, draw: Callable[[], int] = new_seed) -> tuple[SamplingPolicy, opb.Sampling]:
    """The policy to run with and the record of it. The seed: the requested one when present (0 included);
    else one from `draw` for a sampled run; else (greedy, which draws nothing) absent from the record."""
    seed: int | None = requested.seed if requested.HasField("seed") else None
    if seed is None and requested.temperature > 0:
        seed = draw()
    policy = SamplingPolicy(temperature=requested.temperature, top_k=requested.top_k, top_p=requested.top_p or 1.0,
                            seed=seed or 0)
    record = opb.Sampling(temperature=requested.temperature, top_k=requested.top_k, top_p=policy.top_p, seed=seed)
    return policy, record
