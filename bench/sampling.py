"""Token selection per token on the last stage (issue 21 item 6: large vocabularies): the Sampler at SmolLM2's 49,152
and Gemma 3's 262,144 tokens, greedy and sampled (temperature, top_k, top_p), beside a full sort of the vocabulary (what
the sampler did before it sorted only the head). Aim: <= 2 ms a token at 262,144.

  .venv/bin/python bench/sampling.py [--tokens 200]

Logits: float32 like a stage's head, two shapes: "lm" (a few tokens 8-16 above a normal background of std 2.5, as a
language model's next-token logits look) and "flat" (a normal of std 1: thousands of tokens share the mass).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from swactor.common.sampling import SamplingPolicy
from swactor.worker.compute.sampling import Sampler

POLICIES = {"greedy": SamplingPolicy(), "t=0.8": SamplingPolicy(temperature=0.8, seed=1),
            "t=0.8 top_k=40": SamplingPolicy(temperature=0.8, top_k=40, seed=1),
            "t=0.8 top_p=0.9": SamplingPolicy(temperature=0.8, top_p=0.9, seed=1),
            "t=1 top_k=64 top_p=0.95": SamplingPolicy(temperature=1.0, top_k=64, top_p=0.95, seed=1)}


def logits(rng: np.random.Generator, vocab: int, shape: str) -> np.ndarray:
    if shape == "flat":
        return rng.normal(0, 1.0, vocab).astype(np.float32)
    x = rng.normal(0, 2.5, vocab).astype(np.float32)
    x[rng.choice(vocab, 6, replace=False)] += np.asarray([16, 14, 13, 11, 10, 8], np.float32)
    return x


def ms_per_token(policy: SamplingPolicy, rows: list[np.ndarray]) -> float:
    s, times = Sampler(policy), []
    for x in rows:
        t = time.perf_counter()
        s(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=200, help="logit rows per figure")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; median ms per token over {a.tokens} rows")
    print(f"{'vocab':>8} {'logits':>6} {'policy':>26} {'ms/token':>9} {'full sort ms':>13}")
    for vocab in (49152, 262144):
        for shape in ("lm", "flat"):
            rows = [logits(rng, vocab, shape) for _ in range(a.tokens)]
            full = statistics.median(_time(lambda x: np.argsort(-x.astype(np.float64), kind="stable"), rows[:20]))
            for name, policy in POLICIES.items():
                ms = ms_per_token(policy, rows)
                flag = "" if vocab < 262144 or ms <= 2.0 else "  (aim 2 ms)"
                print(f"{vocab:>8} {shape:>6} {name:>26} {ms:>9.2f} {full:>13.2f}{flag}")
    return 0


def _time(f, rows: list[np.ndarray]) -> list[float]:
    out = []
    for x in rows:
        t = time.perf_counter()
        f(x)
        out.append((time.perf_counter() - t) * 1000)
    return out


if __name__ == "__main__":
    sys.exit(main())
