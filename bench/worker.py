"""gpu-worker compute benchmark: a whole model (default: SmolLM2) as one stage, tinygrad vs llama.cpp on the same file.

  .venv/bin/python bench/worker.py [--model PATH] [--device CPU|CUDA|auto] [--threads N] [--llama-python /tmp/llama-venv/bin/python]
                                   [--quant]

Prints load time, first-step (compile) time, cold start (load + first token), prefill and decode tok/s, peak RSS,
device bytes of the weights / the file's tensor bytes; llama.cpp (llama-cpp-python, same GGUF, same thread count) runs
first, in a subprocess of the given python, when that python has llama_cpp, and the ratios tinygrad / llama.cpp are
printed. Targets (not asserted): decode >= 0.5x, cold start <= 10 s. Numbers on a shared 2-core box move with the
load average, which is printed too. --json adds one JSON line with every figure and the greedy tokens of the decode
run (bench/gpu_check.sh compares devices with it).

--quant adds, per quant type: decode tok/s and weight GB/s (file bytes x tok/s) of SmolLM2 re-quantized to Q4_K_M,
Q6_K, Q5_0, Q8_0 and IQ4_XS (tests/fixtures/gguf_fixtures.py builds them, cached) beside the shipped Q4_1 with device / file
bytes (aim: <= 1.15x for Q4_K_M), and one matvec of a Llama-3-8B FFN shape per packed type (SmolLM2's 576-wide
matrices cannot be K-quants, so the whole-model files hold few): GB/s of weights, and per weight byte / Q4_1's
(aim: Q4_K >= 0.8).
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


# A stage's start in a fresh process as the worker makes it (prefill chunks, run slots, the graph cache): the Python
# imports, the GGUF parse and upload, prepare() (every graph: captured, or loaded from the cache) and the first token.
STAGE_START_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from swactor.worker.compute import GGUFModel, StageModel
from swactor.worker.compute.graphcache import GraphCache
model, cache, chunk, slots, threads, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
t1 = time.perf_counter()
g = GGUFModel(model)
m = StageModel(g, 0, g.params.n_layers, max_seq_len=4096, prefill_chunk=chunk, slots=slots, threads=threads, graph_cache=GraphCache(cache))
t2 = time.perf_counter()
report = m.prepare()
t3 = time.perf_counter()
tok = int(m.step(np.asarray(prompt, np.int32), 0)[0])
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "prepare_s": t3 - t2, "first_token_s": t4 - t3, "start_s": t4 - t0,
                  "token": tok}))
"""


def stage_start(model: str, threads: int, chunk: int, slots: int) -> dict[str, dict[str, float]]:
  """A stage's start in a fresh process, first with an empty graph cache (it captures and stores every graph), then
  again with that cache warm (each later start on the host): what the worker does before its stage is ready."""
  import tempfile
  out = {}
  with tempfile.TemporaryDirectory(prefix="swactor-graphs-") as cache:
    for name in ("empty graph cache", "warm graph cache"):
      r = subprocess.run([sys.executable, "-c", STAGE_START_SCRIPT, model, cache, str(chunk), str(slots), str(threads),
                          json.dumps(PROMPT)], capture_output=True, text=True, timeout=900)
      if r.returncode != 0:
        raise SystemExit(f"stage start failed: {r.stderr.strip()[-400:]}")
      out[name] = json.loads(r.stdout.strip().splitlines()[-1])
  return out


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
  parse_s, upload_s, mem = parsed - t0 + m.timings.load_s, m.timings.upload_s, m.memory
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
          "device_bytes": mem.device_bytes, "file_bytes": mem.file_bytes, "n_layers": n, "device": c.device, "tokens": tokens}


def decode_rate(model: str, device: str | None, threads: int) -> tuple[float, float, float]:
  """(decode tok/s, the file's bytes of the weights, device bytes of the weights) of a one-stage model."""
  from swactor.worker.compute import GGUFModel, StageModel
  g = GGUFModel(model)
  m = StageModel(g, 0, g.params.n_layers, max_seq_len=256, device=device, threads=threads)
  tok, pos = m.step(np.asarray(PROMPT, np.int32), 0), len(PROMPT)
  t = time.perf_counter()
  for _ in range(DECODE):
    tok = m.step(tok, pos)
    pos += 1
  return DECODE / (time.perf_counter() - t), m.memory.file_bytes, m.memory.device_bytes


MATVEC_SHAPE = (14336, 4096)  # Llama 3 8B's gate/up: 33 MB in Q4_K, more than this box's caches
F16_AT = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
          "IQ4_NL": [0], "IQ4_XS": [0]}


