"""The compute core's batched decode step (runs in flight, docs/runs-in-flight.md): one stage holding every layer of
the model, `slots` runs in flight, each decode step one row per run through one pass over the weights.

  .venv/bin/python bench/batched_step.py [--model PATH] [--slots 8] [--steps 32] [--threads N] [--kv-dtype float16]

For batches of 1, 2, 4, ... rows (up to --slots) prints the time per batched step, the rows per second it delivers and
that rate beside one run alone (the same model, the same invocation, B=1), and the KV cache bytes per slot. A figure,
not a check: the tokens of every batch are compared with the runs' solo tokens in tests/worker/test_model.py.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import time

import numpy as np

from swactor.worker.compute import GGUFModel, StageModel
from swactor.worker.compute.model import BatchRow

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = [1780, 314, 260, 3575, 282, 4649, 47]  # "What is the capital of France?"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default=str(DEFAULT_MODEL))
  ap.add_argument("--slots", type=int, default=8)
  ap.add_argument("--steps", type=int, default=32, help="timed batched steps per batch size")
  ap.add_argument("--threads", type=int, default=None)
  ap.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"])
  a = ap.parse_args()
  t0 = time.perf_counter()
  g = GGUFModel(a.model)
  m = StageModel(g, 0, g.params.n_layers, max_seq_len=256, slots=a.slots,
                 threads=a.threads, kv_dtype=a.kv_dtype)
  report = m.prepare()
  print(f"model {pathlib.Path(a.model).name}  slots {a.slots}  KV {a.kv_dtype}  load+compile {time.perf_counter() - t0:.1f} s "
        f"({report.graphs} graphs, {report.cached} cached)  KV per slot {m.memory.slot_bytes / 2**20:.1f} MiB  "
        f"load avg {os.getloadavg()[0]:.2f}")
  print("| runs in flight | ms per step (best / p50) | rows/s (best) | vs one run |")
  print("|---|---|---|---|")
  base = 0.0
  for b in m.batch_widths:
    if b > a.slots:
      break
    toks = {}
    for s in range(b):
      m.reset(slot=s)
      toks[s] = int(m.step(np.asarray(PROMPT, np.int32), 0, slot=s)[0])
    pos, times = len(PROMPT), []
    for _ in range(a.steps):
      t = time.perf_counter()
      out = m.step_batch([BatchRow(s, pos, np.asarray([toks[s]], np.int32)) for s in range(b)])
      times.append(time.perf_counter() - t)
      toks = {s: int(o[0]) for s, o in enumerate(out)}
      pos += 1
    best, p50 = min(times), statistics.median(times)  # best: the figure least moved by the shared machine's load
    rate = b / best
    base = base or rate
    print(f"| {b} | {best * 1000:.1f} / {p50 * 1000:.1f} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
  main()
