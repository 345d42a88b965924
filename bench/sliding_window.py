"""Sliding-window attention with the KV ring (worker/compute/swa_ring.py) beside keeping every position.

  .venv/bin/python bench/sliding_window.py [--contexts 128,512,1536] [--steps 24] [--device CPU|CUDA|auto]

The SmolLM2-based gemma3 fixture (tests/fixtures/gguf_fixtures.py build_gemma3: 30 blocks, every sixth global, the
others a window of 5 positions) as one stage, prefill chunks of 64, max_seq_len the context plus a chunk: for each
context, a prompt that long, then the median of `steps` decode steps, with the ring (the default) and with
swa_ring=False (every position kept, the older ones masked: the compute before the ring), beside SmolLM2 itself (a
llama: every block global). Prints prefill tok/s, the decode step (ms), KV bytes per run slot, and the ratios. Figures
on a shared box move with its load average, which is printed.
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
CHUNK = 64


def measure(path: pathlib.Path, context: int, steps: int, device: str | None, ring: bool) -> tuple[float, float, int]:
  """(prefill tok/s, median decode step in ms, KV bytes per slot) of one stage of every block of `path`."""
  from swactor.worker.compute import StageModel
  m = StageModel(str(path), 0, 30, max_seq_len=context + steps + CHUNK, device=device, prefill_chunk=CHUNK, swa_ring=ring)
  m.prepare()
  prompt = np.random.default_rng(0).integers(0, m.params.vocab_size, context).astype(np.int32)
  t0 = time.perf_counter()
  tok = m.step(prompt, 0)
  prefill = context / (time.perf_counter() - t0)
  times = []
  for i in range(steps):
    t = time.perf_counter()
    tok = m.step(tok, context + i)
    times.append(time.perf_counter() - t)
  return prefill, statistics.median(times) * 1e3, m.memory.slot_bytes


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--contexts", default="128,512,1536")
  ap.add_argument("--steps", type=int, default=24)
  ap.add_argument("--device", default=None, help="tinygrad device (default: tinygrad's)")
  args = ap.parse_args()
  from tests.fixtures import gguf_fixtures
  gemma = gguf_fixtures.build_gemma3()
  llama = gguf_fixtures.SOURCE
  print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; gemma3 fixture {gemma.name} (window "
        f"{gguf_fixtures.GEMMA3_WINDOW}), llama {llama.name}; chunks of {CHUNK}, {args.steps} decode steps")
  print(f"{'context':>8} {'model':>18} {'prefill tok/s':>14} {'decode ms':>10} {'KV MiB/slot':>12}")
  for context in (int(c) for c in args.contexts.split(",")):
    rows = {name: measure(path, context, args.steps, args.device, ring)
            for name, path, ring in (("gemma3 ring", gemma, True), ("gemma3 every pos", gemma, False),
                                     ("llama (global)", llama, True))}
    for name, (prefill, decode, kv) in rows.items():
      print(f"{context:>8} {name:>18} {prefill:>14.1f} {decode:>10.2f} {kv / 2**20:>12.1f}")
    ring, full = rows["gemma3 ring"], rows["gemma3 every pos"]
    print(f"{context:>8} {'ring / every pos':>18} {ring[0] / full[0]:>13.2f}x {ring[1] / full[1]:>9.2f}x "
          f"{ring[2] / full[2]:>11.2f}x")


if __name__ == "__main__":
  main()
