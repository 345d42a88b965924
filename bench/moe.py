"""Mixture-of-Experts decode cost: an MoE stage's decode step beside a dense stage with the same active parameters.

  .venv/bin/python bench/moe.py [--device CPU|CUDA|auto] [--threads N] [--steps N] [--repeats N]

Three files built from SmolLM2 (tests/fixtures/gguf_fixtures.py, cached), each run as one stage of all 30 blocks:
  dense        build_mixtral_dense_twin: a `llama` whose FFN is 768 units wide (Q4_1)
  moe 4x2      build_mixtral: the FFN as 4 experts of 384 units, 2 per token: the dense file's active parameters
  moe 8x2      build_mixtral(copies=2): 8 experts, 2 per token: twice the experts, the same active parameters
Prints the median decode step (ms) of each and the ratios moe / dense (aim: <= 1.5x) and 8x2 / 4x2 (~1x when only the
routed experts are read; ~2x on the FFN's share if every expert were). Numbers on a shared box move with its load
average, which is printed.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPT = [1780, 314, 260, 3575, 282, 4649, 47]


def decode_ms(path: pathlib.Path, device: str | None, threads: int | None, steps: int, repeats: int) -> float:
  """The median over `repeats` runs of the mean decode step (ms) of `steps` greedy tokens after PROMPT."""
  from swactor.worker.compute import StageModel
  m = StageModel(str(path), 0, 30, max_seq_len=len(PROMPT) + steps + 1, device=device, threads=threads)
  m.prepare()
  runs = []
  for _ in range(repeats):
    m.reset()
    tok = m.step(np.asarray(PROMPT, np.int32), 0)
    pos = len(PROMPT)
    t0 = time.perf_counter()
    for _ in range(steps):
      tok = m.step(tok, pos)
      pos += 1
    runs.append((time.perf_counter() - t0) / steps * 1e3)
  return statistics.median(runs)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--device", default="CPU", help="tinygrad device; 'auto' = tinygrad's default")
  ap.add_argument("--threads", type=int, default=0, help="CPU threads per matvec (0: every core this process may use, at most 8)")
  ap.add_argument("--steps", type=int, default=24)
  ap.add_argument("--repeats", type=int, default=3)
  a = ap.parse_args()
  from tests.fixtures import gguf_fixtures as g
  device = None if a.device == "auto" else a.device
  threads = a.threads or None
  files = {"dense": g.build_mixtral_dense_twin(), "moe 4x2": g.build_mixtral(), "moe 8x2": g.build_mixtral(copies=2)}
  print(f"load average {os.getloadavg()[0]:.2f}, device {a.device}, threads {threads or 'default'}, "
        f"{a.steps} steps x {a.repeats} runs (median)")
  ms = {}
  for name, path in files.items():
    ms[name] = decode_ms(path, device, threads, a.steps, a.repeats)
    print(f"  {name:8s} decode step {ms[name]:7.2f} ms ({1e3 / ms[name]:.1f} tok/s), file {path.stat().st_size / 2**20:.1f} MiB")
  print(f"moe 4x2 / dense: {ms['moe 4x2'] / ms['dense']:.2f}x (aim <= 1.5x)")
  print(f"moe 8x2 / dense: {ms['moe 8x2'] / ms['dense']:.2f}x")
  print(f"moe 8x2 / moe 4x2: {ms['moe 8x2'] / ms['moe 4x2']:.2f}x (twice the experts, the same active parameters)")
  print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
