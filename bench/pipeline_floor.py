"""Where one run's floor is on this box (issue 25's pipeline aims): what splitting the model costs by itself, and where
a 3-stage pool's CPU goes, beside the single process.

  .venv/bin/python bench/pipeline_floor.py [--stages 3] [--tokens 256] [--rounds 3] [--model PATH]

1. In one process: the S stages' StageModels stepped in turn for each token (each stage's weights cold after the
   others ran, as in a pipeline) against one StageModel of every layer, alternated, --rounds times: the cost of the
   split itself, with no processes, rings, hops or other services.
2. A loopback local pool of S hosts: one warm-up run, then a run of --tokens tokens (ignore_eos); the CPU per token of
   every process (from /proc: each service's process group, a worker's compute process apart from its stage node),
   the cores busy, and the single process's CPU per token and cores measured the same way (getrusage).

On a box where every stage shares the same cores (this 2-core one), a run whose processes burn C ms of CPU per token
on N cores cannot decode faster than one token per C / N ms: that is the floor the pipeline's figures are read
against. On a GPU pool each host has its own cores and the compute leaves them; what stays per token is the
non-compute CPU and the hops.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pathlib
import resource
import statistics
import sys
import time

import numpy as np
from pipeline import cpu_seconds  # bench/pipeline.py: CPU seconds by service, from /proc

from swactor.localcluster import ClusterSpec, LocalCluster
from swactor.localcluster.run import follow
from swactor.v1 import orchestrator_pb2 as opb
from swactor.v1 import orchestrator_pb2_grpc
from swactor.worker.compute import GGUFModel, StageModel

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = np.asarray([1780, 314, 260, 3575, 282, 4649, 47], np.int32)


def split_in_one_process(g: GGUFModel, stages: int, tokens: int, rounds: int) -> list[tuple[float, list[float], float]]:
    """Per round: (whole ms/token, each stage's ms/token, the stages' sum), medians over `tokens` decode steps."""
    n = g.params.n_layers
    cuts = [n * i // stages for i in range(stages + 1)]
    parts = [StageModel(g, lo, hi, max_seq_len=4096, device="CPU", prefill_chunk=64) for lo, hi in itertools.pairwise(cuts)]
    whole = StageModel(g, 0, n, max_seq_len=4096, device="CPU", prefill_chunk=64)
    for m in (*parts, whole):
        m.prepare()

    def through_parts(x: np.ndarray, pos: int, times: list[list[float]] | None) -> np.ndarray:
        for i, m in enumerate(parts):
            t = time.perf_counter()
            x = m.step(x, pos)
            if times is not None:
                times[i].append(time.perf_counter() - t)
        return x

    out = []
    for _ in range(rounds):
        for m in (*parts, whole):
            m.reset()
        times: list[list[float]] = [[] for _ in parts]
        tok = through_parts(PROMPT, 0, None)
        for pos in range(len(PROMPT), len(PROMPT) + tokens):
            tok = through_parts(np.asarray(tok, np.int32), pos, times)
        tok, whole_times = whole.step(PROMPT, 0), []
        for pos in range(len(PROMPT), len(PROMPT) + tokens):
            t = time.perf_counter()
            tok = whole.step(np.asarray(tok, np.int32), pos)
            whole_times.append(time.perf_counter() - t)
        each = [statistics.median(ts) * 1000 for ts in times]
        out.append((statistics.median(whole_times) * 1000, each, sum(each)))
    return out


def single_cpu(g: GGUFModel, tokens: int) -> tuple[float, float]:
    """(wall ms per token, CPU ms per token) of one StageModel of every layer decoding `tokens` tokens."""
    m = StageModel(g, 0, g.params.n_layers, max_seq_len=4096, device="CPU", prefill_chunk=64)
    m.prepare()
    tok = m.step(PROMPT, 0)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for pos in range(len(PROMPT), len(PROMPT) + tokens):
        tok = m.step(np.asarray(tok, np.int32), pos)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return wall * 1000 / tokens, (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000 / tokens


def process_name(service: str, cmdline: bytes) -> str:
    """Each service process apart, a worker's compute process apart from its stage node."""
    return service + (" compute process" if b"swactor.worker.process" in cmdline else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"load average {os.getloadavg()[0]:.2f}, {cores} cores; {a.stages} stages, {a.tokens} decode tokens")
    g = GGUFModel(pathlib.Path(a.model))

    print("\n1. the split in one process (no processes, rings or hops), ms per decode token:")
    for i, (whole, each, total) in enumerate(split_in_one_process(g, a.stages, a.tokens, a.rounds)):
        print(f"  round {i + 1}: stages in turn {total:.2f} ({' + '.join(f'{e:.2f}' for e in each)}) vs every layer "
              f"in one {whole:.2f}: {total / whole:.2f}x")

    single_ms, single_cpu_ms = single_cpu(g, a.tokens)
    print(f"\n2. single process: {single_ms:.2f} ms per token, {single_cpu_ms:.2f} ms CPU per token "
          f"({single_cpu_ms / single_ms:.2f} cores)")
    with LocalCluster(ClusterSpec(hosts=a.stages, netns=False, model=pathlib.Path(a.model)),
                      progress=lambda line: None) as cluster, cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        req = opb.SubmitRunRequest(prompt="Once upon a time", stages=a.stages, max_tokens=a.tokens, ignore_eos=True)
        follow(stub, req, timeout_s=900)  # loads and compiles (or reads the graph cache)
        before, t0 = cpu_seconds(cluster, process_name), time.perf_counter()
        res = follow(stub, req, timeout_s=900)
        wall, after = time.perf_counter() - t0, cpu_seconds(cluster, process_name)
    n = len(res.token_ids)
    per = {k: (v - before.get(k, 0.0)) * 1000 / n for k, v in after.items()}
    ms = 1000 / (res.decode_tok_s or float("nan"))
    print(f"   pipeline, S={a.stages}: {ms:.2f} ms per token ({single_ms / ms:.2f}x the single process's rate); "
          f"CPU ms per token:")
    for k in sorted(per):
        print(f"     {k:28s} {per[k]:6.2f}")
    compute = sum(v for k, v in per.items() if k.endswith("compute process"))
    total = sum(per.values())
    print(f"   compute processes {compute:.2f} ({compute / single_cpu_ms:.2f}x the single process's CPU), everything "
          f"else {total - compute:.2f} ({(total - compute) / a.stages:.2f} per stage); total {total:.2f} ms CPU per "
          f"token, {total * n / 1000 / wall:.2f} of {cores} cores busy over the run")
    print(f"   CPU floor on {cores} cores: {total / cores:.2f} ms per token = {single_ms / (total / cores):.2f}x the "
          f"single process's rate at best; with every non-compute CPU gone: "
          f"{single_ms / (compute / cores):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