def bench_matvec(threads: int, repeats: int = 5) -> dict[str, dict[str, float]]:
  """One [MATVEC_SHAPE] matvec per packed type through the CPU kernel and the native launcher (what a decode step runs),
  interleaved over the types `repeats` times; the best time of each."""
  from gguf import GGMLQuantizationType as QT
  from gguf.constants import GGML_QUANT_SIZES
  from tinygrad import Context, Tensor, TinyJit

  from swactor.worker.compute.cpu_matvec import SLICES_PER_THREAD
  from swactor.worker.compute.gguf_weights import RawTensor
  from swactor.worker.compute.linear import apply, upload
  from swactor.worker.compute.replay import Plan, plan
  rng, (rows, cols) = np.random.default_rng(0), MATVEC_SHAPE
  x = Tensor(rng.normal(size=(1, cols)).astype(np.float32), device="CPU").realize()
  runs = {}
  for name, at in F16_AT.items():
    n, nb = GGML_QUANT_SIZES[QT[name]]
    b = rng.integers(0, 256, size=(rows, cols // n, nb), dtype=np.uint8)
    for p in at:  # finite scales; the codes' values do not change the speed
      b[..., p:p + 2] = (rng.normal(size=(rows, cols // n, 1)) * 0.01).astype(np.float16).view(np.uint8)
    kind, ts = upload(RawTensor(name, QT[name], (rows, cols), b.reshape(rows, -1)), "CPU", words=True)
    jit = TinyJit(lambda x, kind=kind, ts=ts: apply(kind, ts, x, threads).realize())
    with Context(NUM_CPU_THREADS=threads * SLICES_PER_THREAD):
      for _ in range(3):
        jit(x)
    runs[name] = (b.nbytes, Plan(out=jit.captured.ret, threads=threads))
    assert plan(jit.captured, [x.uop.base], runs[name][1])
  best = dict.fromkeys(runs, float("inf"))
  for _ in range(repeats):
    for name, (_, p) in runs.items():
      p({})
      t = time.perf_counter()
      for _ in range(10):
        p({})
      best[name] = min(best[name], (time.perf_counter() - t) / 10)
  return {name: {"ms": best[name] * 1e3, "gb_s": nbytes / best[name] / 1e9, "gweights_s": rows * cols / best[name] / 1e9}
          for name, (nbytes, _) in runs.items()}


def print_quant(model: str, device: str | None, threads: int) -> dict[str, object]:
  sys.path.insert(0, str(ROOT))
  from tests.fixtures.gguf_fixtures import MIXES, build
  files = {"Q4_1 (shipped)": model, **{mix: str(build(mix)) for mix in MIXES}}
  rates = {name: decode_rate(path, device, threads) for name, path in files.items()}
  print(f"SmolLM2 re-quantized, one stage, {DECODE} decode steps, threads {threads}")
  print(f"{'file':<16}{'decode tok/s':>14}{'weights GB/s':>14}{'file MB':>10}{'device MB':>11}{'device/file':>13}")
  for name, (tok_s, fb, db) in rates.items():
    print(f"{name:<16}{tok_s:>14.1f}{fb * tok_s / 1e9:>14.2f}{fb / 1e6:>10.1f}{db / 1e6:>11.1f}{db / fb:>12.3f}x")
  mv = bench_matvec(threads)
  base = mv["Q4_1"]["gb_s"]
  print(f"one matvec {MATVEC_SHAPE[0]}x{MATVEC_SHAPE[1]} (CPU kernel, native launcher), threads {threads}")
  print(f"{'type':<8}{'ms':>9}{'GB/s':>8}{'G weights/s':>13}{'per byte / Q4_1':>17}")
  for name, r in mv.items():
    print(f"{name:<8}{r['ms']:>9.2f}{r['gb_s']:>8.2f}{r['gweights_s']:>13.2f}{r['gb_s'] / base:>16.2f}x")
  return {"files": {k: dict(zip(("decode_tok_s", "file_bytes", "device_bytes"), v, strict=True)) for k, v in rates.items()}, "matvec": mv}


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
  ap.add_argument("--quant", action="store_true", help="also: decode and matvec figures per quant type")
  ap.add_argument("--stage-start", action="store_true",
                  help="also: a stage's start in a fresh process (prefill chunk 64, 8 run slots) with an empty and with a "
                       "warm graph cache, beside llama.cpp's cold start (aim: <= 2 s warm)")
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
  print(f"weights on the device {tg['device_bytes'] / 1e6:.1f} MB = {tg['device_bytes'] / tg['file_bytes']:.3f}x the file's"
        f" {tg['file_bytes'] / 1e6:.1f} MB")
  quant = print_quant(a.model, None if a.device == "auto" else a.device, threads) if a.quant else None
  starts = stage_start(a.model, threads, 64, 8) if a.stage_start else None
  for name, r in (starts or {}).items():
    vs = f" ({r['start_s'] / lc['cold_start_s']:.2f}x llama.cpp's cold start {lc['cold_start_s']:.2f} s)" if lc else ""
    print(f"stage start, {name}: {r['start_s']:.2f} s{vs} = imports {r['import_s']:.2f} + load {r['load_s']:.2f} + "
          f"prepare {r['prepare_s']:.2f} + first token {r['first_token_s']:.2f}")
  if a.json:
    print(json.dumps({"tinygrad": tg, "llama_cpp": lc, "quant": quant, "stage_start": starts}))


if __name__ == "__main__":
  main()
