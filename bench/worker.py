"""gpu-worker compute benchmark: a whole model (default: SmolLM2) as one stage, tinygrad vs llama.cpp on the same file.

  .venv/bin/python bench/worker.py [--model PATH] [--device CPU|CUDA|auto] [--threads N] [--llama-python /tmp/llama-venv/bin/python]

Prints load time, first-step (compile) time, cold start (load + first token), prefill and decode tok/s, peak RSS;
llama.cpp (llama-cpp-python, same GGUF, same thread count) runs first, in a subprocess of the given python, when
that python has llama_cpp, and the ratios tinygrad / llama.cpp are printed. Targets (not asserted): decode >= 0.5x,
cold start <= 10 s. Numbers on a shared 2-core box move with the load average, which is printed too. --json adds one JSON
line with every figure and the greedy tokens of the decode run (bench/gpu_check.sh compares devices with it).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = [1780, 314, 260, 3575, 282, 4649, 47]  # "What is the capital of France?"
LONG = [(i * 7919) % 40000 + 100 for i in range(128)]  # arbitrary ids: prefill throughput only
DECODE = 64

LLAMA_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
model, threads, prompt, long, n = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
llm = Llama(model_path=model, n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512, seed=0, verbose=False)
t1 = time.perf_counter()
llm.eval(prompt); tok = int(llm.scores[llm.n_tokens - 1].argmax()); t2 = time.perf_counter()
t = time.perf_counter()
for _ in range(n): llm.eval([tok]); tok = int(llm.scores[llm.n_tokens - 1].argmax())
dec = n / (time.perf_counter() - t)
llm.reset(); t = time.perf_counter(); llm.eval(long); pre = len(long) / (time.perf_counter() - t)
hwm = [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"load_s": t1 - t0, "first_step_s": t2 - t1, "cold_start_s": t2 - t0, "prefill_tok_s": pre, "decode_tok_s": dec,
                  "peak_rss_mib": hwm}))
"""


def peak_rss_mib() -> float:
  """VmHWM of this process (unlike ru_maxrss it is not inherited across fork/exec)."""
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) / 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_tinygrad(model: str, device: str | None, chunk: int, beam: int, threads: int) -> dict[str, object]:
  t0 = time.perf_counter()
  from swactor.worker.compute import GGUFModel, StageModel
  g = GGUFModel(model)
  n, parsed = g.params.n_layers, time.perf_counter()
  m = StageModel(g, 0, n, max_seq_len=512, device=device, beam=beam, threads=threads)  # default prefill_chunk=1: prefill = decode graph
  t1 = time.perf_counter()
  tok = m.step(np.asarray(PROMPT, np.int32), 0)
  t2 = time.perf_counter()
  pos, tokens = len(PROMPT), [int(tok[0])]
  t = time.perf_counter()
  for _ in range(DECODE):
    tok = m.step(tok, pos)
    pos += 1
    tokens.append(int(tok[0]))
  dec = DECODE / (time.perf_counter() - t)
  m.reset()
  t = time.perf_counter()
  m.step(np.asarray(LONG, np.int32), 0)
  pre1 = len(LONG) / (time.perf_counter() - t)
  parse_s, upload_s = parsed - t0 + m.timings.load_s, m.timings.upload_s
  del m
  c = StageModel(g, 0, n, max_seq_len=512, device=device, prefill_chunk=chunk, beam=beam, threads=threads)
  for _ in range(2):  # eager run + JIT capture of the chunk graph
    c.reset()
    c.step(np.asarray(LONG[:chunk], np.int32), 0)
  c.reset()
  t = time.perf_counter()
  c.step(np.asarray(LONG, np.int32), 0)
  pre = len(LONG) / (time.perf_counter() - t)
  return {"load_s": t1 - t0, "first_step_s": t2 - t1, "cold_start_s": t2 - t0, "prefill_tok_s": pre, "decode_tok_s": dec,
          "peak_rss_mib": peak_rss_mib(), "prefill_chunk1_tok_s": pre1, "load_parse_s": parse_s, "load_upload_s": upload_s,
          "n_layers": n, "device": c.device, "tokens": tokens}


def bench_llamacpp(python: str, model: str, threads: int) -> dict[str, float] | None:
  if not os.path.exists(python):
    return None
  r = subprocess.run([python, "-c", LLAMA_SCRIPT, model, str(threads), json.dumps(PROMPT), json.dumps(LONG), str(DECODE)],
                     capture_output=True, text=True, timeout=600)
  if r.returncode != 0:
    print(f"llama.cpp run failed: {r.stderr.strip()[-400:]}", file=sys.stderr)
    return None
  return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default=str(DEFAULT_MODEL))
  ap.add_argument("--device", default="CPU", help="tinygrad device; 'auto' = tinygrad's default (probing costs ~1-2 s)")
  ap.add_argument("--prefill-chunk", type=int, default=32, help="chunk of the second (prefill) measurement")
  ap.add_argument("--beam", type=int, default=0, help="StageModel(beam=): kernel search at capture; the first run searches"
                  " (minutes), later runs hit tinygrad's disk cache")
  ap.add_argument("--threads", type=int, default=0, help="CPU threads for both engines (0: every core this process may use)")
  ap.add_argument("--llama-python", default="/tmp/llama-venv/bin/python")
  ap.add_argument("--json", action="store_true")
  a = ap.parse_args()
  threads = a.threads or len(os.sched_getaffinity(0))
  load0 = os.getloadavg()[0]
  lc = bench_llamacpp(a.llama_python, a.model, threads)
  tg = bench_tinygrad(a.model, None if a.device == "auto" else a.device, a.prefill_chunk, a.beam, threads)
  print(f"model {pathlib.Path(a.model).name}, one stage ({tg['n_layers']} layers), device {tg['device']}, beam {a.beam}, threads {threads},"
        f" load avg {load0:.1f} -> {os.getloadavg()[0]:.1f}")
  print(f"{'metric':<16}{'tinygrad':>12}{'llama.cpp':>12}{'ratio':>8}")
  for k in ("load_s", "first_step_s", "cold_start_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mib"):
    other = lc.get(k) if lc else None
    ratio = f"{tg[k] / other:7.2f}x" if other else "      -"
    print(f"{k:<16}{tg[k]:>12.2f}{(f'{other:.2f}' if other else '-'):>12}{ratio:>8}")
  print(f"(tinygrad load = GGUF parse+read {tg['load_parse_s']:.2f} s + device upload {tg['load_upload_s']:.2f} s; prefill_tok_s is"
        f" with prefill_chunk={a.prefill_chunk}, {tg['prefill_chunk1_tok_s']:.1f} tok/s with the default prefill_chunk=1)")
  if a.json:
    print(json.dumps({"tinygrad": tg, "llama_cpp": lc}))


if __name__ == "__main__":
  main()
