"""Pipeline benchmark: TTFT and decode tok/s of real runs through a local cluster for S = 1..4
stages (one host each), next to the single-process worker (the compute core's StageModel over all
30 layers, same device, same prompt ids) measured in the same invocation; ratios pipeline / single.

  .venv/bin/python bench/pipeline.py [--stages 1,2,3,4] [--max-tokens 24] [--device CPU] [--loopback]
                                     [--png bench/out/pipeline_timeline.png] [--json bench/out/pipeline.json]

Per S, one warm-up run (loads the stage weights and compiles its kernels; the workers keep the
weights for the next run of the same plan) and one measured run. TTFT is client-side, from SubmitRun
to the first token, so it includes planning, (warm) provisioning, edge set-up and prefill; "prefill"
is the services' own readiness barrier -> first token.

The timeline PNG splits every decode token of the measured runs into where its milliseconds went,
from the lifecycle events' wall-clock stamps (all processes share this machine's clock):
  orchestrator   TOKEN_RECEIVED(n-1) -> stage 0 OBJECT_LOADED(n): sample -> inject -> token-in hop
  dispatch k     OBJECT_LOADED(k, n) -> EXECUTE_STEP_STARTED(k, n): worker wake + step dispatch
  compute k      EXECUTE_STEP_STARTED(k, n) -> OBJECT_PRODUCED(k, n): the stage's layers
  hop k          OBJECT_PRODUCED(k, n) -> OBJECT_LOADED(k+1, n) (or TOKEN_RECEIVED(n) for the last
                 stage): ring commit, edge-driver pump, QUIC, peer ring, wake
The services expose no per-object QUIC timing, so "hop" is ring + wake + QUIC together.
Numbers on a shared 2-core box move with the load: all S share the two cores (S workers + S edge
drivers + orchestrator), so this measures overhead, not GPU scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from collections import defaultdict

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "llamacpp_greedy.json"
QUESTION = "Once upon a time"  # chat template; no EOS in llama.cpp's first 32 greedy tokens


def prompt_ids() -> list[int]:
    cases = json.loads(FIXTURE.read_text())["cases"]
    return next(c for c in cases if c["question"] == QUESTION and c["chat_template"])["prompt_tokens"]


def bench_single(model: pathlib.Path, device: str, ids: list[int], n: int):
    from swactor.worker.compute import StageModel

    t0 = time.perf_counter()
    m = StageModel(model, 0, 30, max_seq_len=4096, device=device)  # what the worker builds (prefill_chunk 1)
    load = time.perf_counter() - t0

    def one() -> tuple[float, float, list[int]]:
        m.reset()
        t = time.perf_counter()
        tok = int(m.step(np.asarray(ids, np.int32), 0)[0])
        ttft = time.perf_counter() - t
        out, pos, t = [tok], len(ids), time.perf_counter()
        for _ in range(n - 1):
            tok = int(m.step(np.asarray([tok], np.int32), pos)[0])
            pos += 1
            out.append(tok)
        return ttft, (n - 1) / (time.perf_counter() - t), out

    one()  # compile

    def measure() -> dict[str, object]:
        ttft, dec, toks = one()
        return {"load_s": load, "ttft_s": ttft, "decode_tok_s": dec, "tokens": toks}

    return measure


def timeline(events, stages: int) -> list[list[tuple[str, float]]]:
    """Per decode token n >= 1: [(segment, ms), ...] in pipeline order (see the module doc)."""
    from swactor.v1 import common_pb2 as pb

    at: dict[tuple[int, int | None, int], int] = {}
    for e in events:
        stage = e.stage_index if e.HasField("stage_index") else None
        key = (e.kind, stage, e.sequence)
        at.setdefault(key, e.time_us)
    seqs = sorted({e.sequence for e in events if e.kind == pb.TOKEN_RECEIVED})
    rows = []
    for n in seqs[1:]:
        try:
            segs = [("orchestrator", at[(pb.OBJECT_LOADED, 0, n)] - at[(pb.TOKEN_RECEIVED, None, n - 1)])]
            for k in range(stages):
                loaded, started = at[(pb.OBJECT_LOADED, k, n)], at[(pb.EXECUTE_STEP_STARTED, k, n)]
                nxt = at[(pb.OBJECT_LOADED, k + 1, n)] if k + 1 < stages else at[(pb.TOKEN_RECEIVED, None, n)]
                # OBJECT_PRODUCED is stamped after the commit, so the consumer may stamp its load first:
                # then the hop was shorter than the event emission and shows as 0 (its time is in compute).
                produced = min(at[(pb.OBJECT_PRODUCED, k, n)], nxt)
                segs.append((f"dispatch {k}", max(0, started - loaded)))
                segs.append((f"compute {k}", produced - max(started, loaded)))
                segs.append((f"hop {k}", nxt - produced))
        except KeyError:
            continue  # an event of this step is missing (e.g. the last step raced the stop)
        rows.append([(name, us / 1000.0) for name, us in segs])
    return rows


def plot(timelines: dict[int, list[list[tuple[str, float]]]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"orchestrator": "#7f7f7f", "dispatch": "#ffbb78", "compute": "#1f77b4", "hop": "#d62728"}
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.2 + 1.6 * len(timelines)), squeeze=False)
    for ax, (s, rows) in zip(axes[:, 0], sorted(timelines.items()), strict=True):
        for i, segs in enumerate(rows):
            x = 0.0
            for name, ms in segs:
                kind = name.split()[0]
                shade = 1.0 - 0.18 * int(name.split()[1]) if " " in name else 1.0
                ax.barh(i + 1, ms, left=x, color=colors[kind], alpha=max(0.35, shade), edgecolor="white", linewidth=0.3)
                x += ms
        ax.set_ylabel(f"S={s}\ntoken")
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("ms since the previous token arrived at the orchestrator")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(handles, ["orchestrator (sample, inject, token-in)", "worker wake + dispatch", "stage compute",
                         "ring + edge-driver + QUIC hop"], loc="upper center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default="1,2,3,4")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--loopback", action="store_true", help="loopback addresses instead of network namespaces")
    ap.add_argument("--png", type=pathlib.Path, default=ROOT / "bench" / "out" / "pipeline_timeline.png")
    ap.add_argument("--json", type=pathlib.Path, default=ROOT / "bench" / "out" / "pipeline.json")
    a = ap.parse_args()
    stages = [int(s) for s in a.stages.split(",")]
    from swactor.localcluster import ClusterSpec, LocalCluster
    from swactor.localcluster.cluster import DEFAULT_MODEL
    from swactor.localcluster.run import follow
    from swactor.v1 import orchestrator_pb2 as opb
    from swactor.v1 import orchestrator_pb2_grpc

    ids, n = prompt_ids(), a.max_tokens
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus; prompt {QUESTION!r} ({len(ids)} ids, chat "
          f"template), {n} tokens, device {a.device}", flush=True)
    measure_single = bench_single(DEFAULT_MODEL, a.device, ids, n)
    before = measure_single()
    print(f"single process (StageModel 0..30), before the cluster: TTFT {before['ttft_s']:.3f} s, "
          f"decode {before['decode_tok_s']:.2f} tok/s", flush=True)
    single = before
    results: dict[int, dict[str, object]] = {}
    timelines = {}
    spec = ClusterSpec(hosts=max(stages), device=a.device, netns=False if a.loopback else None)
    with LocalCluster(spec, progress=lambda s: print(f"  {s}", flush=True)) as cluster, cluster.channel() as ch:
        stub = orchestrator_pb2_grpc.OrchestratorStub(ch)
        for s in stages:
            req = opb.SubmitRunRequest(prompt=QUESTION, stages=s, max_tokens=n)
            warm = follow(stub, req, timeout_s=600)
            res = follow(stub, req, timeout_s=600)
            assert res.prompt_tokens == len(ids), (res.prompt_tokens, len(ids))
            summ = res.summary()
            summ["warmup_ttft_s"] = warm.ttft_s
            summ["matches_single"] = res.token_ids == single["tokens"][: len(res.token_ids)]
            results[s] = summ
            tl = timeline(res.events, s)
            timelines[s] = tl
            per = defaultdict(float)
            for segs in tl:
                for name, ms in segs:
                    per[name.split()[0]] += ms / max(1, len(tl))
            summ["per_token_ms"] = dict(per)
            print(f"S={s}: {res.outcome} ({summ['reason']}), TTFT {res.ttft_s:.2f} s (cold run {warm.ttft_s:.2f} s; prefill "
                  f"{summ['prefill_s']:.2f} s), decode {res.decode_tok_s:.2f} tok/s, teardown {summ['teardown_s']:.2f} s; "
                  f"per token ms: " + ", ".join(f"{k} {v:.1f}" for k, v in per.items())
                  + f"; tokens match single process: {summ['matches_single']}", flush=True)
    after = measure_single()  # the load on a shared box moves: the better of before and after is the baseline
    print(f"single process, after the cluster: TTFT {after['ttft_s']:.3f} s, decode {after['decode_tok_s']:.2f} tok/s")
    single = {**before, "ttft_s": min(before["ttft_s"], after["ttft_s"]),
              "decode_tok_s": max(before["decode_tok_s"], after["decode_tok_s"]), "before": before, "after": after}
    print("\n S   TTFT s  ratio   decode tok/s  ratio   (ratio = pipeline / single process; single: "
          f"TTFT {single['ttft_s']:.3f} s, decode {single['decode_tok_s']:.2f} tok/s)")
    for s, r in results.items():
        ttft, dec = r["ttft_s"], r["decode_tok_s"]
        print(f"{s:2d}  {ttft:7.2f}  {ttft / single['ttft_s']:5.1f}x  {dec:12.2f}  {dec / single['decode_tok_s']:5.2f}x")
    plot(timelines, a.png)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"single": single, "pipeline": results, "max_tokens": n,
                                  "load_average": os.getloadavg()[0]}, indent=1, default=str))
    print(f"timeline: {a.png}; figures: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
